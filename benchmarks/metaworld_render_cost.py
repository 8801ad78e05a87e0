"""What LeRobot's frames cost in a Meta-World evaluation, and what rendering only at replans
gives back. Prints JSON.

Until issue 44 the env lowered MuJoCo's shadow map to 1024 px (frames up to 75 levels off
LeRobot's) and rendered every step. Now frames come from the model's own 4096 px map (LeRobot's,
to the bit) and a policy's frame is rendered only at the steps where it replans. This times, in
one process and interleaved:
- one frame at each size, per shadow map (`render_s`), in rounds;
- one episode of `--steps` steps (the scripted expert's actions standing in for a policy that
  replans every `--replan` steps): `old` renders every step with the 1024 map, `new` renders
  at replans with the 4096 map (`episode_s`, and `new_over_old`).

    MUJOCO_GL=egl python benchmarks/metaworld_render_cost.py [--task reach-v3] [--size 64]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from raytrain_vla.sim import metaworld_env as mw

SHADOW_MAPS = (4096, 1024)


def with_shadow_map(env: mw.MetaWorldTask, size: int, shadow: int) -> None:
    """A new renderer for `env`: the shadow map's size is read when a GL context is made."""
    import mujoco  # after metaworld_env set MUJOCO_GL

    env.env.model.vis.quality.shadowsize = shadow
    env.renderer.close()
    env.renderer = mujoco.Renderer(env.env.model, size, size)


def time_frames(env: mw.MetaWorldTask, repeats: int) -> float:
    env.render()  # warm the context and the shadow map's texture
    start = time.perf_counter()
    for _ in range(repeats):
        env.render()
    return (time.perf_counter() - start) / repeats


def time_episode(env: mw.MetaWorldTask, seed: int, steps: int, replan: int) -> tuple[float, int]:
    """Seconds for `steps` steps rendering every `replan`-th observation, and the renders."""
    renders = 0
    start = time.perf_counter()
    env.rendering = True
    env.reset(seed)
    renders += 1
    for t in range(1, steps + 1):
        env.rendering = t % replan == 0
        env.step(env.expert_action())
        renders += env.rendering
    return time.perf_counter() - start, renders


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="reach-v3")
    parser.add_argument("--size", type=int, default=64, help="the policy's frame size (px)")
    parser.add_argument("--sizes", default="64,128,480", help="frame sizes to time")
    parser.add_argument("--replan", type=int, default=8, help="a policy's n_action_steps")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=20, help="frames timed per size and round")
    args = parser.parse_args()
    if min(args.replan, args.steps, args.rounds, args.repeats) < 1:
        raise SystemExit("--replan, --steps, --rounds and --repeats must be at least 1")
    sizes = [int(s) for s in args.sizes.split(",")]

    frames: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for size in sizes:
            env = mw.MetaWorldTask(args.task, image_size=size)
            for shadow in SHADOW_MAPS:
                with_shadow_map(env, size, shadow)
                env.reset(1000)
                frames.setdefault(f"{size}px_shadow{shadow}", []).append(
                    time_frames(env, args.repeats)
                )
            env.close()

    episodes: dict[str, list[float]] = {"old": [], "new": []}
    renders: dict[str, int] = {}
    for r in range(args.rounds):
        for name in ("old", "new") if r % 2 == 0 else ("new", "old"):
            env = mw.MetaWorldTask(args.task, image_size=args.size)
            if name == "old":
                with_shadow_map(env, args.size, 1024)
            env.reset(1000)
            env.render()  # warm-up outside the timing
            seconds, count = time_episode(
                env, 1000, args.steps, 1 if name == "old" else args.replan
            )
            episodes[name].append(seconds)
            renders[name] = count
            env.close()
    median = {k: statistics.median(v) for k, v in episodes.items()}
    print(
        json.dumps(
            {
                "task": args.task,
                "render_s": {k: statistics.median(v) for k, v in frames.items()},
                "shadow4096_over_1024": {
                    f"{s}px": statistics.median(frames[f"{s}px_shadow4096"])
                    / statistics.median(frames[f"{s}px_shadow1024"])
                    for s in sizes
                },
                "episode": {
                    "size": args.size,
                    "steps": args.steps,
                    "replan": args.replan,
                    "old_every_step_shadow1024_s": median["old"],
                    "new_at_replans_shadow4096_s": median["new"],
                    "renders": renders,
                    "new_over_old": median["new"] / median["old"],
                    "rounds": episodes,
                },
            }  # fmt: skip
        )
    )


if __name__ == "__main__":
    main()
