"""What each rank feeds its model: the training stream from the cursor on, and the held-out
batches. Both go through the model family's processor inside the Ray Data read tasks.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import torch

from raytrain_vla.common.spec import DataSpec
from raytrain_vla.config import Config
from raytrain_vla.config.schema import AugmentConfig
from raytrain_vla.data.augment import augment_enabled, augment_images
from raytrain_vla.data.dataset import DatasetView
from raytrain_vla.data.mixture import MixtureView
from raytrain_vla.data.pipeline import iter_rank_batches
from raytrain_vla.data.read_tasks import capped_task_size, rank_read_tasks
from raytrain_vla.models.base import InputProcessor
from raytrain_vla.train.validate import pad_to_ranks


@dataclass
class ReadTransform:
    """Runs in a read task after decoding: task strings, keyed augmentation, the processor.

    Picklable, so Ray Data ships it to CPU nodes; the processor is the very object the exported
    policy uses for one observation.
    """

    processor: InputProcessor
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    seed: int = 0
    action_clip: tuple[float, ...] = ()  # `data.action_clip`: targets clipped before encoding

    def __call__(self, cols: dict[str, np.ndarray], epochs: np.ndarray) -> dict[str, np.ndarray]:
        cols = dict(cols)
        cols.pop("task_index", None)  # the read carries the task strings themselves
        if self.action_clip and "actions" in cols:
            cols["actions"] = np.clip(cols["actions"], *self.action_clip)
        hook = None
        if augment_enabled(self.augment):
            ids = cols["sample_id"]

            def hook(images: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
                return augment_images(images, ids, epochs, self.seed, self.augment)

        return self.processor.encode(cols, hook)


def samples_per_task(cfg: Config, spec: DataSpec, frame_size: tuple[int, int] | None = None) -> int:
    """`data.samples_per_read_task`, lowered so a task's decoded frames stay within
    `data.read_task_max_mb` (whole micro-batches, at least one). Frames count at `frame_size`
    when the task resizes them as it decodes."""
    shapes = spec.camera_shapes.values()
    if frame_size is not None:
        shapes = [(c, *frame_size) for c, _, _ in shapes]
    sample_bytes = sum(c * h * w for c, h, w in shapes)
    return capped_task_size(
        cfg.data.samples_per_read_task, cfg.data.read_task_max_mb, sample_bytes,
        cfg.train.micro_batch_size,
    )  # fmt: skip


def train_stream(
    cfg: Config, view: DatasetView | MixtureView, processor: InputProcessor, start_step: int, rank: int,
    world: int,
) -> Iterator[dict[str, np.ndarray]]:  # fmt: skip
    """This rank's encoded micro-batches from `start_step` on, in plan order."""
    micro = cfg.train.micro_batch_size
    tasks = rank_read_tasks(
        view.plan, start_step, cfg.train.steps, rank, world,
        samples_per_task(cfg, view.spec, processor.frame_size), micro,
        cfg.data.read_tasks_follow_windows,
    )  # fmt: skip
    return iter_rank_batches(
        view.source,
        tasks,
        micro,
        tasks_per_segment=cfg.data.read_tasks_per_segment,
        post=ReadTransform(
            processor, cfg.data.augment, cfg.train.seed, tuple(cfg.data.action_clip)
        ),
        frame_size=processor.frame_size,
    )


def val_batches(
    cfg: Config, view: DatasetView | MixtureView, processor: InputProcessor, rank: int,
    world: int, device: torch.device, val_ids: np.ndarray | None = None,
) -> list[tuple[dict, torch.Tensor]]:  # fmt: skip
    """This rank's share of the held-out samples (`val_ids`, default all of the view's) as
    model batches with per-sample weights (padding weighs zero), decoded once; every
    validation reuses them."""
    micro = cfg.train.micro_batch_size
    ids, weight = pad_to_ranks(view.val_ids if val_ids is None else val_ids, world, micro)
    per_rank = len(ids) // world
    mine = ids[rank * per_rank : (rank + 1) * per_rank]
    w = torch.from_numpy(weight[rank * per_rank : (rank + 1) * per_rank])
    batches = iter_rank_batches(
        view.source, mine, micro, samples_per_task(cfg, view.spec, processor.frame_size),
        post=ReadTransform(processor, action_clip=tuple(cfg.data.action_clip)),
        frame_size=processor.frame_size,
    )  # fmt: skip
    return [
        (processor.collate(cols, device), w[i * micro : (i + 1) * micro])
        for i, cols in enumerate(batches)
    ]
