"""Several datasets as one: the view, source and reads of `data.mixture`.

Each dataset opens as its own `DatasetView` (split, plan, normaliser); the mixture numbers
their samples one after another (`offsets`), draws every global batch by weight
(`MixturePlan`), and reads each dataset's samples of a read task with that dataset's own reader
before putting them in the common layout (`embodiment.py`) in plan order.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import numpy as np

from raytrain_vla.common.normalize import Normalizer
from raytrain_vla.common.spec import DataSpec
from raytrain_vla.config.schema import DataConfig
from raytrain_vla.data.dataset import DatasetView, root_fingerprint
from raytrain_vla.data.embodiment import Embodiment, MixtureLayout, identity_normalizer
from raytrain_vla.data.formats.lerobot import DatasetError
from raytrain_vla.data.mixture_plan import MixturePlan
from raytrain_vla.data.pipeline import SampleRead, SampleSource


def mixture_fingerprint(names: list[str], fingerprints: list[str]) -> str:
    """One fingerprint for the mixture: its datasets' names and fingerprints, in order."""
    blob = json.dumps([[n, f] for n, f in zip(names, fingerprints, strict=True)]).encode()
    return "mix-" + hashlib.sha256(blob).hexdigest()[:16]


def data_fingerprint(cfg: DataConfig) -> str:
    """The fingerprint a run records: the dataset's, or the mixture's."""
    from raytrain_vla.config import dataset_configs

    if not cfg.mixture:
        return root_fingerprint(cfg.root)
    prints = [root_fingerprint(one.root) for one in dataset_configs(cfg)]
    return mixture_fingerprint([e.name for e in cfg.mixture], prints)


def mixture_layout(views: list[DatasetView], names: list[str], cfg: DataConfig) -> MixtureLayout:
    """The largest state and action sizes, every camera (first seen first), one image size."""
    cameras: dict[str, tuple[int, int]] = {}
    for view in views:
        for key, (_, h, w) in view.spec.camera_shapes.items():
            cameras.setdefault(key, (h, w))
    if cfg.image_size:
        hw = (int(cfg.image_size[0]), int(cfg.image_size[1]))
    else:
        sizes = {
            f"{name}:{k}": s[1:]
            for name, v in zip(names, views, strict=True)
            for k, s in v.spec.camera_shapes.items()
        }
        if len(set(sizes.values())) > 1:
            raise DatasetError(
                f"data.mixture: cameras come at different sizes {sizes}; set data.image_size "
                "to the [H, W] the model should see"
            )
        hw = next(iter(sizes.values()))
    return MixtureLayout(
        max(v.spec.state_dim for v in views), max(v.spec.action_dim for v in views),
        tuple(cameras), hw,
    )  # fmt: skip


@dataclass
class MixtureRead:
    """One read task's samples of several datasets: each dataset's own read, then the layout."""

    count: int
    parts: list[tuple[int, np.ndarray, SampleRead]]  # (dataset, positions in the task, read)
    offsets: np.ndarray
    embodiments: list[Embodiment]
    layout: MixtureLayout

    def read(self) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        for d, where, part in self.parts:
            cols = self.embodiments[d].to_layout(part.read(), self.layout)
            cols["sample_id"] = np.asarray(cols["sample_id"], np.int64) + self.offsets[d]
            for key, value in cols.items():
                if key not in out:
                    out[key] = np.empty((self.count, *value.shape[1:]), dtype=value.dtype)
                out[key][where] = value
        return out


class MixtureSource:
    """Global sample ids -> each dataset's source, by the mixture's offsets."""

    def __init__(
        self, sources: list[SampleSource], offsets: np.ndarray, embodiments: list[Embodiment],
        layout: MixtureLayout,
    ):  # fmt: skip
        self.sources = sources
        self.offsets = np.asarray(offsets, np.int64)
        self.embodiments = [e.lean() for e in embodiments]
        self.layout = layout
        self.camera_keys = list(layout.camera_keys)

    def dataset_of(self, ids: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.offsets, np.asarray(ids, np.int64), side="right") - 1

    def reader(
        self, sample_ids: np.ndarray, frame_size: tuple[int, int] | None = None
    ) -> MixtureRead:
        """Each dataset's read of its samples. `frame_size` is passed on when it is the
        layout's image size (the size `to_layout` resizes to): frames are then resized as they
        are decoded and `to_layout`'s resize has nothing left to do."""
        ids = np.asarray(sample_ids, np.int64)
        dataset = self.dataset_of(ids)
        size = frame_size if frame_size and tuple(frame_size) == self.layout.image_hw else None
        parts = []
        for d in np.unique(dataset).tolist():
            where = np.flatnonzero(dataset == d)
            parts.append((d, where, self.sources[d].reader(ids[where] - self.offsets[d], size)))
        return MixtureRead(len(ids), parts, self.offsets, self.embodiments, self.layout)

    def read(self, sample_ids: np.ndarray) -> dict[str, np.ndarray]:
        return self.reader(sample_ids).read()


@dataclass
class MixtureView:
    """What the trainer needs of a mixture, with the attributes of a `DatasetView`."""

    names: list[str]
    views: list[DatasetView]
    source: MixtureSource
    plan: MixturePlan
    val_ids: np.ndarray
    normalizer: Normalizer
    fingerprint: str
    spec: DataSpec
    embodiments: list[Embodiment]
    layout: MixtureLayout

    @classmethod
    def open(cls, cfg: DataConfig, seed: int, global_batch_size: int) -> MixtureView:
        from raytrain_vla.config import dataset_configs

        names = [e.name for e in cfg.mixture]
        # Each dataset's plan only orders its own stream; the mixture makes the batches.
        configs = dataset_configs(cfg)
        views = [DatasetView.open(one, seed, 1) for one in configs]
        sizes = [v.meta.total_frames for v in views]
        offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        plan = MixturePlan(
            [v.plan for v in views], offsets, [e.weight for e in cfg.mixture], seed,
            global_batch_size,
        )  # fmt: skip
        if plan.num_samples < global_batch_size:
            raise DatasetError(
                f"data.mixture: the training splits hold {plan.num_samples} samples, fewer than "
                f"one global batch ({global_batch_size})"
            )
        layout = mixture_layout(views, names, cfg)
        embodiments = [
            Embodiment(
                name,
                d,
                v.spec.state_dim,
                v.spec.action_dim,
                tuple(v.spec.camera_keys),
                v.normalizer,
                tuple(v.mean_action.tolist()),
                tuple(v.tasks),
                one.root,
                v.fingerprint,
            )
            for d, (name, v, one) in enumerate(zip(names, views, configs, strict=True))
        ]
        source = MixtureSource([v.source for v in views], offsets, embodiments, layout)
        val_ids = np.concatenate([v.val_ids + o for v, o in zip(views, offsets, strict=True)])
        spec = DataSpec(
            camera_shapes={k: (3, *layout.image_hw) for k in layout.camera_keys},
            state_dim=layout.state_dim,
            action_dim=layout.action_dim,
            chunk_size=cfg.chunk_size,
            image_size=tuple(cfg.image_size) if cfg.image_size else None,
        )
        fingerprint = mixture_fingerprint(names, [v.fingerprint for v in views])
        return cls(
            names, views, source, plan, val_ids, identity_normalizer(layout), fingerprint, spec,
            embodiments, layout,
        )  # fmt: skip

    @property
    def tasks(self) -> list[str]:
        return list(dict.fromkeys(t for v in self.views for t in v.tasks))

    @property
    def mean_action(self) -> np.ndarray:
        """Model space: each robot's actions are normalised, so their mean is about zero."""
        return np.zeros(self.layout.action_dim, np.float32)

    def val_ids_of(self, d: int) -> np.ndarray:
        return self.views[d].val_ids + self.source.offsets[d]


def open_view(cfg: DataConfig, seed: int, global_batch_size: int) -> DatasetView | MixtureView:
    """The data a run trains on: one dataset, or `data.mixture`."""
    if cfg.mixture:
        return MixtureView.open(cfg, seed, global_batch_size)
    return DatasetView.open(cfg, seed, global_batch_size)
