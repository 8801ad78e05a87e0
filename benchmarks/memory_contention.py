"""What a neighbour on the other CPU costs a training step: why a background checkpoint stalls.

`checkpoint_stall.py` found every step that runs beside DCP's checkpoint process 10-25% slower,
though the writer has the other CPU to itself at nice 19. This separates the causes. One rank
(1 thread, the widened flow_vla of `checkpoint_stall.py`, the trainer's worker environment)
times `--steps` steps alone and beside a neighbour process at nice 19 that does one of:

* `compute`: a pure-Python loop (CPU time, no memory traffic);
* `crc32`: zlib's CRC32 over a 256 MB buffer, as the writer checksums what it writes;
* `memcpy`: copies of a 256 MB buffer, as the writer copies staged bytes into the page cache;
* `writer`: the checkpoint writer's own stream (`train.write_behind.WriteBehindStream`: write
  and CRC32 in 256 KB pieces, flush and drop every 64 MB) writing a 256 MB buffer into a file,
  over and over;
* `writer_whole`: the same stream as it was before 2026-12-04, the CRC32 taken over the whole
  256 MB after writing it (a second read of every byte from memory).

The neighbours run in alternating order for `--rounds` rounds; each ratio is the median step
beside it over the median step alone. JSON.

    python benchmarks/memory_contention.py    # 2 rounds, about 3 min (5 neighbours)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch.distributed as dist
import torch.multiprocessing as mp
from checkpoint_stall import batch, training

from raytrain_vla.train.launch import worker_env_vars

NEIGHBOUR = """
import os, sys, tempfile, time, zlib
import numpy as np
from raytrain_vla.train.write_behind import PIECE_BYTES, WriteBehindStream
os.nice(19)  # as DCP's checkpoint process writes
work, seconds = sys.argv[1], float(sys.argv[2])
source = np.random.default_rng(0).integers(0, 255, 256 << 20, dtype=np.uint8)
target = np.empty_like(source)
end = time.monotonic() + seconds
with tempfile.TemporaryDirectory() as directory:
    while time.monotonic() < end:
        if work == "memcpy":
            np.copyto(target, source)
        elif work == "crc32":
            zlib.crc32(source)
        elif work.startswith("writer"):
            piece = source.nbytes if work == "writer_whole" else PIECE_BYTES
            with WriteBehindStream(open(os.path.join(directory, "shard"), "wb"),
                                   piece_bytes=piece) as stream:
                stream.write(memoryview(source))
        else:
            sum(range(100_000))
"""
NEIGHBOURS = ("compute", "crc32", "memcpy", "writer", "writer_whole")


def _rank(_index: int, store: str, args: argparse.Namespace, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    _model, runner = training(args.d_model, args.layers, 1)
    step = 0

    def steps(count: int) -> list[float]:
        nonlocal step
        times = []
        for _ in range(count):
            start = time.perf_counter()
            runner.run(step, [batch(step, 0)])
            times.append(time.perf_counter() - start)
            step += 1
        return times

    steps(2)  # warm-up: AdamW state exists from here on
    times: dict[str, list[float]] = {"alone": [], **{n: [] for n in NEIGHBOURS}}
    for round_index in range(args.rounds):
        order = ["alone", *NEIGHBOURS]
        for kind in order if round_index % 2 == 0 else order[::-1]:
            neighbour = None
            if kind != "alone":
                neighbour = subprocess.Popen([sys.executable, "-c", NEIGHBOUR, kind, "600"])
                time.sleep(1.0)  # its buffers allocated and touched
            try:
                times[kind].extend(steps(args.steps))
            finally:
                if neighbour is not None:
                    neighbour.kill()
                    neighbour.wait()
    Path(out).write_text(json.dumps(times))
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--d-model", type=int, default=768)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--steps", type=int, default=3, help="steps per window")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if args.rounds < 1 or args.steps < 1:
        parser.error("--rounds and --steps must be at least 1")
    with tempfile.TemporaryDirectory() as tmp:
        store, out = os.path.join(tmp, "store"), os.path.join(tmp, "out.json")
        os.environ.update(worker_env_vars(os.environ))  # the rank runs as the trainer's workers
        mp.start_processes(_rank, args=(store, args, out), nprocs=1, start_method="spawn")
        times = json.loads(Path(out).read_text())
    alone = statistics.median(times["alone"])
    report = {
        "cpus": os.cpu_count(),
        "step_s": {kind: round(statistics.median(t), 3) for kind, t in times.items()},
        "over_alone": {n: round(statistics.median(times[n]) / alone, 3) for n in NEIGHBOURS},
        "steps": {kind: [round(x, 3) for x in t] for kind, t in times.items()},
    }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
