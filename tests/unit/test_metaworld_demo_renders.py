"""The expert's demos render only the episodes they keep: a failure is found by physics alone
(its 500 frames were a fifth of MT10's demo time), and a kept episode renders each of its
frames once. Needs MuJoCo (the dev extra), no Ray."""

from __future__ import annotations

import numpy as np

from raytrain_vla.data import metaworld_demos
from raytrain_vla.sim import metaworld_env as mw


def counting_renders(monkeypatch) -> list[int]:
    """Counts every frame any `MetaWorldTask` renders."""
    renders: list[int] = []
    real = mw.MetaWorldTask.render

    def render(self):
        frame = real(self)
        renders.append(frame is not None)
        return frame

    monkeypatch.setattr(mw.MetaWorldTask, "render", render)
    return renders


def test_episodes_the_expert_fails_render_no_frame(monkeypatch):
    renders = counting_renders(monkeypatch)
    # No expert reaches within 3 steps: both attempts fail, and nothing is kept.
    *episodes, summary = metaworld_demos.roll_out_task("reach-v3", 1, 16, 0, 3, 2)
    assert episodes == [] and summary.episodes == 0 and summary.attempts == 2
    assert sum(renders) == 0


def test_a_kept_episode_renders_each_frame_once_and_is_the_rendered_run(monkeypatch):
    renders = counting_renders(monkeypatch)
    (episode, summary) = metaworld_demos.roll_out_task("reach-v3", 1, 16, 0, 500, 1)
    frames = episode.cameras[mw.IMAGE_KEY]
    assert summary.episodes == 1 and len(frames) == len(episode.state)
    assert sum(renders) == len(frames) + 1  # and the final observation, which no action follows
    env = mw.MetaWorldTask("reach-v3", image_size=16)
    try:  # the same seed, rendered every step from the start: the same episode
        step, states = env.reset(summary.seeds[0]), []
        while not step.done:
            states.append(step.state)
            step = env.step(env.expert_action())
        assert step.success
        np.testing.assert_array_equal(np.stack(states), episode.state)
    finally:
        env.close()
