"""The wall_x family: Wall-OSS (LeRobot 0.6.1's `wall_x`, flow mode) behind the family contract,
built from its base checkpoint and LeRobot's policy directories."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from transformers import AutoTokenizer

from raytrain_vla.common.atomic import replacing_directory
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
    rename_lerobot_state,
    write_policy_files,
)
from raytrain_vla.models.lerobot_vla import (
    LeRobotVLAFamily,
    camera_wiring,
    lerobot_normalizer,
)
from raytrain_vla.models.lora import lora_dict
from raytrain_vla.models.wall_x import lerobot_io
from raytrain_vla.models.wall_x.config import TOKENIZER_MAX_LENGTH, WALL_OSS_FLOW, WallXConfig
from raytrain_vla.models.wall_x.images import model_size, tokens_per_image
from raytrain_vla.models.wall_x.model import WallXModel
from raytrain_vla.models.wall_x.options import WallXOptions
from raytrain_vla.models.wall_x.processor import WallXProcessor

BASE_DIR = "base"  # the base checkpoint's config, processor and tokenizer inside a policy
KEY = "model.wall_x"


def load_tokenizer(base_dir: str | Path) -> Any:
    return AutoTokenizer.from_pretrained(str(base_dir))


class WallXFamily(LeRobotVLAFamily):
    name = "wall_x"
    options_type = WallXOptions
    config_type = WallXConfig
    model_type = WallXModel
    uses_data_image_size = False  # LeRobot's resizes decide the image size

    def resolve_config(
        self,
        options: WallXOptions,
        spec: DataSpec,
        init_from: str = "",
        lora: LoRAConfig | None = None,
    ) -> WallXConfig:
        """The LeRobot checkpoint's config when `init_from` is one, else the base checkpoint's
        architecture with LeRobot's defaults; then the options given and the dataset's shapes."""
        options.check(KEY)
        if lora_dict(lora) and options.train_action_expert_only:
            raise ValueError(
                f"'{KEY}.train_action_expert_only' true freezes the language model, but "
                f"'model.lora.r' {lora.r} adapts it: leave train_action_expert_only unset (or false)"
            )
        if init_from and is_lerobot_dir(init_from):
            policy_dir = Path(init_from).expanduser()
            data = json.loads((policy_dir / CONFIG).read_text())
            if data.get("type") != self.name:
                raise ValueError(
                    f"model.init_from={init_from} is a LeRobot {data.get('type')!r} policy; "
                    f"model.type is {self.name!r}"
                )
            name = options.base_path or data.get("pretrained_name_or_path") or WALL_OSS_FLOW
            key = (
                f"{KEY}.base_path"
                if options.base_path
                else f"{policy_dir / CONFIG}: pretrained_name_or_path"
            )
            base_dir = lerobot_io.resolve_base(name, key, policy_dir)
            fields = lerobot_io.config_from_lerobot(
                data, policy_dir, base_dir, load_tokenizer(base_dir)
            )
            base = WallXConfig(**fields)
            fixed = True
        else:
            name = options.base_path or WALL_OSS_FLOW
            base_dir = lerobot_io.resolve_base(name, f"{KEY}.base_path")
            fields = lerobot_io.base_fields(base_dir, load_tokenizer(base_dir))
            base = WallXConfig(base_path=str(base_dir), base_name=name, **fields)
            fixed = False
        cameras, sources = camera_wiring(
            list(base.cameras), dict(options.cameras), spec, fixed, f"{KEY}.cameras"
        )
        chunk = spec.chunk_size
        steps = options.n_action_steps
        fields = {
            "cameras": tuple(cameras),
            "camera_sources": tuple(sources),
            "camera_shapes": tuple(
                tuple(spec.camera_shapes[src]) if src else base.camera_shapes[i]
                for i, src in enumerate(sources)
            ),
            "state_dim": spec.state_dim,
            "action_dim": spec.action_dim,
            "chunk_size": chunk,
            "lora": lora_dict(lora),
            "n_action_steps": steps
            if steps is not None
            else min(base.n_action_steps, chunk)
            if fixed
            else chunk,
        }
        for option in ("freeze_vision_encoder", "train_action_expert_only"):
            if getattr(options, option) is not None:
                fields[option] = getattr(options, option)
        return dataclasses.replace(base, **fields)

    def tiny_options(self, fixtures: Path | None) -> WallXOptions:
        """The tiny base checkpoint of LeRobot's fixture (its config, tokenizer and processor)."""
        if fixtures is None:
            raise FileNotFoundError(
                "wall_x's tiny instance needs shared/fixtures/lerobot_wallx_tiny"
            )
        return WallXOptions(base_path=str(fixtures / "lerobot_wallx_tiny" / BASE_DIR))

    def check_options(
        self, options: WallXOptions, init_from: str = "", lora: LoRAConfig | None = None
    ) -> None:
        """The base checkpoint (or the LeRobot checkpoint and the base it names), on the driver;
        which dataset camera feeds which model camera is checked once the data is open."""
        cameras = {src: (3, 48, 64) for src in options.cameras.values()} or {"probe": (3, 48, 64)}
        spec = DataSpec(cameras, state_dim=1, action_dim=1, chunk_size=1)
        try:
            self.resolve_config(options, spec, init_from, lora)
        except ValueError as err:
            if "no dataset camera feeds" not in str(err) and "name no dataset camera" not in str(
                err
            ):
                raise

    def notes(self, config: WallXConfig) -> list[str]:
        wiring = list(zip(config.cameras, config.camera_sources, config.camera_shapes, strict=True))
        sizes = ", ".join(
            f"{src} {h}x{w} -> {'x'.join(map(str, model_size(h, w, config)))}"
            for _, src, (_, h, w) in wiring
            if src
        )
        unfed = [cam for cam, src, _ in wiring if not src]
        notes = []
        if unfed:
            notes.append(
                f"wall_x: no dataset camera feeds the model's {unfed}; as LeRobot's wall_x on a "
                "batch without them, the prompt leaves them out"
            )
        return notes + [
            f"wall_x: state and actions are normalised as LeRobot's wall_x config says (state "
            f"{config.norm_map['STATE']}, action {config.norm_map['ACTION']}; data.normalization "
            f"does not apply); cameras are resized as LeRobot's wall_x resizes them ({sizes}); the "
            "loss averages every chunk step and padded action dim (action_is_pad is not used)"
        ]

    def input_budget(self, config: WallXConfig) -> InputBudget:
        """Vision tokens per camera after LeRobot's resizes; text is the whole prompt in Qwen
        tokens, within LeRobot's fixed limit."""
        tokenizer = load_tokenizer(config.base_path)
        processor = WallXProcessor(config, Normalizer({}, {}, {}), tokenizer)
        _, height, width = config.camera_shapes[0]
        return InputBudget(
            image_size=model_size(height, width, config),
            tokens_per_camera=tokens_per_image(height, width, config),
            pixels_per_token=config.patch_size * config.merge_size,
            text_budget=TOKENIZER_MAX_LENGTH,
            text_budget_key="wall_x's prompt limit (LeRobot's TOKENIZER_MAX_LENGTH, fixed; use fewer cameras)",
            text_unit="tokens",
            count_text=lambda text: len(
                tokenizer(processor.prompts(np.array([text]))[0])["input_ids"]
            ),
        )

    def processor(self, config: WallXConfig, normalizer: Normalizer) -> WallXProcessor:
        """Normalisation as LeRobot computes it from the same statistics (mean/std over
        std + 1e-8 by default)."""
        normalizer = lerobot_normalizer(normalizer, config.norm_map, self.name)
        return WallXProcessor(config, normalizer, load_tokenizer(config.base_path))

    # --- weights -------------------------------------------------------------------------------

    def load_base_weights(self, model: WallXModel, config: WallXConfig) -> list[str]:
        """The base checkpoint's weights (`model.safetensors`, keys without the policy's
        `model.`), as LeRobot's `WallXPolicy` loads them before anything else; none when the
        base has no weights file or a LeRobot checkpoint brings every weight."""
        path = Path(config.base_path) / WEIGHTS
        if config.lerobot_extra or not path.is_file():
            return []
        own = model.state_dict()
        loaded = []
        with torch.no_grad(), safe_open(str(path), framework="pt") as f:
            keys = set(f.keys())
            for name, tensor in own.items():
                if ".lora_" in name:
                    continue  # adapters start fresh
                key = lerobot_io.to_base_key(name)
                if key not in keys and name == "embed_tokens.weight":
                    key = "lm_head.weight"  # the tie, stored on the other side
                if key in keys:
                    tensor.copy_(f.get_tensor(key))
                    loaded.append(name)
        missing = sorted(n for n in set(own) - set(loaded) if ".lora_" not in n)
        if missing:
            raise ValueError(f"{path}: lacks {len(missing)} Wall-OSS weights, e.g. {missing[:3]}")
        return sorted(loaded)

    def lerobot_key_map(self, model: WallXModel) -> dict[str, str]:
        """{our name: LeRobot key}; the tied embedding is stored as `model.lm_head.weight`."""
        mapping = {
            name: lerobot_io.to_lerobot_key(name)
            for name in model.state_dict()
            if ".lora_" not in name
        }
        mapping["embed_tokens.weight"] = lerobot_io.LM_HEAD_KEY
        return mapping

    # --- policies ------------------------------------------------------------------------------

    def export_assets(self, config: WallXConfig, out_dir: Path) -> WallXConfig:
        """Copy the base checkpoint's config, image processor and tokenizer (not its weights:
        the policy holds every weight) into the policy (`base/`)."""
        target = Path(out_dir) / BASE_DIR
        target.mkdir(parents=True, exist_ok=True)
        for name in lerobot_io.BASE_FILES:
            source = Path(config.base_path) / name
            if source.is_file():
                shutil.copyfile(source, target / name)
        return dataclasses.replace(config, base_path=BASE_DIR)

    def config_from_dict(self, data: dict[str, Any], base_dir: Path | None = None) -> WallXConfig:
        config = WallXConfig.from_dict(data)
        if base_dir is not None and not Path(config.base_path).is_absolute():
            config = dataclasses.replace(config, base_path=str(Path(base_dir) / config.base_path))
        return config

    def read_foreign(self, path: Path, options: dict[str, Any] | None = None) -> PolicyFiles | None:
        """A LeRobot `wall_x` `pretrained_model/` directory, or None if `path` is not one.
        `options`: `base` (the base checkpoint's directory or cached name) when the config's
        `pretrained_name_or_path` does not resolve from here."""
        path = Path(path)
        if not is_lerobot_dir(path):
            return None
        data = json.loads((path / CONFIG).read_text())
        if data.get("type") != self.name:
            return None
        options = dict(options or {})
        unknown = sorted(set(options) - {"base"})
        if unknown:
            raise ValueError(f"policy.load options {unknown} are unknown; wall_x takes base")
        name = options.get("base") or data.get("pretrained_name_or_path") or WALL_OSS_FLOW
        key = (
            "policy.load(..., base=DIR)"
            if "base" in options
            else f"{path / CONFIG}: pretrained_name_or_path"
        )
        base_dir = lerobot_io.resolve_base(name, key, path)
        config = WallXConfig(
            **lerobot_io.config_from_lerobot(data, path, base_dir, load_tokenizer(base_dir))
        )
        normalizer = normalizer_from_stats(
            read_stats(path), config.norm_map, str(path / POST_STATS)
        )
        with torch.device("meta"):
            skeleton = WallXModel(config)
        theirs = load_file(str(path / WEIGHTS))
        if lerobot_io.LM_HEAD_KEY not in theirs and lerobot_io.EMBED_KEY in theirs:
            theirs[lerobot_io.LM_HEAD_KEY] = theirs[lerobot_io.EMBED_KEY]
        theirs.pop(lerobot_io.EMBED_KEY, None)
        state = rename_lerobot_state(theirs, self.lerobot_key_map(skeleton), path)
        state = {name: tensor.float() for name, tensor in state.items()}
        return PolicyFiles(state, config, self.policy_spec(config), normalizer)

    def write_foreign(
        self,
        fmt: str,
        out_dir: Path,
        state: dict[str, torch.Tensor],
        config: WallXConfig,
        normalizer: Normalizer,
    ) -> Path:
        """LeRobot's `pretrained_model/` layout: what `WallXPolicy.from_pretrained` and
        `make_pre_post_processors(pretrained_path=...)` load, in LeRobot's dtypes (bf16 but the
        norms and the action head). LeRobot builds every policy from its base checkpoint first:
        a base that is a Hugging Face name in the local cache keeps its name; otherwise the base's
        config, processor and tokenizer go to `base/` with these weights in the base's layout,
        and `pretrained_name_or_path` is that directory's absolute path."""
        if fmt != "lerobot":
            raise ValueError(
                f"model type {self.name!r} exports formats {self.foreign_formats}, not {fmt!r}"
            )
        fed = [src for src in config.camera_sources if src]
        if len(set(fed)) < len(fed):
            raise ValueError(
                "the policy feeds several model cameras from one dataset camera "
                f"({dict(zip(config.cameras, config.camera_sources, strict=True))}); LeRobot's "
                "rename map feeds each from its own key: export it as 'raytrain'"
            )
        out_dir = Path(out_dir).expanduser().resolve()
        hub = lerobot_io.cached_hub_name(config.base_name)
        base_name = config.base_name if hub else str(out_dir / BASE_DIR)
        lerobot = lerobot_io.config_to_lerobot(config, base_name)
        stats = self.lerobot_stats(config, normalizer)
        with replacing_directory(out_dir) as staging:
            write_policy_files(
                staging, lerobot_io.lerobot_state(state), lerobot,
                lerobot_io.processor_files(config, lerobot), stats, lerobot_io.PRE_STATS,
            )  # fmt: skip
            if not hub:
                base = staging / BASE_DIR
                base.mkdir()
                for name in lerobot_io.BASE_FILES:
                    shutil.copyfile(Path(config.base_path) / name, base / name)
                weights = {
                    lerobot_io.to_base_key(name): tensor.to(torch.bfloat16).contiguous()
                    for name, tensor in state.items()
                }
                save_file(weights, str(base / WEIGHTS))
        return out_dir


FAMILY = WallXFamily()
