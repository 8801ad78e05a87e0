"""Wall-OSS (`wall_x`, LeRobot 0.6.1) at its real size, random weights, no download.

* parameters: our real-size model on the meta device (`config.REAL_SIZE`, wall-x's
  `qwen2_5_moe_flash.json`), its state dict under LeRobot's key names (`lerobot_key_map`: the
  tied embedding stored as `model.lm_head.weight`), against LeRobot's own
  `Qwen2_5_VLMoEForAction` built on the meta device from the same dimensions in LeRobot's venv
  (`--lerobot-python`): tensor count, parameter count, every key's shape and dtype;
* a per-rank memory table for a FULL fine-tune (fp32 master weights and gradients, AdamW's two
  fp32 states; bf16 compute) under FSDP2 full sharding at W = 1..16, 3 cameras at 480 x 640:
  model state / W, the largest unit FSDP gathers (bf16, twice for prefetch) and its unsharded
  fp32 gradient, and activations per sample counted from autograd's saved tensors of one bf16
  forward, without and with activation checkpointing (the model's
  `activation_checkpoint_units`: vision blocks and decoder layers). The decoder runs on the
  meta device; the vision tower's window index needs real grid values (`unique_consecutive`
  has no meta kernel), so it runs once on the CPU with zero weights in bf16 (about 1 min);
* `--dump-keys FILE`: LeRobot's key -> [shape, dtype] of both sides.

    python benchmarks/wallx_real_size.py --lerobot-python /tmp/lrv/bin/python
    python benchmarks/wallx_real_size.py --no-activations     # seconds: counts and state only

Without LeRobot's venv the LeRobot columns are null. LeRobot resizes the token embedding to the
base tokenizer's length on load (`resize_token_embeddings(len(tokenizer))`); the real tokenizer
is not here offline, so both sides count the config's vocabulary (151,936 rows).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

FIXTURE_BASE = Path(__file__).resolve().parents[2] / "shared/fixtures/lerobot_wallx_tiny/base"
WORLD_SIZES = (1, 2, 4, 8, 16)
CAMERAS, CAMERA_SHAPE = 3, (3, 480, 640)
MAX_DIM, CHUNK = 20, 32  # LeRobot's max_action_dim / max_state_dim and chunk_size defaults
TEXT_TOKENS = 64  # the prompt template and a short task in Qwen2.5's tokenizer (assumed)
GPU_BYTES = 80e9  # "80 GB" GPU, taken as 80e9 bytes
STATE_BYTES = {"params": 4, "grads": 4, "optimizer": 8}  # fp32 weights, grads, AdamW m and v
GB = 1e9


# --- LeRobot's side (runs in LeRobot's venv) -----------------------------------------------------


def lerobot_config_dict(real: dict[str, Any]) -> dict[str, Any]:
    """The fixture base's flat Wall-X config.json with the real dimensions put in."""
    cfg = json.loads((FIXTURE_BASE / "config.json").read_text())
    hidden = real["hidden_size"]
    cfg.update(
        hidden_size=hidden,
        intermediate_size=real["vlm_mlp_dim"],
        num_attention_heads=real["num_heads"],
        num_hidden_layers=real["num_layers"],
        num_key_value_heads=real["num_kv_heads"],
        rms_norm_eps=real["rms_norm_eps"],
        rope_theta=real["rope_theta"],
        vocab_size=real["vocab_size"],
        dim_inputs=list(real["dim_inputs"]),
        rope_scaling={"type": "mrope", "mrope_section": list(real["mrope_section"])},
        experts=[
            {"hidden_size": hidden, "intermediate_size": real["vlm_mlp_dim"], "hidden_act": "silu"},
            {
                "hidden_size": hidden,
                "intermediate_size": real["action_mlp_dim"],
                "hidden_act": "silu",
            },
        ],  # fmt: skip
        dof_config={"action": MAX_DIM},
        agent_pos_config={"state": MAX_DIM},
    )
    cfg["vision_config"].update(
        depth=real["vision_depth"],
        hidden_size=real["vision_width"],
        intermediate_size=real["vision_mlp_dim"],
        num_heads=real["vision_heads"],
        out_hidden_size=hidden,
        window_size=real["window_size"],
        fullatt_block_indexes=list(real["fullatt_block_indexes"]),
    )
    return cfg


def lerobot_side(config_json: str) -> None:
    """Print {key: [shape, dtype]} of LeRobot's real-size policy state dict as its
    `WallXPolicy` holds it (`model.` + Qwen2_5_VLMoEForAction's keys, bf16 but the norms and the
    action head), and the keys its saved file drops (tied)."""
    from lerobot.policies.wall_x.modeling_wall_x import Qwen2_5_VLMoEForAction
    from lerobot.policies.wall_x.qwen_model import Qwen2_5_VLConfig
    from transformers import AutoProcessor

    qcfg = Qwen2_5_VLConfig(**json.loads(config_json))
    qcfg._attn_implementation = "eager"
    processor = AutoProcessor.from_pretrained(str(FIXTURE_BASE), use_fast=True)  # token ids only
    with torch.device("meta"):
        model = Qwen2_5_VLMoEForAction(qcfg, processor=processor)
    model.to_bfloat16_for_selected_params()  # what WallXPolicy.__init__ does
    state = model.state_dict()
    tied = [
        k
        for k, v in state.items()
        if k != "lm_head.weight"
        and v is state["lm_head.weight"]
        or k == "model.embed_tokens.weight"
    ]
    print(json.dumps({
        "keys": {f"model.{k}": [list(v.shape), str(v.dtype).removeprefix("torch.")]
                 for k, v in state.items()},
        "tied_not_in_file": [f"model.{k}" for k in tied],
    }))  # fmt: skip


def run_lerobot(python: str, real: dict[str, Any]) -> dict[str, Any] | None:
    if not Path(python).is_file():
        return None
    out = subprocess.run(
        [python, __file__, "--side", "lerobot", "--config-json",
         json.dumps(lerobot_config_dict(real))],
        capture_output=True, text=True, check=False, env={"HF_HUB_OFFLINE": "1", "PATH": ""},
    )  # fmt: skip
    if out.returncode:
        raise RuntimeError(f"LeRobot's side failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# --- our side ------------------------------------------------------------------------------------


def make_config(**overrides: Any):
    from raytrain_vla.models.wall_x.config import REAL_SIZE, WallXConfig

    cams = tuple(f"observation.images.camera{i}" for i in range(CAMERAS))
    return WallXConfig(
        **REAL_SIZE,
        cameras=cams,
        camera_sources=cams,
        camera_shapes=(CAMERA_SHAPE,) * CAMERAS,
        state_dim=MAX_DIM,
        action_dim=MAX_DIM,
        chunk_size=CHUNK,
        n_action_steps=CHUNK,
        max_state_dim=MAX_DIM,
        max_action_dim=MAX_DIM,
        **overrides,
    )


def build_meta(config) -> nn.Module:
    from raytrain_vla.models.registry import get_family
    from raytrain_vla.train.materialize import meta_model

    return meta_model(get_family("wall_x"), config)


def our_lerobot_keys(model: nn.Module) -> dict[str, list]:
    from raytrain_vla.models.registry import get_family
    from raytrain_vla.models.wall_x.lerobot_io import lerobot_dtype

    names = get_family("wall_x").lerobot_key_map(model)
    return {
        names[n]: [list(t.shape), str(lerobot_dtype(names[n])).removeprefix("torch.")]
        for n, t in model.state_dict().items()
    }


def parameter_counts(model: nn.Module, lerobot: dict[str, Any] | None) -> dict[str, Any]:
    ours = our_lerobot_keys(model)
    total = sum(p.numel() for p in model.parameters())
    roles: dict[str, int] = {}
    for name, param in model.named_parameters():
        roles[model.role_of(name)] = roles.get(model.role_of(name), 0) + param.numel()
    out: dict[str, Any] = {
        "tensors": len(ours),
        "parameters": total,
        "roles": roles,
        "no_gradient_in_full_fine_tune": sum(
            model.get_parameter(n).numel() for n in model.frozen_parameters()
        ),
    }
    expert_only = build_meta(make_config(train_action_expert_only=True))
    out["trainable_train_action_expert_only"] = sum(
        p.numel() for n, p in expert_only.named_parameters()
        if n not in expert_only.frozen_parameters()
    )  # fmt: skip
    if lerobot is None:
        out["lerobot_0.6.1"] = None
        return out
    in_file = {k: v for k, v in lerobot["keys"].items() if k not in lerobot["tied_not_in_file"]}
    mismatched = sorted(k for k in set(in_file) & set(ours) if in_file[k] != ours[k])
    out["lerobot_0.6.1"] = {
        "tensors_in_file": len(in_file),
        "parameters": sum(math.prod(s) for s, _ in in_file.values()),
        "tied_not_in_file": lerobot["tied_not_in_file"],
        "only_lerobot": sorted(set(in_file) - set(ours)),
        "only_ours": sorted(set(ours) - set(in_file)),
        "shape_or_dtype_differs": {k: [in_file[k], ours[k]] for k in mismatched},
    }
    out["same_keys_shapes_dtypes"] = in_file == ours
    return out


# --- activations ---------------------------------------------------------------------------------


class SavedBytes:
    """Bytes autograd saves for backward, split by the checkpoint unit running (None: outside
    every unit), and the bytes of each unit's inputs (what checkpointing keeps)."""

    def __init__(self, units: list[nn.Module], params: list[torch.Tensor]):
        self.params = {p.untyped_storage()._cdata for p in params}
        self.unit: int | None = None
        self.saved: dict[int, tuple[int | None, int, torch.Tensor]] = {}
        self.inputs: dict[int, tuple[int, torch.Tensor]] = {}
        self.handles = []
        for i, unit in enumerate(units):
            self.handles.append(unit.register_forward_pre_hook(self._enter(i), with_kwargs=True))
            self.handles.append(unit.register_forward_hook(self._leave))

    @staticmethod
    def key(t: torch.Tensor) -> int:  # views share their storage (meta tensors' too)
        return t.untyped_storage()._cdata

    @staticmethod
    def nbytes(t: torch.Tensor) -> int:
        return t.untyped_storage().nbytes()

    def _enter(self, index: int):
        def hook(module, args, kwargs):
            self.unit = index
            for a in [*args, *kwargs.values()]:
                if isinstance(a, torch.Tensor) and a.is_floating_point():
                    self.inputs[self.key(a)] = (self.nbytes(a), a)

        return hook

    def _leave(self, module, args, output):
        self.unit = None

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        key = self.key(t)
        if key not in self.params and key not in self.saved:
            self.saved[key] = (self.unit, self.nbytes(t), t)
        return t

    def totals(self) -> tuple[int, dict[int, int], int]:
        for h in self.handles:
            h.remove()
        per_unit: dict[int, int] = {}
        outside = 0
        for unit, nbytes, _ in self.saved.values():
            if unit is None:
                outside += nbytes
            else:
                per_unit[unit] = per_unit.get(unit, 0) + nbytes
        return outside, per_unit, sum(b for b, _ in self.inputs.values())


def vision_activations(model: nn.Module, config) -> tuple[int, dict[int, int], int, int]:
    """One sample's vision pass (all cameras) on the CPU in bf16, zero weights."""
    from raytrain_vla.models.wall_x.images import patch_grid

    visual = copy.deepcopy(model.visual).to_empty(device="cpu").to(torch.bfloat16)
    for p in visual.parameters():
        p.data.zero_()
    grid = torch.tensor([patch_grid(*CAMERA_SHAPE[1:], config)] * CAMERAS)
    pixels = torch.zeros(int(grid.prod(-1).sum()), config.patch_values, dtype=torch.bfloat16)
    counter = SavedBytes(list(visual.blocks), list(visual.parameters()))
    with torch.autograd.graph.saved_tensors_hooks(counter.pack, lambda x: x):
        out = visual(pixels, grid_thw=grid).pooler_output
    outside, per_unit, inputs = counter.totals()
    return outside, per_unit, inputs, out.shape[0]


def split_experts(self, hidden: torch.Tensor, is_action: torch.Tensor) -> torch.Tensor:
    """`ExpertPair.forward` for one unpadded sample on the meta device, where boolean indexing
    has no shape: the prompt's last CHUNK tokens are its `<|action|>` rows."""
    parts = [hidden[:, :-CHUNK], hidden[:, -CHUNK:]]  # expert 0 (VLM), expert 1 (action)
    outs = [
        nn.functional.pad(expert(part[..., :dim]), (0, hidden.shape[-1] - dim))
        for part, expert, dim in zip(parts, self.experts, self.dim_inputs, strict=True)
    ]
    return torch.cat(outs, dim=1)


def decoder_activations(model: nn.Module, config, image_tokens: int) -> tuple:
    """One sample's decoder pass on the meta device in bf16 (token embeddings, action head,
    every layer with both experts, the final norm)."""
    from raytrain_vla.models.wall_x.layers import ExpertPair

    length = TEXT_TOKENS + image_tokens + 1 + CHUNK
    model = model.to(torch.bfloat16)
    counter = SavedBytes(list(model.layers), list(model.parameters()))
    for module in model.modules():
        if isinstance(module, ExpertPair):
            module.forward = split_experts.__get__(module)
    meta = {"device": "meta"}
    ids = torch.zeros((1, length), dtype=torch.long, **meta)
    batch = {
        "input_ids": ids,
        "attention_mask": torch.ones((1, length), dtype=torch.bool, **meta),
        "position_ids": torch.zeros((1, 3, length), dtype=torch.long, **meta),
    }
    with torch.autograd.graph.saved_tensors_hooks(counter.pack, lambda x: x):
        prefix = model.embed_tokens(ids)
        x_t = torch.empty((1, CHUNK, MAX_DIM), **meta)
        time = torch.empty((1,), **meta)
        dof = torch.empty((1, CHUNK, MAX_DIM), **meta)
        model.velocity_from(prefix, batch, x_t, time, dof)
    return (*counter.totals(), length)


def memory_table(model: nn.Module, config, activations: bool) -> dict[str, Any]:
    total = sum(p.numel() for p in model.parameters())
    units = model.fsdp_units()
    size = {id(u): sum(p.numel() for p in u.parameters()) for u in units}
    name_of = {id(m): n for n, m in model.named_modules()}
    largest = max(units, key=lambda u: size[id(u)])
    gathered = 2 * size[id(largest)] * 2  # bf16, this unit and the one prefetched
    grad_buffer = size[id(largest)] * 4  # its unsharded gradient, reduce-scattered in fp32
    out: dict[str, Any] = {
        "cameras": f"{CAMERAS} x {CAMERA_SHAPE[1]}x{CAMERA_SHAPE[2]}",
        "params": total,
        "fsdp_units": len(units),
        "largest_fsdp_unit": {"name": name_of[id(largest)], "params": size[id(largest)]},
    }
    acts = {"no_checkpointing": 0.0, "activation_checkpointing": 0.0}
    if activations:
        v_out, v_units, v_inputs, image_tokens = vision_activations(model, config)
        d_out, d_units, d_inputs, length = decoder_activations(model, config, image_tokens)
        acts = {
            "no_checkpointing": v_out + sum(v_units.values()) + d_out + sum(d_units.values()),
            "activation_checkpointing": v_out + v_inputs + d_out + d_inputs
            + max([*v_units.values(), *d_units.values()]),
        }  # fmt: skip
        out["tokens"] = {"image": image_tokens, "sequence": length, "text_assumed": TEXT_TOKENS}
        out["activations_per_sample_gb"] = {
            **{k: v / GB for k, v in acts.items()},
            "vision_tower": (v_out + sum(v_units.values())) / GB,
            "decoder": (d_out + sum(d_units.values())) / GB,
        }
    rows = []
    for world in WORLD_SIZES:
        state = {k: total * b / world for k, b in STATE_BYTES.items()}
        base = sum(state.values()) + gathered + grad_buffer
        row: dict[str, Any] = {
            "world_size": world,
            **{f"{k}_gb": v / GB for k, v in state.items()},
            "gathered_bf16_x2_gb": gathered / GB,
            "unsharded_grad_fp32_gb": grad_buffer / GB,
            "model_state_and_gather_gb": base / GB,
        }
        if activations:
            for label, per_sample in (("", acts["no_checkpointing"]),
                                      ("_ac", acts["activation_checkpointing"])):  # fmt: skip
                row[f"total_micro_batch_1{label}_gb"] = (base + per_sample) / GB
                row[f"max_micro_batch_80gb{label}"] = max(
                    0, math.floor((GPU_BYTES - base) / per_sample)
                )
        rows.append(row)
    out["rows"] = rows
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lerobot-python", default="/tmp/lrv/bin/python")
    parser.add_argument("--dump-keys", type=Path, help="write both sides' keys, shapes, dtypes")
    parser.add_argument("--no-activations", action="store_true", help="skip the forward passes")
    parser.add_argument(
        "--side", choices=("ours", "lerobot"), default="ours", help=argparse.SUPPRESS
    )
    parser.add_argument("--config-json", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side == "lerobot":
        lerobot_side(args.config_json)
        return 0
    from raytrain_vla.models.wall_x.config import REAL_SIZE

    lerobot = run_lerobot(args.lerobot_python, REAL_SIZE)
    config = make_config()
    model = build_meta(config)
    result = {
        "torch": torch.__version__,
        "real_size": REAL_SIZE,
        "parameters": parameter_counts(model, lerobot),
        "full_fine_tune_memory": memory_table(model, config, not args.no_activations),
        "assumptions": (
            "full fine-tune: fp32 weights, fp32 grads, AdamW m and v in fp32 = 16 B/param over W "
            "(FSDP2 full sharding), bf16 compute; gathered = the largest FSDP unit in bf16, "
            "twice (prefetch), plus its unsharded fp32 gradient; activations per sample = bytes "
            "autograd saves in one bf16 forward (vision SDPA per window, the decoder's eager "
            "attention probabilities counted); not counted: backward's transient gradients, "
            "the CUDA context, allocator fragmentation. 80 GB = 80e9 B."
        ),
    }
    if args.dump_keys:
        args.dump_keys.write_text(
            json.dumps({"ours": our_lerobot_keys(model), "lerobot": lerobot}, indent=1)
        )
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
