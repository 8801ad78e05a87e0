"""The function Ray Train's TorchTrainer runs on every rank, and the one place `train/` meets
Ray Train: the rank's context, the latest checkpoint and `ray.train.report`.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import ray.train
import ray.train.torch
import torch

from raytrain_vla.config import from_tree
from raytrain_vla.errors import as_not_retriable
from raytrain_vla.train.checkpoint_scratch import move_into
from raytrain_vla.train.trainer import Trainer


class RayTrainSession:
    """`trainer.Session` over Ray Train's per-worker API."""

    def __init__(self) -> None:
        ctx = ray.train.get_context()
        self.rank, self.world_size = ctx.get_world_rank(), ctx.get_world_size()
        self.local_world_size = ctx.get_local_world_size()
        self.device = ray.train.torch.get_device()

    @contextmanager
    def latest_checkpoint(self) -> Iterator[Path | str | None]:
        checkpoint = ray.train.get_checkpoint()
        if checkpoint is None:
            yield None
            return
        if checkpoint.filesystem.type_name != "local":  # the trainer downloads what it loads
            yield checkpoint.path
            return
        with checkpoint.as_directory() as directory:
            yield Path(directory)

    def report(
        self, metrics: dict, checkpoint_dir: Path | None = None, upload_in_background: bool = False
    ) -> None:
        checkpoint = ray.train.Checkpoint.from_directory(checkpoint_dir) if checkpoint_dir else None
        upload = {"checkpoint_upload_fn": _into_storage} if _TAKES_UPLOAD_FN else {}
        if not upload_in_background:
            ray.train.report(metrics, checkpoint=checkpoint, **upload)
            return
        # Ray moves it into run storage in a thread and registers it once there (in order
        # with the other reports), then deletes the local directory.
        ray.train.report(
            metrics, checkpoint=checkpoint, **upload,
            checkpoint_upload_mode=ray.train.CheckpointUploadMode.ASYNC,
        )  # fmt: skip


# Ray releases before `checkpoint_upload_fn` (within the supported range) copy as they always did.
_TAKES_UPLOAD_FN = "checkpoint_upload_fn" in inspect.signature(ray.train.report).parameters


def _into_storage(checkpoint: ray.train.Checkpoint, name: str) -> ray.train.Checkpoint:
    """Ray Train's upload of a rank's checkpoint directory: a rename into local run storage (the
    directory was assembled on its filesystem), Ray's own copy into an object store."""
    storage = ray.train.get_context().get_storage()
    destination = storage.build_checkpoint_path_from_name(name)
    if storage.storage_filesystem.type_name == "local" and move_into(
        Path(checkpoint.path), Path(destination)
    ):
        return ray.train.Checkpoint(destination, filesystem=storage.storage_filesystem)
    return storage.persist_current_checkpoint(checkpoint, name)


def train_loop_per_worker(config_dict: dict) -> None:
    cfg = from_tree(config_dict, "train loop config")
    _quiet_report_log()
    torch.set_num_threads(max(1, int(cfg.ray.resources_per_worker.get("CPU", 1))))
    try:
        Trainer(cfg, RayTrainSession()).fit()
    except Exception as err:
        reported = as_not_retriable(err)
        if reported is err:
            raise
        raise reported from err


def _quiet_report_log() -> None:
    """Ray logs each report's whole metrics dict at INFO, under a logger named by its file path;
    the console line already says it."""
    try:
        from ray.train.v2._internal.execution import context
    except ImportError:  # another Ray layout: its log lines stay
        return
    logging.getLogger(context.__file__).setLevel(logging.WARNING)
