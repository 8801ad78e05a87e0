"""Space files: every kind of bad file is refused with the key named; sampled values apply."""

from __future__ import annotations

import textwrap

import pytest

from raytrain_vla import tune as tune_cli
from raytrain_vla.config import load_config
from raytrain_vla.tuning.space import SpaceError, load_space, trial_config

GOOD = """
metric: val_action_mse
mode: min
num_samples: 2
scheduler: {type: asha, grace_period: 10}
params:
  optimizer.groups.vision.lr: {loguniform: [1.0e-5, 1.0e-3]}
  scheduler.type: {choice: [constant, cosine]}
  scheduler.min_lr_ratio: {uniform: [0.0, 0.2], when: {scheduler.type: cosine}}
  scheduler.warmup_steps: {quniform: [0, 100, 25]}
"""


def write(tmp_path, text: str):
    path = tmp_path / "space.yaml"
    path.write_text(textwrap.dedent(text))
    return path


@pytest.fixture(scope="module")
def base():
    return load_config()


def test_shipped_spaces_load(base):
    for name in ("lr_groups", "scheduler", "full", "muon"):
        space = load_space(f"tune_spaces/{name}.yaml", base)
        assert space.params and space.metric == "val_action_mse"
    assert "optimizer.type" in [p.key for p in load_space("tune_spaces/muon.yaml", base).params]


def test_sampled_values_reach_the_config_and_conditions_apply(tmp_path, base):
    space = load_space(write(tmp_path, GOOD), base)
    sampled = {
        "optimizer.groups.vision.lr": 3e-4,
        "scheduler.type": "constant",
        "scheduler.min_lr_ratio": 0.15,
        "scheduler.warmup_steps": 75.0,
    }
    cfg, applied = trial_config(space, base, sampled)
    vision = next(g for g in cfg.optimizer.groups if g.name == "vision")
    assert vision.lr == 3e-4
    assert cfg.scheduler.type == "constant" and cfg.scheduler.warmup_steps == 75
    assert isinstance(cfg.scheduler.warmup_steps, int)
    # min_lr_ratio is only for cosine: with constant it keeps the default.
    assert "scheduler.min_lr_ratio" not in applied and cfg.scheduler.min_lr_ratio == 0.05
    cfg, applied = trial_config(space, base, {**sampled, "scheduler.type": "cosine"})
    assert cfg.scheduler.min_lr_ratio == 0.15 and applied["scheduler.min_lr_ratio"] == 0.15


BAD = [
    ("unknown top-level key", "metric: val_action_mse\nparamz: {}\n", "'paramz'"),
    (
        "unknown config key",
        "params:\n  optimizer.lrr: {uniform: [0.1, 0.2]}\n",
        "'optimizer.lrr' (did you mean 'optimizer.lr'?)",
    ),
    (
        "unknown LR group",
        "params:\n  optimizer.groups.head.lr: {uniform: [0.1, 0.2]}\n",
        "'optimizer.groups.head.lr'",
    ),
    (
        "unknown domain",
        "params:\n  optimizer.lr: {normal: [0.1, 0.2]}\n",
        "unknown key 'params.optimizer.lr.normal' (did you mean 'params.optimizer.lr.uniform'?)",
    ),
    (
        "bounds reversed",
        "params:\n  optimizer.lr: {uniform: [0.2, 0.1]}\n",
        "'params.optimizer.lr.uniform'",
    ),
    (
        "loguniform through zero",
        "params:\n  optimizer.lr: {loguniform: [0.0, 0.1]}\n",
        "'params.optimizer.lr.loguniform'",
    ),
    (
        "wrong argument count",
        "params:\n  optimizer.lr: {quniform: [0.0, 0.1]}\n",
        "'params.optimizer.lr.quniform'",
    ),
    (
        "empty choice",
        "params:\n  scheduler.type: {choice: []}\n",
        "'params.scheduler.type.choice'",
    ),
    (
        "value outside the schema's choices",
        "params:\n  scheduler.type: {choice: [constant, linear]}\n",
        "'scheduler.type'",
    ),
    (
        "string for a number key",
        "params:\n  train.grad_clip: {choice: [fast]}\n",
        "'train.grad_clip'",
    ),
    (
        "budget is not tunable",
        "params:\n  train.steps: {randint: [10, 20]}\n",
        "'params.train.steps' is not tunable",
    ),
    (
        "resources are not tunable",
        "params:\n  ray.num_workers: {choice: [1, 2]}\n",
        "'params.ray.num_workers' is not tunable",
    ),
    (
        "validation split is not tunable",
        "params:\n  data.val_fraction: {uniform: [0.05, 0.1]}\n",
        "'params.data.val_fraction' is not tunable",
    ),
    (
        "bad metric",
        "metric: accuracy\nparams:\n  optimizer.lr: {uniform: [0.1, 0.2]}\n",
        "'metric'",
    ),
    (
        "bad scheduler",
        "scheduler: {type: hyperband}\nparams:\n  optimizer.lr: {uniform: [0.1, 0.2]}\n",
        "'scheduler.type'",
    ),
    (
        "unknown scheduler parameter",
        "scheduler: {type: asha, grace: 3}\nparams:\n  optimizer.lr: {uniform: [0.1, 0.2]}\n",
        "'scheduler.grace'",
    ),
    (
        "grid with optuna",
        "search: {algorithm: optuna}\nparams:\n  optimizer.lr: {grid: [0.1, 0.2]}\n",
        "'params.optimizer.lr'",
    ),
    (
        "condition on an unknown key",
        "params:\n  optimizer.lr: {uniform: [0.1, 0.2], when: {scheduler.kind: cosine}}\n",
        "'scheduler.kind'",
    ),
    (
        "fixed key unknown",
        "fixed: {train.stepz: 3}\nparams:\n  optimizer.lr: {uniform: [0.1, 0.2]}\n",
        "'train.stepz'",
    ),
    (
        "no params",
        "metric: val_action_mse\n",
        "'params'",
    ),
    (
        "zero trials",
        "num_samples: 0\nparams:\n  optimizer.lr: {uniform: [0.1, 0.2]}\n",
        "'num_samples'",
    ),
    ("not YAML", "params: [\n", "not valid YAML"),
]


# Values and combinations a space can sample, not only its end points, and spec types.
RANGE_BAD = [
    (
        "a range that reaches negative learning rates",
        "params:\n  optimizer.lr: {uniform: [-0.01, 0.01]}\n",
        "optimizer.lr=-0.01",
    ),
    (
        "an interior integer that breaks the batch layout",
        # 64 and 128 divide by 2 workers x 32; 65..127 mostly do not
        "params:\n  train.global_batch_size: {randint: [64, 129]}\n",
        "train.global_batch_size=65",
    ),
    (
        "a combination that freezes every role",
        "params:\n  optimizer.train_action_expert_only: {choice: [false, true]}\n"
        "  optimizer.freeze_roles: {choice: [[], [action_expert]]}\n",
        "optimizer.train_action_expert_only=True, optimizer.freeze_roles=['action_expert']",
    ),
    (
        "a scheduler spec with a string for a number",
        "scheduler: {type: asha, reduction_factor: '2'}\nparams:\n  optimizer.lr: {uniform: [0.1, 0.2]}\n",
        "'scheduler.reduction_factor'",
    ),
    (
        "a scheduler spec with a float for a count",
        "scheduler: {type: median, min_samples_required: 2.5}\n"
        "params:\n  optimizer.lr: {uniform: [0.1, 0.2]}\n",
        "'scheduler.min_samples_required'",
    ),
    (
        "a search seed that is not an integer",
        "search: {seed: abc}\nparams:\n  optimizer.lr: {uniform: [0.1, 0.2]}\n",
        "'search.seed'",
    ),
]


# The file's own schema: every section typed, unknown keys with the nearest one of their section,
# YAML values taken as written (no '2' for a number), and the rules a type cannot express. A line
# is `what the file says -> what its one-line error says`; a file without params searches LR.
LR = "params:\n  optimizer.lr: {uniform: [0.1, 0.2]}\n"
SCHEMA_BAD_LINES = """
search: {algo: optuna} -> 'search.algo' (did you mean 'search.algorithm'?)
resources: {num_worker: 2} -> 'resources.num_worker' (did you mean 'resources.num_workers'?)
search: {algorithm: bayes} -> 'search.algorithm': 'bayes', expected one of ('random', 'optuna')
mode: best -> 'mode': 'best', expected one of ('min', 'max')
scheduler: asha -> 'scheduler': 'asha', expected a mapping
fixed: [train.steps] -> 'fixed': ['train.steps'], expected a mapping
params: {optimizer.lr: [0.1, 0.2]} -> 'params.optimizer.lr': [0.1, 0.2], expected a mapping
params: {optimizer.lr: {uniform: [0.1, 0.2], when: [x]}} -> 'params.optimizer.lr.when'
params: {optimizer.lr: {uniform: [0.1, 0.2], choice: [0.1]}} -> 'params.optimizer.lr': {'uniform'
params: {optimizer.lr: {when: {scheduler.type: cosine}}} -> 'params.optimizer.lr': {'when'
scheduler: {type: asha, grace_period: true} -> 'scheduler.grace_period': True, expected an integer
num_samples: '2' -> 'num_samples': '2', expected an integer
search: {seed: '3'} -> 'search.seed': '3', expected an integer
params: {optimizer.lr: {uniform: [.nan, 0.2]}} -> 'params.optimizer.lr.uniform.0': nan
params: {scheduler.warmup_steps: {randint: [0, 2.5]}} -> 'params.scheduler.warmup_steps.randint.1'
params: {scheduler.warmup_steps: {randint: [5, 0]}} -> 'params.scheduler.warmup_steps.randint'
params: {optimizer.lr: {quniform: [0.1, 0.2, 0]}} -> 'params.optimizer.lr.quniform': [0.1, 0.2, 0]
scheduler: {reduction_factor: 1} -> 'scheduler.reduction_factor': 1, expected a number > 1
scheduler: {type: asha, grace_period: -1} -> 'scheduler.grace_period': -1
scheduler: {type: median, min_samples_required: 0} -> 'scheduler.min_samples_required': 0
max_concurrent_trials: 0 -> 'max_concurrent_trials': 0, expected a positive integer
resources: {use_gpu: maybe} -> 'resources.use_gpu'
"""


def _schema_case(line: str) -> tuple[str, str, str]:
    text, needle = line.split(" -> ")
    return text, (text if text.startswith("params") else f"{text}\n{LR}"), needle


SCHEMA_BAD = [_schema_case(line) for line in SCHEMA_BAD_LINES.strip().splitlines()]
CASES = BAD + RANGE_BAD + SCHEMA_BAD


@pytest.mark.parametrize("text,needle", [b[1:] for b in CASES], ids=[b[0] for b in CASES])
def test_bad_space_is_refused_with_the_key_named(tmp_path, base, text, needle):
    with pytest.raises(SpaceError) as err:
        load_space(write(tmp_path, text), base)
    message = str(err.value)
    assert needle in message and str(tmp_path / "space.yaml") in message
    assert "\n" not in message


def test_a_minimal_space_takes_the_documented_defaults(tmp_path, base):
    space = load_space(write(tmp_path, "fixed:\nresources:\n" + LR), base)
    assert (space.metric, space.mode) == ("val_action_mse", "min")
    assert space.num_samples == space.max_concurrent_trials == 1
    assert space.scheduler.type == "none" and (space.algorithm, space.seed) == ("random", None)
    assert space.fixed == {} and space.resources == {}
    assert [(p.key, p.domain, p.args, p.when) for p in space.params] == [
        ("optimizer.lr", "uniform", (0.1, 0.2), {})
    ]


def test_resources_and_conditions_keep_what_the_file_wrote(tmp_path, base):
    text = (
        "resources: {num_workers: [1, 2], use_gpu: false}\n"
        "scheduler: {grace_period: 10}\n"
        "search: {algorithm: optuna, seed: 3}\n"
        "params:\n"
        "  scheduler.type: {choice: [constant, cosine]}\n"
        "  scheduler.min_lr_ratio: {uniform: [0, 1], when: {scheduler.type: [cosine]}}\n"
        "  scheduler.warmup_steps: {quniform: [0, 100, 25], when: {scheduler.type: cosine}}\n"
    )
    space = load_space(write(tmp_path, text), base)
    assert space.resources == {"num_workers": [1, 2], "use_gpu": False}
    assert space.scheduler.type == "asha" and space.scheduler.grace_period == 10
    assert (space.algorithm, space.seed) == ("optuna", 3)
    params = {p.key: p for p in space.params}
    assert params["scheduler.min_lr_ratio"].args == (0, 1)  # as written: ints stay ints
    assert params["scheduler.warmup_steps"].when == {"scheduler.type": ("cosine",)}
    assert params["scheduler.min_lr_ratio"].when == {"scheduler.type": ("cosine",)}


def test_cli_refuses_a_bad_space_in_one_line_before_anything_runs(tmp_path, capsys):
    space = write(tmp_path, "params:\n  train.steps: {randint: [10, 20]}\n")
    code = tune_cli.main(["--space", str(space), f"--ray.storage_path={tmp_path / 'sweeps'}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "'params.train.steps' is not tunable" in err[0]
    assert not (tmp_path / "sweeps").exists()


def test_large_spaces_are_checked_pairwise_in_bounded_time(tmp_path, base):
    """Past MAX_COMBINATIONS the check falls back to single values and pairs; a bad pair is
    still found."""
    text = (
        "params:\n"
        "  optimizer.lr: {loguniform: [1.0e-5, 1.0e-3]}\n"
        "  optimizer.weight_decay: {uniform: [0.0, 0.1]}\n"
        "  scheduler.warmup_steps: {randint: [0, 200]}\n"
        "  optimizer.train_action_expert_only: {choice: [false, true]}\n"
        "  optimizer.freeze_roles: {choice: [[], [vision], [action_expert]]}\n"
    )
    with pytest.raises(SpaceError, match="freezes every role"):
        load_space(write(tmp_path, text), base)


def test_no_best_config_is_recommended_from_errored_trials(tmp_path, base):
    from raytrain_vla.tuning.sweep import best_row

    space = load_space(write(tmp_path, GOOD), base)
    nan = float("nan")
    rows = [
        {"trial_id": "a", "val_action_mse": 0.1, "error": "RayTaskError"},  # reported, then died
        {"trial_id": "b", "val_action_mse": nan, "error": "TrainingFailedError"},
    ]
    assert best_row(rows, space) is None
    rows.append({"trial_id": "c", "val_action_mse": 0.3, "error": ""})
    assert best_row(rows, space)["trial_id"] == "c"


def test_the_listed_domains_are_the_domain_spec_fields():
    import dataclasses

    from raytrain_vla.tuning.space_file import DOMAINS, DomainSpec

    assert (*DOMAINS, "when") == tuple(f.name for f in dataclasses.fields(DomainSpec))
