"""The smolvla family: LeRobot's SmolVLA behind the family contract, LeRobot's files in and out."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file
from transformers import AutoTokenizer

from raytrain_vla.common.normalize import ACTION, STATE, Normalizer
from raytrain_vla.common.spec import DataSpec
from raytrain_vla.config.schema import LoRAConfig
from raytrain_vla.models.base import InputBudget, PolicyFiles
from raytrain_vla.models.lerobot_format import rename_lerobot_state
from raytrain_vla.models.lerobot_vla import (
    LeRobotVLAFamily,
    camera_wiring,
    given_options,
    refuse_contradictions,
)
from raytrain_vla.models.lora import lora_dict
from raytrain_vla.models.smolvla import lerobot_io
from raytrain_vla.models.smolvla.config import SmolVLAConfig
from raytrain_vla.models.smolvla.model import SmolVLA, vlm_config_of
from raytrain_vla.models.smolvla.options import SmolVLAOptions
from raytrain_vla.models.smolvla.processor import SmolVLAProcessor, with_newline

# Options whose value decides parameter shapes or wiring: a checkpoint's value cannot change.
ARCHITECTURE = (
    "num_vlm_layers", "num_expert_layers", "expert_width_multiplier", "self_attn_every_n_layers",
    "attention_mode", "max_state_dim", "max_action_dim",
)  # fmt: skip
VLM_DIR = "vlm"  # inside an exported policy


def _vlm_config(vlm_path: str, key: str = "model.smolvla.vlm_path") -> dict[str, Any]:
    path = Path(vlm_path).expanduser()
    try:
        data = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"'{key}': {path} has no readable SmolVLM config.json ({err})") from err
    if data.get("model_type") != "smolvlm":
        raise ValueError(
            f"'{key}': {path / 'config.json'} has model_type {data.get('model_type')!r}, "
            "expected 'smolvlm'"
        )
    return data


class SmolVLAFamily(LeRobotVLAFamily):
    name = "smolvla"
    options_type = SmolVLAOptions
    config_type = SmolVLAConfig
    model_type = SmolVLA
    uses_data_image_size = False  # model.smolvla.resize_imgs_with_padding

    def resolve_config(
        self,
        options: SmolVLAOptions,
        spec: DataSpec,
        init_from: str = "",
        lora: LoRAConfig | None = None,
    ) -> SmolVLAConfig:
        """The LeRobot checkpoint's config when `init_from` is one, else LeRobot's defaults
        over the VLM at `vlm_path`; then the options given and the dataset's shapes."""
        if lora_dict(lora) and options.train_expert_only:
            raise ValueError(
                "'model.smolvla.train_expert_only' true freezes the whole VLM, but 'model.lora.r' "
                f"{lora.r} adapts it: leave train_expert_only unset (or false) to train adapters"
            )
        given = given_options(options, skip=("vlm_path", "cameras"))
        if init_from and lerobot_io.is_lerobot_dir(init_from):
            policy_dir = Path(init_from)
            data = json.loads((policy_dir / lerobot_io.CONFIG).read_text())
            base = lerobot_io.config_from_lerobot(data, policy_dir, options.vlm_path or None)
            refuse_contradictions(given, base, ARCHITECTURE, "smolvla", init_from)
            fixed_cameras = True
        else:
            if not options.vlm_path:
                raise ValueError(
                    "'model.smolvla.vlm_path' is required: a SmolVLM directory (config, "
                    "tokenizer; weights optional), or set model.init_from to a LeRobot SmolVLA "
                    "pretrained_model directory"
                )
            vlm_path = str(Path(options.vlm_path).expanduser())
            base = SmolVLAConfig(
                vlm_path=vlm_path,
                vlm_config=_vlm_config(vlm_path),
                vlm_model_name=vlm_path,
                load_vlm_weights=bool(self._vlm_weight_files(vlm_path)),
            )
            fixed_cameras = False
        cameras, sources = camera_wiring(
            list(base.cameras), dict(options.cameras), spec, fixed_cameras, "model.smolvla.cameras"
        )
        shapes = [
            spec.camera_shapes[src]
            if src
            else (base.camera_shapes[i] if fixed_cameras else (3, 480, 640))
            for i, src in enumerate(sources)
        ]
        chunk = spec.chunk_size
        fields = {
            **given,
            "cameras": tuple(cameras),
            "camera_sources": tuple(sources),
            "camera_shapes": tuple(tuple(s) for s in shapes),
            "state_dim": spec.state_dim,
            "action_dim": spec.action_dim,
            "chunk_size": chunk,
            "n_action_steps": min(base.n_action_steps, chunk) if fixed_cameras else chunk,
            "vlm_dtype": "float32",  # trained weights are fp32 masters (train.precision: bf16)
            "lora": lora_dict(lora),
        }

        if "resize_imgs_with_padding" in fields:
            fields["resize_imgs_with_padding"] = tuple(fields["resize_imgs_with_padding"])
        return dataclasses.replace(base, **fields)

    def tiny_options(self, fixtures: Path | None) -> SmolVLAOptions:
        """The tiny SmolVLM of LeRobot's fixture (its config and tokenizer; random weights)."""
        if fixtures is None:
            raise FileNotFoundError(
                "smolvla's tiny instance needs shared/fixtures/lerobot_smolvla_tiny"
            )
        vlm_path = str(fixtures / "lerobot_smolvla_tiny" / "vlm")
        return SmolVLAOptions(
            vlm_path=vlm_path, num_vlm_layers=2, resize_imgs_with_padding=(32, 32)
        )

    def check_options(
        self, options: SmolVLAOptions, init_from: str = "", lora: LoRAConfig | None = None
    ) -> None:
        """The VLM directory (or the LeRobot checkpoint and the VLM it names), the architecture
        options against that checkpoint and LoRA against the freezing options, on the driver;
        which dataset camera feeds which model camera is checked once the data is open."""
        cameras = {src: (3, 1, 1) for src in options.cameras.values()} or {"probe": (3, 1, 1)}
        spec = DataSpec(cameras, state_dim=1, action_dim=1, chunk_size=1)
        try:
            self.resolve_config(options, spec, init_from, lora)
        except ValueError as err:
            if "no dataset camera feeds" not in str(err):
                raise

    def notes(self, config: SmolVLAConfig) -> list[str]:
        if config.load_vlm_weights and config.lerobot_extra:
            return [
                "smolvla: the init_from checkpoint says load_vlm_weights: true, so LeRobot runs "
                "its VLM in bfloat16; training converts those weights to float32 masters "
                f"(compute dtype: train.precision; policy.load of the export runs {config.vlm_dtype})"
            ]
        return []

    def input_budget(self, config: SmolVLAConfig) -> InputBudget:
        """Images are resized with padding to `resize_imgs_with_padding`; the vision tower's
        patches are merged `scale_factor`^2 to one token by the connector. Text is counted in
        the VLM tokenizer's tokens of LeRobot's prompt (the task plus a newline)."""
        vlm = vlm_config_of(config)
        width, height = config.resize_imgs_with_padding
        patch, scale = vlm.vision_config.patch_size, vlm.scale_factor
        tokenizer = AutoTokenizer.from_pretrained(config.vlm_path)
        return InputBudget(
            image_size=(height, width),
            tokens_per_camera=(height // patch) * (width // patch) // (scale * scale),
            pixels_per_token=patch * scale,
            text_budget=config.tokenizer_max_length,
            text_budget_key=f"model.{self.name}.tokenizer_max_length",
            text_unit="tokens",
            count_text=lambda text: len(tokenizer(with_newline(text))["input_ids"]),
        )

    def processor(self, config: SmolVLAConfig, normalizer: Normalizer) -> SmolVLAProcessor:
        """Normalisation as LeRobot computes it from the same statistics (mean/std divides by
        std + 1e-8), so LeRobot runs a LeRobot-format export on exactly the inputs we trained on."""
        if STATE in normalizer.stats and ACTION in normalizer.stats:
            normalizer = lerobot_io.normalizer_from_stats(
                normalizer.stats, lerobot_io.norm_map_for(normalizer), "the dataset's stats"
            )
        return SmolVLAProcessor(config, normalizer)

    # --- weights -------------------------------------------------------------------------------

    @staticmethod
    def _vlm_weight_files(vlm_path: str) -> list[Path]:
        return sorted(Path(vlm_path).expanduser().glob("*.safetensors"))

    def load_base_weights(self, model: SmolVLA, config: SmolVLAConfig) -> list[str]:
        """The SmolVLM's own weights from `vlm_path` (one or several safetensors files), under
        `transformers`' names; text layers past `num_vlm_layers` are not used. Returns the
        parameters loaded."""
        files = self._vlm_weight_files(config.vlm_path) if config.load_vlm_weights else []
        if not files or config.lerobot_extra:  # a LeRobot checkpoint brings every weight
            return []
        own = model.state_dict()
        names = {}
        for name in own:
            key = lerobot_io.to_lerobot_key(name, config, len(model.layers))
            if key.startswith("model.vlm_with_expert.vlm."):
                names[key.removeprefix("model.vlm_with_expert.vlm.")] = name
        loaded = []
        with torch.no_grad():
            for file in files:
                with safe_open(str(file), framework="pt") as f:
                    for key in f.keys():
                        if key in names:
                            own[names[key]].copy_(f.get_tensor(key))
                            loaded.append(names[key])
        missing = sorted(set(names.values()) - set(loaded))
        if missing:
            raise ValueError(
                f"{config.vlm_path}: its safetensors lack {len(missing)} VLM weights, e.g. "
                f"{missing[:3]}"
            )
        return loaded

    def lerobot_key_map(self, model: SmolVLA) -> dict[str, str]:
        return lerobot_io.key_map(model, model.config)

    # --- policies ------------------------------------------------------------------------------

    def export_assets(self, config: SmolVLAConfig, out_dir: Path) -> SmolVLAConfig:
        """Copy the VLM's config/tokenizer/processor files into the policy (`vlm/`), so it loads
        on a machine without the training run's VLM directory."""
        lerobot_io.copy_vlm_assets(Path(config.vlm_path), Path(out_dir) / VLM_DIR)
        return dataclasses.replace(config, vlm_path=VLM_DIR)

    def config_from_dict(self, data: dict[str, Any], base_dir: Path | None = None) -> SmolVLAConfig:
        config = SmolVLAConfig.from_dict(data)
        if base_dir is not None and not Path(config.vlm_path).is_absolute():
            config = dataclasses.replace(config, vlm_path=str(Path(base_dir) / config.vlm_path))
        return config

    def read_foreign(self, path: Path, options: dict[str, Any] | None = None) -> PolicyFiles | None:
        """A LeRobot SmolVLA `pretrained_model/` directory, or None if `path` is not one."""
        path = Path(path)
        if not lerobot_io.is_lerobot_dir(path):
            return None
        data = json.loads((path / lerobot_io.CONFIG).read_text())
        if data.get("type") != "smolvla":
            return None
        if options:
            raise ValueError(f"policy.load options {sorted(options)}: smolvla takes none")
        config = lerobot_io.config_from_lerobot(data, path)
        stats = lerobot_io.read_stats(path)
        normalizer = lerobot_io.normalizer_from_stats(
            stats, config.norm_map, str(path / lerobot_io.POST_STATS)
        )
        return self._lerobot_files(path, config, normalizer)

    def _lerobot_files(
        self, path: Path, config: SmolVLAConfig, normalizer: Normalizer
    ) -> PolicyFiles:
        with torch.device("meta"):
            skeleton = SmolVLA(config)
        theirs = load_file(str(path / lerobot_io.WEIGHTS))
        mapping = lerobot_io.key_map(skeleton, config)
        state = rename_lerobot_state(theirs, mapping, path)
        return PolicyFiles(state, config, self.policy_spec(config), normalizer)

    def write_foreign(
        self,
        fmt: str,
        out_dir: Path,
        state: dict[str, torch.Tensor],
        config: SmolVLAConfig,
        normalizer: Normalizer,
    ) -> Path:
        """LeRobot's `pretrained_model/` layout: what `SmolVLAPolicy.from_pretrained` and
        `make_pre_post_processors(pretrained_path=...)` load."""
        if fmt != "lerobot":
            raise ValueError(
                f"model type 'smolvla' exports formats {self.foreign_formats}, not {fmt!r}"
            )
        state, config = self.policy_state(state, config)
        with torch.device("meta"):
            skeleton = SmolVLA(config)
        mapping = lerobot_io.key_map(skeleton, config)
        theirs = {mapping[name]: tensor for name, tensor in state.items()}
        stats = self.lerobot_stats(config, normalizer)
        config = dataclasses.replace(config, norm_map=lerobot_io.norm_map_for(normalizer))
        return lerobot_io.write_lerobot_dir(out_dir, theirs, config, stats)


FAMILY = SmolVLAFamily()
