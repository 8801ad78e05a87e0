"""Leave a rank that a script spawned (not Ray) without aborting in gloo's threads."""

from __future__ import annotations

import gc
import os
import sys
from typing import NoReturn

import torch.distributed as dist


def exit_rank(wait_for_peers: bool = True) -> NoReturn:
    """Tear the process group down and exit 0, skipping interpreter finalization.

    Ranks aborted in CI and in benchmarks with "terminate called without an active exception"
    after their work was done: gloo's threads outlived the interpreter and met a late
    destructor. So the process group's handles held in reference cycles (FSDP meshes) are
    collected now, the group is destroyed only once every rank is done (`wait_for_peers`;
    false where a peer may have failed and would never arrive), and the process leaves with
    `os._exit`. The caller drops its own references (models, results) first.
    """
    gc.collect()
    if dist.is_initialized():
        if wait_for_peers:
            dist.barrier()
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
