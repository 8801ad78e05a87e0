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

from raytrain_vla.common.normalize import Normalizer
from raytrain_vla.common.spec import DataSpec
from raytrain_vla.config.schema import LoRAConfig
from raytrain_vla.models.base import InputBudget, PolicyFiles
from raytrain_vla.models.lerobot_dir import CONFIG
from raytrain_vla.models.lerobot_format import (
    POST_STATS,
    WEIGHTS,
    is_lerobot_dir,
    normalizer_from_stats,
    read_stats,
)
from raytrain_vla.models.lerobot_vla import (
    LeRobotVLAFamily,
    camera_wiring,
    given_options,
    lerobot_normalizer,
    refuse_contradictions,
)
from raytrain_vla.models.lora import lora_dict
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

# LeRobot's real size: what a fresh model (no `model.init_from`) is built at by default.
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


class PiFamily(LeRobotVLAFamily):
    """pi0 or pi0.5 (`variant`); the two differ only inside the model and the prompt."""

    variant: ClassVar[str]
    config_type = PiConfig
    model_type = PiModel
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
        given = given_options(options, skip=("tokenizer_path", "cameras"))
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
            refuse_contradictions(given, base, ARCHITECTURE, self.name, init_from)
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
        cameras, sources = camera_wiring(
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
        normalizer = lerobot_normalizer(normalizer, config.norm_map, self.name)
        return PiProcessor(config, normalizer, load_tokenizer(Path(config.tokenizer_path)))

    # --- weights -------------------------------------------------------------------------------

    def lerobot_key_map(self, model: PiModel) -> dict[str, str]:
        return lerobot_io.key_map(model)

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
        return PolicyFiles(state, config, self.policy_spec(config), normalizer)

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
        stats = self.lerobot_stats(config, normalizer)
        return lerobot_io.write_lerobot_dir(out_dir, theirs, config, stats)
