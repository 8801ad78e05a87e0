"""The family contract, proved for every registered family (a new one joins by registering).

Each test takes the family's tiny instance (`ModelFamily.tiny_options`) on a two-camera dataset
spec and checks one promise the trainer, export and the policy rely on. No Ray.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from _paths import fixtures_root
from torch.distributed.checkpoint import FileSystemReader

from raytrain_vla import policy
from raytrain_vla.common.normalize import Normalizer
from raytrain_vla.common.spec import DataSpec
from raytrain_vla.config import from_tree, load_config, to_dict
from raytrain_vla.config.schema import OptimizerConfig, SchedulerConfig
from raytrain_vla.models.base import ModelFamily
from raytrain_vla.models.registry import family_names, get_family
from raytrain_vla.policy.format import PolicyMeta, write_policy
from raytrain_vla.train.checkpoint import save_checkpoint
from raytrain_vla.train.noise import flow_noise_and_time
from raytrain_vla.train.optim import (
    build_optimizer,
    build_scheduler,
    freeze_for_config,
    resolve_groups,
)
from raytrain_vla.train.train_state import TrainState

CAMERAS = ("observation.images.front", "observation.images.wrist")
SPEC = DataSpec({c: (3, 24, 32) for c in CAMERAS}, state_dim=3, action_dim=2, chunk_size=4)
STATS = {
    feature: {
        "mean": np.full(dim, 0.1), "std": np.full(dim, 0.5), "min": np.full(dim, -1.0),
        "max": np.full(dim, 1.0), "q01": np.full(dim, -0.9), "q99": np.full(dim, 0.9),
    }
    for feature, dim in (("observation.state", 3), ("action", 2))
}  # fmt: skip
TASKS = ["pick up the red cube", "open the drawer", "push the green button to the left", "x"]


@dataclasses.dataclass
class Case:
    """One family's tiny instance on SPEC."""

    family: ModelFamily
    options: object
    config: object
    model: torch.nn.Module
    normalizer: Normalizer


def _options(family: ModelFamily) -> object:
    try:
        return family.tiny_options(None)
    except FileNotFoundError:  # its tiny instance needs the shared fixtures
        return family.tiny_options(fixtures_root())


@pytest.fixture(params=family_names())
def case(request) -> Case:
    family = get_family(request.param)
    options = _options(family)
    config = family.resolve_config(options, SPEC)
    torch.manual_seed(0)
    model = family.build(config)
    with torch.no_grad():  # no weight at an init value that hides a missing input (0 or 1)
        for param in model.parameters():
            param.add_(0.05 * torch.randn_like(param))
    return Case(family, options, config, model, Normalizer.from_stats(STATS, "mean_std"))


def _columns(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Raw dataset columns as a read task has them (uint8 CHW cameras, robot units)."""
    rng = np.random.default_rng(seed)
    cols = {f"image/{c}": rng.integers(0, 256, (n, 3, 24, 32), dtype=np.uint8) for c in CAMERAS}
    pad = np.zeros((n, 4), bool)
    pad[0, 3:] = True
    return {
        **cols,
        "sample_id": np.arange(n) + 100 * seed,
        "state": rng.normal(size=(n, 3)).astype(np.float32),
        "task": np.array([TASKS[i % len(TASKS)] for i in range(n)], dtype=object),
        "actions": rng.normal(size=(n, 4, 2)).astype(np.float32),
        "action_is_pad": pad,
    }


def _batch(case: Case, cols: dict[str, np.ndarray]) -> dict:
    processor = case.family.processor(case.config, case.normalizer)
    return processor.collate(processor.encode(cols), "cpu")


def _rows(cols: dict[str, np.ndarray], i: int) -> dict[str, np.ndarray]:
    return {k: v[i : i + 1] for k, v in cols.items()}


def test_a_sample_s_loss_and_gradient_do_not_depend_on_the_rest_of_its_batch(case):
    """The ground of exactness across world sizes and micro-batch sizes."""
    cols = _columns(4)
    noise, time = flow_noise_and_time(0, 0, cols["sample_id"].tolist(), case.model.noise_shape)
    whole = case.model.compute_loss(_batch(case, cols), noise, time)
    whole[1].backward()
    in_batch = {n: p.grad.clone() for n, p in case.model.named_parameters() if p.grad is not None}
    case.model.zero_grad()
    alone = []
    for i in range(4):
        loss = case.model.compute_loss(
            _batch(case, _rows(cols, i)), noise[i : i + 1], time[i : i + 1]
        )
        if i == 1:
            loss.sum().backward()
        alone.append(loss.detach())
    torch.testing.assert_close(torch.cat(alone), whole.detach(), rtol=1e-5, atol=1e-6)
    assert in_batch, "no parameter received a gradient"
    for name, grad in in_batch.items():
        param = dict(case.model.named_parameters())[name]
        torch.testing.assert_close(param.grad, grad, rtol=1e-4, atol=1e-6, msg=name)


def test_every_parameter_has_exactly_one_role(case):
    """`role_of` names a declared role for every parameter, and no two roles' prefixes claim
    the same names (the first match would win silently)."""
    roles = set(case.family.roles)
    for name, _ in case.model.named_parameters():
        assert case.model.role_of(name) in roles, name
    prefixes = [(r, p) for r, ps in type(case.model).ROLE_PREFIXES.items() for p in ps]
    for role, prefix in prefixes:
        clash = [(r, p) for r, p in prefixes if r != role and p.startswith(prefix)]
        assert not clash, (role, prefix, clash)


def test_fsdp_units_are_disjoint_submodules_holding_most_parameters(case):
    """Every parameter is sharded once: by its unit, or by the root (sharded last)."""
    modules = {id(m) for m in case.model.modules()}
    owner: dict[int, int] = {}
    for index, unit in enumerate(case.model.fsdp_units()):
        assert id(unit) in modules and unit is not case.model
        for param in unit.parameters():
            assert id(param) not in owner, f"a parameter is in units {owner[id(param)]} and {index}"
            owner[id(param)] = index
    total = sum(p.numel() for p in case.model.parameters())
    in_units = sum(p.numel() for p in case.model.parameters() if id(p) in owner)
    assert in_units >= 0.5 * total, (in_units, total)  # the root is not the bulk of the model
    assert case.model.activation_checkpoint_units(), "no module to checkpoint activations of"


def test_the_typed_config_round_trips_through_json(case):
    data = json.loads(json.dumps(case.config.to_dict()))
    assert case.family.config_from_dict(data) == case.config


def test_the_options_round_trip_through_yaml_and_the_command_line(case):
    name = case.family.name
    options = dataclasses.asdict(case.options)
    cfg = load_config(overrides=[f"--model.type={name}", f"--model.{name}={json.dumps(options)}"])
    assert cfg.model.options == case.options and getattr(cfg.model, name) == case.options
    again = from_tree(to_dict(cfg))
    assert again.model.options == case.options and to_dict(again) == to_dict(cfg)


def test_a_meta_build_materialised_with_the_weights_computes_the_same_loss(case):
    with torch.device("meta"):
        meta = case.family.build(case.config)
    assert all(p.is_meta for p in meta.parameters())
    persistent = set(meta.state_dict())
    assert {n for n, _ in meta.named_buffers()} <= persistent, "to_empty cannot fill these"
    meta.to_empty(device="cpu")
    meta.load_state_dict(case.model.state_dict())
    cols = _columns(3, seed=1)
    noise, time = flow_noise_and_time(0, 1, cols["sample_id"].tolist(), case.model.noise_shape)
    batch = _batch(case, cols)
    torch.testing.assert_close(
        meta.compute_loss(batch, noise, time), case.model.compute_loss(batch, noise, time)
    )


def _observation(cols: dict[str, np.ndarray]) -> dict:
    """The same samples as a robot's batched observation, with LeRobot's keys."""
    obs = {c: torch.from_numpy(cols[f"image/{c}"]) for c in CAMERAS}
    return {**obs, "observation.state": torch.from_numpy(cols["state"]), "task": list(cols["task"])}


def test_the_processor_the_model_and_the_exported_policy_give_the_same_actions(case, tmp_path):
    """processor -> collate -> model on the read-task path, then the same inputs through an
    export loaded back with `policy.load`."""
    cols = _columns(3, seed=2)
    noise = torch.randn((3, *case.model.noise_shape), generator=torch.Generator().manual_seed(0))
    processor = case.family.processor(case.config, case.normalizer)
    with torch.no_grad():
        direct = processor.decode_actions(
            case.model.eval().sample_actions(_batch(case, cols), noise)
        )
    assert direct.shape == (3, 4, 2) and torch.isfinite(direct).all()
    meta = PolicyMeta(case.family.name, case.config, SPEC, tuple(TASKS), (0.0, 0.0))
    write_policy(tmp_path / "policy", case.model.state_dict(), meta, case.normalizer)
    loaded = policy.load(tmp_path / "policy")
    # A family whose export carries files (`export_assets`) stores their relative paths instead.
    carries_assets = type(case.family).export_assets is not ModelFamily.export_assets
    assert loaded.meta.model_config == case.config or carries_assets
    exported = loaded.predict_action_chunk(_observation(cols), noise=noise)
    torch.testing.assert_close(exported, direct, rtol=1e-5, atol=1e-6)


def test_a_checkpoint_holds_only_what_trains(case, tmp_path):
    opt_cfg = OptimizerConfig(train_action_expert_only=True)
    frozen = set(freeze_for_config(case.model, opt_cfg))
    trainable = {n for n, p in case.model.named_parameters() if p.requires_grad}
    assert frozen and trainable and not frozen & trainable
    groups = resolve_groups(case.model, dataclasses.replace(opt_cfg, groups=[]))
    optimizer = build_optimizer(case.model, groups, opt_cfg)
    scheduler = build_scheduler(optimizer, 10, SchedulerConfig())
    state = TrainState(
        step=0, epoch=0, sample_in_epoch=0, samples_seen=0, world_size=1, run_name="contract",
        config_hash="-", dataset_fingerprint="-",
    )  # fmt: skip
    meta = PolicyMeta(case.family.name, case.config, SPEC, tuple(TASKS), (0.0, 0.0))
    directory = tmp_path / "checkpoint"
    save_checkpoint(
        directory, case.model, optimizer, scheduler, state, 0, "{}", case.normalizer, meta, frozen
    )
    stored = FileSystemReader(str(directory)).read_metadata().state_dict_metadata
    weights = {k.removeprefix("model.") for k in stored if k.startswith("model.")}
    assert trainable <= weights and not frozen & weights


def test_every_registered_family_is_in_this_suite():
    """The parametrisation is over the registry: the built-ins and the toy family at least."""
    assert {"flow_vla", "smolvla", "toy_mlp"} <= set(family_names())
