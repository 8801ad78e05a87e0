"""The pi0 and pi0.5 families: LeRobot's pi0 / pi0.5 behind the family contract, LeRobot's files
in and out. `models/pi0/family.py` and `models/pi05/family.py` each instantiate it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from safetensors.torch import load_file

from raytrain_vla.common.normalize import ACTION, STATE, Normalizer
from raytrain_vla.common.spec import DataSpec
from raytrain_vla.config.schema import LoRAConfig
from raytrain_vla.models.base import InputBudget, ModelFamily, PolicyFiles
from raytrain_vla.models.lerobot_dir import CONFIG
from raytrain_vla.models.lerobot_format import (
    POST_STATS,
    WEIGHTS,
    affine_stats,
    is_lerobot_dir,
    normalizer_from_stats,
    read_stats,
)
from raytrain_vla.models.lora import lora_dict, merge_lora
from raytrain_vla.models.pi_gemma import lerobot_io
from raytrain_vla.models.pi_gemma.config import (
    DEFAULT_NORM,
    DEFAULT_TOKENS,
    GEMMA_VARIANTS,
    PALIGEMMA_VOCAB,
    SIGLIP,
    PiConfig,
)
from raytrain_vla.models.pi_gemma.model import PiModel
from raytrain_vla.models.pi_gemma.options import ARCHITECTURE, PiOptions
from raytrain_vla.models.pi_gemma.processor import PiProcessor
from raytrain_vla.models.pi_gemma.tokenizer import (
    TOKENIZER_DIR,
    copy_tokenizer,
    find_tokenizer,
    load_tokenizer,
)

# Option name -> PiConfig field where they differ (none today; kept explicit).
_REAL_SIZE = {
    "vlm_width": GEMMA_VARIANTS["gemma_2b"]["width"],
    "vlm_mlp_dim": GEMMA_VARIANTS["gemma_2b"]["mlp_dim"],
    "expert_width": GEMMA_VARIANTS["gemma_300m"]["width"],
    "expert_mlp_dim": GEMMA_VARIANTS["gemma_300m"]["mlp_dim"],
    "depth": GEMMA_VARIANTS["gemma_2b"]["depth"],
    "head_dim": GEMMA_VARIANTS["gemma_2b"]["head_dim"],
    "vision_width": SIGLIP["width"],
    "vision_layers": SIGLIP["layers"],
    "vision_heads": SIGLIP["heads"],
    "vision_mlp_dim": SIGLIP["mlp_dim"],
    "patch_size": SIGLIP["patch"],
    "vocab_size": PALIGEMMA_VOCAB,
}


def _camera_wiring(
    cameras: list[str], mapping: dict[str, str], spec: DataSpec, fixed: bool, key: str
) -> tuple[list[str], list[str]]:
    """(model cameras, the dataset camera feeding each or ""). `fixed`: the model's cameras
    come from a checkpoint; otherwise a fresh model takes the mapping's or the dataset's."""
    data_cams = spec.camera_keys
    bad = {k: v for k, v in mapping.items() if v not in data_cams}
    if bad:
        raise ValueError(f"'{key}': {bad} name no dataset camera; the dataset has {data_cams}")
    if not fixed:
        cameras = list(mapping) or list(data_cams)
    unknown = [k for k in mapping if k not in cameras]
    if unknown:
        raise ValueError(f"'{key}': {unknown} are not cameras of the model; it has {cameras}")
    sources = [mapping.get(cam, cam if cam in data_cams else "") for cam in cameras]
    if not any(sources):
        raise ValueError(
            f"no dataset camera feeds the model: its cameras are {cameras}, the dataset's "
            f"{data_cams}; map them with {key}={{MODEL_CAMERA: DATASET_CAMERA}}"
        )
    return cameras, sources


class PiFamily(ModelFamily):
    """pi0 or pi0.5 (`variant`); the two differ only inside the model and the prompt."""

    variant: ClassVar[str]
    config_type = PiConfig
    model_type = PiModel
    foreign_formats = ("lerobot",)
    supports_lora = True
    uses_data_image_size = False  # model.<pi>.image_resolution

    def _key(self, option: str) -> str:
        return f"model.{self.name}.{option}"

    def resolve_config(
        self,
        options: PiOptions,
        spec: DataSpec,
        init_from: str = "",
        lora: LoRAConfig | None = None,
    ) -> PiConfig:
        """The LeRobot checkpoint's config when `init_from` is one, else LeRobot's defaults at
        the dimensions given; then the options given and the dataset's shapes."""
        if lora_dict(lora) and options.train_expert_only:
            raise ValueError(
                f"'{self._key('train_expert_only')}' true freezes the whole PaliGemma, but "
                f"'model.lora.r' {lora.r} adapts it: leave train_expert_only unset (or false)"
            )
        given = {
            f.name: getattr(options, f.name)
            for f in dataclasses.fields(options)
            if getattr(options, f.name) is not None and f.name not in ("tokenizer_path", "cameras")
        }
        if "image_resolution" in given:
            given["image_resolution"] = tuple(given["image_resolution"])
        if init_from and is_lerobot_dir(init_from):
            policy_dir = Path(init_from).expanduser()
            data = json.loads((policy_dir / CONFIG).read_text())
            if data.get("type") != self.name:
                raise ValueError(
                    f"model.init_from={init_from} is a LeRobot {data.get('type')!r} policy; "
                    f"model.type is {self.name!r}"
                )
            base = lerobot_io.config_from_lerobot(data, policy_dir, options.vision_heads)
            clash = {
                k: (v, getattr(base, k))
                for k, v in given.items()
                if k in ARCHITECTURE and v != getattr(base, k)
            }
            if clash:
                detail = ", ".join(f"{k}={v!r} (checkpoint: {c!r})" for k, (v, c) in clash.items())
                raise ValueError(
                    f"model.{self.name} options contradict model.init_from={init_from}: {detail}"
                )
            tokenizer = find_tokenizer(
                options.tokenizer_path, policy_dir, key=self._key("tokenizer_path")
            )
            fixed = True
        else:
            base = PiConfig(
                variant=self.name,
                norm_map=dict(DEFAULT_NORM[self.name]),
                tokenizer_max_length=DEFAULT_TOKENS[self.name],
                **_REAL_SIZE,
            )
            tokenizer = find_tokenizer(options.tokenizer_path, key=self._key("tokenizer_path"))
            fixed = False
        cameras, sources = _camera_wiring(
            list(base.cameras), dict(options.cameras), spec, fixed, self._key("cameras")
        )
        shapes = [
            spec.camera_shapes[src] if src else (base.camera_shapes[i] if fixed else (3, 224, 224))
            for i, src in enumerate(sources)
        ]
        chunk = spec.chunk_size
        steps = given.pop("n_action_steps", None)
        fields = {
            **given,
            "tokenizer_path": str(tokenizer),
            "cameras": tuple(cameras),
            "camera_sources": tuple(sources),
            "camera_shapes": tuple(tuple(s) for s in shapes),
            "state_dim": spec.state_dim,
            "action_dim": spec.action_dim,
            "chunk_size": chunk,
            "n_action_steps": steps
            if steps is not None
            else min(base.n_action_steps, chunk)
            if fixed
            else chunk,
            "lora": lora_dict(lora),
        }
        return dataclasses.replace(base, **fields)

    def tiny_options(self, fixtures: Path | None) -> PiOptions:
        """The dimensions and tokenizer of LeRobot's tiny fixture (random weights)."""
        if fixtures is None:
            raise FileNotFoundError(
                f"{self.name}'s tiny instance needs shared/fixtures/lerobot_{self.name}_tiny"
            )
        folder = fixtures / f"lerobot_{self.name}_tiny"
        spec = json.loads((folder / "spec.json").read_text())
        vlm, expert = spec["gemma_variants"]["gemma_2b"], spec["gemma_variants"]["gemma_300m"]
        vision = spec["vision"]
        return self.options_type(
            tokenizer_path=str(folder / TOKENIZER_DIR),
            vlm_width=vlm["width"], vlm_mlp_dim=vlm["mlp_dim"], expert_width=expert["width"],
            expert_mlp_dim=expert["mlp_dim"], depth=vlm["depth"], head_dim=vlm["head_dim"],
            vision_width=vision["hidden_size"], vision_layers=vision["num_hidden_layers"],
            vision_heads=vision["num_attention_heads"], vision_mlp_dim=vision["intermediate_size"],
            patch_size=vision["patch_size"], vocab_size=spec["vocab_size"],
            image_resolution=tuple(spec["image_resolution"]),
            tokenizer_max_length=spec["tokenizer_max_length"],
            num_inference_steps=spec["num_inference_steps"],
        )  # fmt: skip

    def check_options(
        self, options: PiOptions, init_from: str = "", lora: LoRAConfig | None = None
    ) -> None:
        """The tokenizer, the LeRobot checkpoint and the options against it, and LoRA against
        the freezing options, on the driver; camera wiring is checked once the data is open."""
        cameras = {src: (3, 1, 1) for src in options.cameras.values()} or {"probe": (3, 1, 1)}
        spec = DataSpec(cameras, state_dim=1, action_dim=1, chunk_size=1)
        try:
            self.resolve_config(options, spec, init_from, lora)
        except ValueError as err:
            if "no dataset camera feeds" not in str(err):
                raise

    def notes(self, config: PiConfig) -> list[str]:
        modes = f"state {config.norm_map['STATE']}, action {config.norm_map['ACTION']}"
        return [
            f"{self.name}: state and actions are normalised as LeRobot's {self.name} config says "
            f"({modes}; data.normalization does not apply), and the loss averages every chunk "
            "step (LeRobot's pi loss does not use action_is_pad)"
        ]

    def input_budget(self, config: PiConfig) -> InputBudget:
        """Images are padded to `image_resolution` (one token per SigLIP patch); text is counted
        in PaliGemma tokens of the prompt LeRobot builds."""
        tokenizer = load_tokenizer(Path(config.tokenizer_path))
        processor = PiProcessor(config, Normalizer({}, {}, {}), tokenizer)
        zeros = np.zeros((1, config.state_dim), np.float32)
        height, width = config.image_resolution
        return InputBudget(
            image_size=(height, width),
            tokens_per_camera=config.tokens_per_camera,
            pixels_per_token=config.patch_size,
            text_budget=config.tokenizer_max_length,
            text_budget_key=self._key("tokenizer_max_length"),
            text_unit="tokens",
            count_text=lambda text: len(
                tokenizer(processor.prompts(np.array([text]), zeros)[0])["input_ids"]
            ),
        )

    def processor(self, config: PiConfig, normalizer: Normalizer) -> PiProcessor:
        """Normalisation as LeRobot computes it from the same statistics with the config's
        `norm_map` (pi0: mean/std over std + 1e-8; pi0.5: q01/q99 to [-1, 1])."""
        if STATE in normalizer.stats and ACTION in normalizer.stats:
            needs = {
                "QUANTILES": ("q01", "q99"),
                "QUANTILE10": ("q10", "q90"),
                "MEAN_STD": ("mean", "std"),
                "MIN_MAX": ("min", "max"),
            }
            for feature, kind in ((STATE, "STATE"), (ACTION, "ACTION")):
                lacking = [
                    s
                    for s in needs.get(config.norm_map[kind], ())
                    if s not in normalizer.stats[feature]
                ]
                if lacking:
                    raise ValueError(
                        f"the dataset's meta/stats.json has no {lacking} for {feature!r}, which "
                        f"{self.name} normalises with {config.norm_map[kind]}; compute them with "
                        "`python -m raytrain_vla.data stats ROOT --force`"
                    )
            normalizer = normalizer_from_stats(
                normalizer.stats, config.norm_map, "the dataset's stats"
            )
        return PiProcessor(config, normalizer, load_tokenizer(Path(config.tokenizer_path)))

    # --- weights -------------------------------------------------------------------------------

    def checkpoint_keys(self, path: str | Path, model: PiModel) -> dict[str, str] | None:
        """LeRobot's names for our parameters when `path` is a LeRobot policy directory; under
        LoRA, a wrapped layer's base weight is the plain weight of our (merged) exports."""
        if is_lerobot_dir(path):
            return lerobot_io.key_map(model)
        if model.config.lora:
            return {name: name.replace(".base_layer.", ".") for name in model.state_dict()}
        return None

    def policy_state(
        self, state: dict[str, torch.Tensor], config: PiConfig
    ) -> tuple[dict[str, torch.Tensor], PiConfig]:
        """LoRA adapters merged into their base weights, so a policy loads without peft."""
        if not config.lora:
            return state, config
        return merge_lora(state, config.lora), dataclasses.replace(config, lora={})

    # --- policies ------------------------------------------------------------------------------

    def export_assets(self, config: PiConfig, out_dir: Path) -> PiConfig:
        """Copy the tokenizer into the policy (`tokenizer/`), so it loads on a machine without
        the training run's tokenizer directory."""
        copy_tokenizer(Path(config.tokenizer_path), Path(out_dir) / TOKENIZER_DIR)
        return dataclasses.replace(config, tokenizer_path=TOKENIZER_DIR)

    def config_from_dict(self, data: dict[str, Any], base_dir: Path | None = None) -> PiConfig:
        config = PiConfig.from_dict(data)
        if base_dir is not None and not Path(config.tokenizer_path).is_absolute():
            config = dataclasses.replace(
                config, tokenizer_path=str(Path(base_dir) / config.tokenizer_path)
            )
        return config

    def read_foreign(self, path: Path, options: dict[str, Any] | None = None) -> PolicyFiles | None:
        """A LeRobot pi0 / pi0.5 `pretrained_model/` directory, or None if `path` is not one of
        this variant. `options`: `tokenizer` (a directory) and `vision_heads` (for a SigLIP
        tower of another width than So400m's)."""
        path = Path(path)
        if not is_lerobot_dir(path):
            return None
        data = json.loads((path / CONFIG).read_text())
        if data.get("type") != self.name:
            return None
        options = dict(options or {})
        unknown = sorted(set(options) - {"tokenizer", "vision_heads"})
        if unknown:
            raise ValueError(
                f"policy.load options {unknown} are unknown; {self.name} takes tokenizer, vision_heads"
            )
        config = lerobot_io.config_from_lerobot(data, path, options.get("vision_heads"))
        tokenizer = find_tokenizer(
            options.get("tokenizer", ""),
            path,
            config.tokenizer_name,
            "policy.load(..., tokenizer=DIR)",
        )
        config = dataclasses.replace(config, tokenizer_path=str(tokenizer))
        normalizer = normalizer_from_stats(
            read_stats(path), config.norm_map, str(path / POST_STATS)
        )
        with torch.device("meta"):
            skeleton = PiModel(config)
        state = lerobot_io.from_lerobot_state(
            load_file(str(path / WEIGHTS)), lerobot_io.key_map(skeleton), path
        )
        spec = DataSpec(
            camera_shapes={
                src: tuple(shape)
                for src, shape in zip(config.camera_sources, config.camera_shapes, strict=True)
                if src
            },
            state_dim=config.state_dim,
            action_dim=config.action_dim,
            chunk_size=config.chunk_size,
        )
        return PolicyFiles(state, config, spec, normalizer)

    def write_foreign(
        self,
        fmt: str,
        out_dir: Path,
        state: dict[str, torch.Tensor],
        config: PiConfig,
        normalizer: Normalizer,
    ) -> Path:
        """LeRobot's `pretrained_model/` layout: what `PI0Policy.from_pretrained` /
        `PI05Policy.from_pretrained` and `make_pre_post_processors(pretrained_path=...)` load."""
        if fmt != "lerobot":
            raise ValueError(
                f"model type {self.name!r} exports formats {self.foreign_formats}, not {fmt!r}"
            )
        state, config = self.policy_state(state, config)
        theirs = lerobot_io.lerobot_state(state, config)
        stats = {}
        for cam, src in zip(config.cameras, config.camera_sources, strict=True):
            if src in normalizer.stats:
                stats[cam] = normalizer.stats[src]
            elif cam in normalizer.stats:
                stats[cam] = normalizer.stats[cam]
        for feature in (STATE, ACTION):
            stats[feature] = normalizer.stats.get(feature) or affine_stats(normalizer, feature)
        return lerobot_io.write_lerobot_dir(out_dir, theirs, config, stats)
