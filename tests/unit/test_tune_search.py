"""The Optuna search path over a real space: seeded, restorable, and every suggestion trains.

No cluster: the searcher is driven the way Tune drives it (set_search_properties, suggest,
on_trial_complete, save/restore), which is also what a restarted sweep driver relies on.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from raytrain_vla.config import load_config
from raytrain_vla.tuning.space import load_space, trial_config
from raytrain_vla.tuning.sweep import _search, param_space

SHIPPED = Path(__file__).resolve().parents[2] / "tune_spaces" / "full.yaml"


@pytest.fixture(scope="module")
def base():
    return load_config()


def optuna_space(tmp_path: Path, base, seed: int):
    text = SHIPPED.read_text().replace("algorithm: random", "algorithm: optuna")
    text = text.replace("seed: 0", f"seed: {seed}")
    path = tmp_path / f"full_optuna_{seed}.yaml"
    path.write_text(text)
    return load_space(path, base)


def searcher(space):
    alg = _search(space)
    assert alg.set_search_properties(space.metric, space.mode, param_space(space))
    return alg


def test_optuna_suggestions_are_seeded_in_domain_and_build_trial_configs(tmp_path, base):
    space = optuna_space(tmp_path, base, seed=0)
    first, again = searcher(space), searcher(space)
    other = searcher(optuna_space(tmp_path, base, seed=1))
    suggestions = [first.suggest(f"t{i}") for i in range(4)]
    assert suggestions == [again.suggest(f"t{i}") for i in range(4)]
    assert suggestions[0] != other.suggest("t0")

    domains = {p.key: p for p in space.params}
    for i, sampled in enumerate(suggestions):
        assert set(sampled) == set(domains)
        for key, value in sampled.items():
            p = domains[key]
            if p.domain in ("loguniform", "uniform", "quniform"):
                assert p.args[0] <= value <= p.args[1], key
            if p.domain == "choice":
                assert value in p.args, key
        cfg, applied = trial_config(space, base, sampled)
        lrs = {g.name: g.lr for g in cfg.optimizer.groups}
        assert lrs["vision"] == sampled["optimizer.groups.vision.lr"]
        assert lrs["action_expert"] == sampled["optimizer.groups.action_expert.lr"]
        assert isinstance(cfg.scheduler.warmup_steps, int)  # quniform's float made an int
        assert ("scheduler.min_lr_ratio" in applied) == (sampled["scheduler.type"] == "cosine")
        first.on_trial_complete(f"t{i}", {space.metric: 1.0 / (i + 1), "step": 10})


def test_a_restored_optuna_searcher_continues_the_same_sequence(tmp_path, base):
    space = optuna_space(tmp_path, base, seed=0)
    running = searcher(space)
    for i in range(3):
        running.suggest(f"t{i}")
        running.on_trial_complete(f"t{i}", {space.metric: float(i), "step": 10})
    running.save(str(tmp_path / "searcher.pkl"))
    restored = searcher(space)
    restored.restore(str(tmp_path / "searcher.pkl"))
    assert restored.suggest("t3") == running.suggest("t3")
