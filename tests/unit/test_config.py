"""Config loading: defaults, YAML, overrides, and one-line errors that name the key."""

import subprocess
import sys

import pytest

from raytrain_vla.config import ConfigError, absolute_paths, load_config, parse_cli, recipe_hash


def test_packaged_default_loads():
    cfg = load_config()
    assert cfg.model.type == "flow_vla"
    assert cfg.ray.num_workers == 2
    assert [g.name for g in cfg.optimizer.groups] == ["vision", "backbone", "action_expert"]


def test_yaml_and_overrides_merge(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(
        "train:\n  steps: 7\n  global_batch_size: 96\n  micro_batch_size: 8\nray:\n  num_workers: [1, 4]\n"
    )
    cfg = parse_cli(["--config", str(path), "--train.seed=3", "--scheduler.type", "constant"])
    assert (cfg.train.steps, cfg.train.seed, cfg.scheduler.type) == (7, 3, "constant")
    assert cfg.ray.num_workers == (1, 4)


def test_lr_groups_from_the_command_line():
    cfg = parse_cli(["--optimizer.groups=[{name: v, patterns: ['^vision'], lr: 0.1}]"])
    assert cfg.optimizer.groups[0].name == "v" and cfg.optimizer.groups[0].lr == 0.1


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--train.stepz=3"], "'train.stepz' (did you mean 'train.steps'?)"),
        (["--trian.steps=3"], "'trian'"),
        (["--train.steps=abc"], "'train.steps'"),
        (["--model.flow_vla.size=huge"], "'model.flow_vla.size': 'huge', expected one of"),
        (["--model.size=small"], "'model.size' (it moved to 'model.flow_vla.size')"),
        (["--data.preload=true"], "'data.preload' (it never had an effect"),
        (["--train.precision=fp8"], "'train.precision': 'fp8', expected one of ('fp32', 'bf16')"),
        (["--data.normalization_per_feature={action: x}"], "per_feature.action': 'x', expected"),
        (["--train.global_batch_size=60"], "'train.global_batch_size'"),
        (["--ray.num_workers=[3, 1]"], "'ray.num_workers'"),
        # HSDP: every world size an elastic run may take must be whole shard groups.
        (
            [
                "--ray.num_workers=[2, 4]",
                "--train.dp_shard=2",
                "--train.global_batch_size=48",
                "--train.micro_batch_size=4",
            ],
            "'train.dp_shard': 2 does not divide world size 3 (ray.num_workers=[2, 4])",
        ),
        (
            ["--ray.num_workers=4", "--train.dp_shard=3", "--train.micro_batch_size=16"],
            "does not divide world size 4",
        ),
        (["--train.dp_shard=-1"], "'train.dp_shard': -1, expected 0"),
        (["--train.frozen_params=gather"], "'train.frozen_params': 'gather', expected one of"),
        (["--eval.episodes=-1"], "'eval.episodes'"),
        (["--eval.n_action_steps=9"], "'eval.n_action_steps'"),
        (["--logging.ray_train_log_level=LOUD"], "'logging.ray_train_log_level'"),
        (
            ["--model.type=octo"],
            "'model.type': 'octo', expected one of ('flow_vla', 'smolvla', 'toy_mlp', 'pi0', 'pi05', 'wall_x')",
        ),
        (["--model.smolvla.pad_language_to=short"], "'model.smolvla.pad_language_to': 'short'"),
        (["--model.lora.r=-1"], "'model.lora'"),
        (["--model.lora.dropout=1.5"], "'model.lora'"),
        # Each of these was accepted before, and failed late or trained silently wrong.
        (["--optimizer.lr=-0.001"], "'optimizer.lr': -0.001, expected a learning rate >= 0"),
        (["--optimizer.lr=.nan"], "'optimizer.lr': nan"),
        (["--optimizer.weight_decay=-1"], "'optimizer.weight_decay': -1.0, expected >= 0"),
        (["--optimizer.groups=[{name: v, lr: -0.1}]"], "'optimizer.groups[v].lr': -0.1"),
        (
            ["--optimizer.groups=[{name: v, weight_decay: -0.1}]"],
            "'optimizer.groups[v].weight_decay': -0.1",
        ),
        (["--optimizer.betas=[0.9, 1.5]"], "'optimizer.betas'"),
        (["--scheduler.min_lr_ratio=-0.1"], "'scheduler.min_lr_ratio': -0.1, expected [0, 1]"),
        (["--scheduler.min_lr_ratio=2"], "'scheduler.min_lr_ratio': 2.0"),
        (["--scheduler.warmup_steps=-5"], "'scheduler.warmup_steps': -5"),
        (["--train.grad_clip=-1"], "'train.grad_clip': -1.0, expected >= 0"),
        (["--data.val_fraction=0"], "'data.val_fraction': 0.0, expected (0, 1)"),
        (["--data.span_len=0"], "'data.span_len': 0, expected a positive integer"),
        (["--data.read_tasks_per_segment=-2"], "'data.read_tasks_per_segment': -2"),
        (["--data.val_max_samples=0"], "'data.val_max_samples': 0"),
        (["--ray.num_to_keep=0"], "'ray.num_to_keep': 0"),
        (["--train.max_consecutive_skipped_updates=0"], "'train.max_consecutive_skipped_updates'"),
        (["--ray.run_name=../elsewhere"], "'ray.run_name': '../elsewhere', expected one directory"),
        (["--ray.run_name=a/b"], "'ray.run_name': 'a/b'"),
        (["--ray.run_name=.."], "'ray.run_name': '..'"),
        (["--ray.run_name="], "'ray.run_name': ''"),
        (["--model.flow_vla.vision_strides=[2, 0]"], "'model.flow_vla.vision_strides': [2, 0]"),
        (["--model.flow_vla.keypoints=-1"], "'model.flow_vla.keypoints': -1"),
        (["--model.flow_vla.width=100"], "'model.flow_vla.width': 100, expected 0"),
        (["--model.flow_vla.vision_channels=[64, 64]"], "expected 3 widths, one per stem conv"),
        (
            ["--model.flow_vla.vision_strides=[2,2,2,2]", "--model.flow_vla.vision_channels=[8]"],
            "'model.flow_vla.vision_channels': [8], expected 4 widths",
        ),
    ],
)
def test_bad_keys_and_values_name_the_key(args, fragment):
    with pytest.raises(ConfigError) as err:
        parse_cli(args)
    assert fragment in str(err.value)


def test_unknown_key_in_yaml_names_file_and_key(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("optimizer:\n  lr_groups: []\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: unknown key 'optimizer.lr_groups'"):
        parse_cli(["--config", str(path)])


def test_recipe_hash_ignores_resumable_keys_only():
    base = recipe_hash(load_config())
    assert (
        recipe_hash(
            parse_cli(
                ["--ray.num_workers=4", "--train.micro_batch_size=16", "--train.steps=9"]
                + ["--eval.episodes=3", "--eval.at_validation=true"]
                + ["--logging.ray_train_log_level=INFO"]
            )
        )
        == base
    )
    assert recipe_hash(parse_cli(["--optimizer.lr=0.5"])) != base


def test_ray_train_console_level_reaches_the_trainer():
    from raytrain_vla.run import build_trainer  # builds a TorchTrainer; starts no cluster

    def level(cfg):
        return build_trainer(cfg).run_config.logging_config.log_level

    assert level(load_config()) == "WARNING"
    assert level(parse_cli(["--logging.ray_train_log_level=INFO"])) == "INFO"


def test_workers_get_huge_pages_unless_the_driver_environment_says_otherwise(monkeypatch):
    from raytrain_vla.run import build_trainer
    from raytrain_vla.train.launch import HUGE_PAGES_ENV

    def worker_env(cfg):
        return build_trainer(cfg).run_config.worker_runtime_env["env_vars"]

    monkeypatch.delenv(HUGE_PAGES_ENV, raising=False)
    assert worker_env(load_config()) == {HUGE_PAGES_ENV: "1"}
    monkeypatch.setenv(HUGE_PAGES_ENV, "0")
    assert worker_env(load_config()) == {HUGE_PAGES_ENV: "0"}


def test_cli_exits_2_with_one_line():
    proc = subprocess.run(
        [sys.executable, "-m", "raytrain_vla.run", "--train.stepz=3"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "train.steps" in lines[0]


def test_relative_paths_are_resolved_on_the_driver(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = absolute_paths(parse_cli(["--ray.storage_path=runs", "--data.root=data/x"]))
    assert cfg.ray.storage_path == str(tmp_path / "runs")
    assert cfg.data.root == str(tmp_path / "data" / "x")


def test_uri_storage_is_kept_as_typed():
    assert absolute_paths(parse_cli(["--ray.storage_path=s3://b/runs/"])).ray.storage_path == (
        "s3://b/runs"
    )


@pytest.mark.parametrize(
    "arg, fragment",
    [
        ("--optimizer.freeze_roles=[visoin]", "'optimizer.freeze_roles': 'visoin' is not a"),
        ("--optimizer.groups=[{name: v, roles: [eyes]}]", "'optimizer.groups.v.roles': 'eyes'"),
    ],
)
def test_unknown_parameter_roles_are_refused_before_ray_starts(arg, fragment, capsys):
    from raytrain_vla import run

    assert run.main([arg]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and fragment in err[0] and "roles are ('vision'" in err[0]


def test_values_next_to_the_refused_ones_still_load():
    cfg = parse_cli(
        ["--data.val_fraction=0", "--data.val_episodes=[0, 1]", "--train.grad_clip=0"]
        + ["--scheduler.min_lr_ratio=1", "--ray.run_name=my-run_2"]
    )
    assert cfg.data.val_episodes == [0, 1] and cfg.train.grad_clip == 0.0
    assert cfg.scheduler.min_lr_ratio == 1.0 and cfg.ray.run_name == "my-run_2"


def test_a_bad_value_exits_2_in_one_line_before_anything_is_written(tmp_path, capsys):
    from raytrain_vla import run

    storage = tmp_path / "runs"
    args = [f"--ray.storage_path={storage}", f"--data.root={tmp_path / 'data'}"]
    assert run.main([*args, "--optimizer.lr=-0.01"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'optimizer.lr': -0.01" in err[0]
    assert not storage.exists() and not (tmp_path / "data").exists()


def test_chunk_size_left_unset_is_the_families_default_and_a_set_one_is_kept():
    assert load_config().data.chunk_size == 8
    assert parse_cli(["--model.type=smolvla"]).data.chunk_size == 50
    assert parse_cli(["--model.type=smolvla", "--data.chunk_size=10"]).data.chunk_size == 10
    assert parse_cli(["--data.chunk_size=4"]).data.chunk_size == 4


def test_vlm_path_is_resolved_on_the_driver(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = absolute_paths(parse_cli(["--model.type=smolvla", "--model.smolvla.vlm_path=vlm"]))
    assert cfg.model.smolvla.vlm_path == str(tmp_path / "vlm")


def test_lora_on_a_family_without_it_is_refused_before_ray_starts(capsys):
    from raytrain_vla import run

    assert run.main(["--model.lora.r=8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'model.lora.r': model type 'flow_vla' has no LoRA" in err[0]


def test_a_mapping_value_given_again_replaces_the_whole_mapping(tmp_path):
    """`--ray.resources_per_worker={CPU: 1}` over a file's `{CPU: 8, GPU: 1, trainer: 1}` once
    kept GPU and trainer (the two mappings were merged key by key)."""
    path = tmp_path / "cfg.yaml"
    path.write_text(
        "ray: {use_gpu: true, resources_per_worker: {CPU: 8, GPU: 1, trainer: 1}}\n"
        "data: {normalization_per_feature: {action: quantile}}\n"
    )
    cfg = parse_cli(
        ["--config", str(path), "--ray.use_gpu=false", "--ray.resources_per_worker={CPU: 1}"]
    )
    assert cfg.ray.resources_per_worker == {"CPU": 1}
    assert cfg.data.normalization_per_feature == {"action": "quantile"}  # sections still merge
    cfg = parse_cli(["--config", str(path), "--data.normalization_per_feature={}"])
    assert cfg.data.normalization_per_feature == {}


def test_a_gpu_resource_without_use_gpu_is_refused_before_ray():
    with pytest.raises(ConfigError, match="asks for a GPU but 'ray.use_gpu' is false"):
        parse_cli(["--ray.resources_per_worker={CPU: 1, GPU: 1}"])
