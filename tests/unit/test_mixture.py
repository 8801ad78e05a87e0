"""Weighted mixtures: the plan's draw, the common layout, the masks the models honour, configs,
and a mixture policy's `predict_action(embodiment=...)`."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from raytrain_vla.common.features import ACTION_DIM_MASK, EMBODIMENT, IMAGE_MASK
from raytrain_vla.common.normalize import ACTION, STATE
from raytrain_vla.config import ConfigError, absolute_paths, load_config, recipe_hash
from raytrain_vla.data.demo import write_demo_dataset
from raytrain_vla.data.mixture import MixtureView, open_view
from raytrain_vla.data.mixture_plan import MixturePlan, floor_sum
from raytrain_vla.data.plan import SamplePlan

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from robot_data import write_arm_dataset  # noqa: E402

ARM_CAMERAS = {"observation.images.top": (32, 32), "observation.images.wrist": (32, 32)}


def _plans(sizes, seed=0):
    return [
        SamplePlan.from_runs(np.array([0]), np.array([n]), seed, 1, span_len=4, shuffle_window=8)
        for n in sizes
    ]


def _mixture(sizes=(300, 120, 57), weights=(0.6, 0.3, 0.1), seed=3, G=32):
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    return MixturePlan(_plans(sizes), offsets, weights, seed, G)


# -- the plan ----------------------------------------------------------------------------------
def test_floor_sum_matches_the_sum_it_stands_for():
    rng = np.random.default_rng(0)
    for n, m, a, b in rng.integers(0, 60, (400, 4)):
        m = int(m) + 1
        assert floor_sum(int(n), m, int(a), int(b)) == sum((a * i + b) // m for i in range(n))


@pytest.mark.parametrize("weights", [(0.6, 0.3, 0.1), (1, 1, 1), (0.97, 0.02, 0.01)])
@pytest.mark.parametrize("G", [8, 32, 30])
def test_realised_proportions_match_the_weights_within_binomial_error(weights, G):
    plan = _mixture(weights=weights, G=G)
    steps = 400
    drawn = np.stack(
        [np.bincount(plan.global_batch_datasets(k), minlength=3) for k in range(steps)]
    )
    assert (drawn.sum(1) == G).all()
    share = drawn.sum(0) / (steps * G)
    w = np.asarray(weights) / sum(weights)
    sigma = np.sqrt(w * (1 - w) / (steps * G))
    assert np.all(np.abs(share - w) <= 3 * sigma + 1e-12), (share, w)
    # The closed form counts the same samples as the steps themselves.
    assert np.array_equal(plan.samples_before(steps), drawn.sum(0))


def test_the_global_batch_is_the_same_on_any_world_size():
    plan = _mixture()
    for step in (0, 1, 7, 40):
        whole = plan.global_batch(step)
        for world in (2, 4, 8):
            parts = [plan.rank_slice(step, r, world) for r in range(world)]
            assert np.array_equal(np.concatenate(parts), whole)


def test_resuming_at_any_step_continues_the_same_sequence():
    plan = _mixture()
    straight = [ids for ids, _ in plan.iter_rank_work(0, 60, 1, 2)]
    for start in (1, 13, 37):
        resumed = [ids for ids, _ in _mixture().iter_rank_work(start, 60, 1, 2)]
        assert all(np.array_equal(a, b) for a, b in zip(straight[start:], resumed, strict=True))


def test_each_dataset_reads_its_own_epoch_without_repeats_then_the_next():
    sizes = (300, 120, 57)
    plan = _mixture(sizes=sizes)
    batches = [plan.global_batch(k) for k in range(60)]
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    for d, n in enumerate(sizes):

        def mine(steps, d=d):
            ids = np.concatenate(batches[:steps])
            return ids[(ids >= offsets[d]) & (ids < offsets[d + 1])] - offsets[d]

        within = max(k for k in range(61) if plan.samples_before(k)[d] <= n)
        first = mine(within)  # the steps inside d's first epoch: no sample twice
        assert len(first) == len(set(first.tolist())) == plan.samples_before(within)[d]
        covering = min(k for k in range(61) if plan.samples_before(k)[d] >= n)
        assert set(range(n)) <= set(mine(covering).tolist())  # ...and all of it read


def test_resume_at_a_far_step_costs_a_closed_form_not_a_walk():
    plan = _mixture()
    far = 10**12
    counts = plan.samples_before(far)
    assert counts.sum() == far * plan.global_batch_size
    assert np.allclose(counts / counts.sum(), plan.weights, atol=1e-9)
    ids, _ = next(plan.iter_rank_work(far, far + 1, 0, 4))
    assert len(ids) == 8


def test_bad_weights_are_refused():
    with pytest.raises(ValueError, match="positive"):
        _mixture(weights=(1.0, 0.0, 1.0))


# -- configs -----------------------------------------------------------------------------------
def _cfg(*overrides):
    return load_config(None, list(overrides))


def test_mixture_entries_get_names_and_their_roots_may_move_without_changing_the_recipe(tmp_path):
    a = _cfg("--data.mixture=[{root: /data/so100, weight: 2}, {repo_id: me/arm_b, weight: 1}]")
    assert [e.name for e in a.data.mixture] == ["so100", "arm_b"]
    b = _cfg("--data.mixture=[{root: /moved/so100, weight: 2}, {repo_id: me/arm_b, weight: 1}]")
    assert recipe_hash(a) == recipe_hash(b)
    c = _cfg("--data.mixture=[{root: /data/so100, weight: 3}, {repo_id: me/arm_b, weight: 1}]")
    assert recipe_hash(a) != recipe_hash(c)
    resolved = absolute_paths(_cfg(f"--data.mixture=[{{root: {tmp_path}/x}}, {{root: demo}}]"))
    assert resolved.data.mixture[0].root == str(tmp_path / "x")
    assert resolved.data.mixture[1].root.endswith("demo_v1")


@pytest.mark.parametrize(
    "overrides, match",
    [
        (["--data.mixture=[{root: /a/x}, {root: /b/x}]"], "repeat"),
        (["--data.mixture=[{root: /a/x, weight: 0}]"], "weight"),
        (["--data.mixture=[{root: /a/x, repo_id: me/x}]"], "exactly one"),
        (["--data.root=/a/x", "--data.mixture=[{root: /b/y}]"], "both name the data"),
        (["--data.mixture=[{root: /a/x, name: 'a b'}]"], "name"),
    ],
)
def test_bad_mixtures_are_refused_naming_the_entry(overrides, match):
    with pytest.raises(ConfigError, match=match):
        _cfg(*overrides)


# -- the layout ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def mixture_cfg(tmp_path_factory):
    base = tmp_path_factory.mktemp("mix")
    demo = write_demo_dataset(base / "demo", 8, 0)
    arm = write_arm_dataset(base / "arm", lengths=(30, 22, 25, 28), cameras=ARM_CAMERAS)
    return absolute_paths(
        _cfg(
            f"--data.mixture=[{{root: {demo}, weight: 0.7}}, {{root: {arm}, weight: 0.3}}]",
            "--data.val_fraction=0.25",
            "--train.global_batch_size=16",
            "--train.micro_batch_size=8",
            "--model.flow_vla.max_text_len=112",
        )
    )


@pytest.fixture(scope="module")
def view(mixture_cfg) -> MixtureView:
    v = open_view(mixture_cfg.data, 0, 16)
    assert isinstance(v, MixtureView)
    return v


def test_every_sample_has_the_mixtures_layout_with_its_own_normalisation(view):
    demo, arm = view.views
    assert view.layout.state_dim == max(demo.spec.state_dim, arm.spec.state_dim)
    assert view.layout.action_dim == arm.spec.action_dim == 6 > demo.spec.action_dim
    assert set(view.layout.camera_keys) == set(demo.spec.camera_keys) | set(ARM_CAMERAS)
    ids = view.plan.global_batch(0)
    cols = view.source.read(ids)
    assert np.array_equal(cols["sample_id"], ids)
    dataset = view.source.dataset_of(ids)
    assert np.array_equal(cols[EMBODIMENT], dataset)
    for d, one in enumerate(view.views):
        sel = dataset == d
        raw = one.source.read(ids[sel] - view.source.offsets[d])
        s, a = one.spec.state_dim, one.spec.action_dim
        want_state = one.normalizer.normalize(STATE, raw["state"])
        np.testing.assert_allclose(cols["state"][sel][:, :s], want_state, rtol=1e-6)
        assert not cols["state"][sel][:, s:].any()
        want_actions = one.normalizer.normalize(ACTION, raw["actions"])
        np.testing.assert_allclose(cols["actions"][sel][..., :a], want_actions, rtol=1e-6)
        assert not cols["actions"][sel][..., a:].any()
        assert (cols[ACTION_DIM_MASK][sel].sum(1) == a).all()
        for key in view.layout.camera_keys:
            has = key in one.spec.camera_keys
            assert (cols[f"{IMAGE_MASK}{key}"][sel] == has).all()
            if not has:  # a camera the robot lacks: masked off, its pixels zero
                assert not cols[f"image/{key}"][sel].any()
            else:
                assert np.array_equal(cols[f"image/{key}"][sel], raw[f"image/{key}"])


def test_cameras_of_different_sizes_need_data_image_size(tmp_path, mixture_cfg):
    big = write_arm_dataset(
        tmp_path / "big", lengths=(20, 20), cameras={"observation.images.top": (48, 64)}
    )
    demo = mixture_cfg.data.mixture[0].root
    cfg = absolute_paths(
        _cfg(f"--data.mixture=[{{root: {demo}}}, {{root: {big}}}]", "--data.val_fraction=0.3")
    )
    with pytest.raises(ValueError, match="data.image_size"):
        open_view(cfg.data, 0, 8)
    cfg.data.image_size = [32, 32]
    sized = open_view(cfg.data, 0, 8)
    cols = sized.source.read(sized.plan.global_batch(0))
    assert cols["image/observation.images.top"].shape[2:] == (32, 32)


# -- the models honour the masks ---------------------------------------------------------------
def _model_and_batch(view, mixture_cfg):
    from raytrain_vla.models.registry import get_family

    family = get_family("flow_vla")
    config = family.resolve_config(mixture_cfg.model.options, view.spec, "", None)
    torch.manual_seed(0)
    model = family.build(config)
    processor = family.processor(config, view.normalizer)
    cols = view.source.read(view.plan.global_batch(0))
    return model, processor, cols


def test_flow_vla_ignores_missing_cameras_and_learns_no_padded_action_dim(view, mixture_cfg):
    model, processor, cols = _model_and_batch(view, mixture_cfg)
    batch = processor.collate(processor.encode(cols), "cpu")
    noise = torch.randn(len(cols["state"]), *model.noise_shape)
    time = torch.full((len(noise),), 0.5)
    loss = model(batch, noise, time)
    # The pixels of a camera a robot lacks change nothing...
    changed = dict(batch)
    changed["images"] = {
        k: torch.where(batch["image_masks"][k][:, None, None, None], v, torch.rand_like(v))
        for k, v in batch["images"].items()
    }
    torch.testing.assert_close(model(changed, noise, time), loss)
    # ...while those of a camera it has do.
    changed["images"] = {k: torch.rand_like(v) for k, v in batch["images"].items()}
    assert not torch.allclose(model(changed, noise, time), loss)
    # Samples of the 2-dim robot alone give no gradient to the outputs of dims 2..5.
    demo = batch[EMBODIMENT] == 0
    only = {k: v[demo] if torch.is_tensor(v) else v for k, v in batch.items()}
    only["images"] = {k: v[demo] for k, v in batch["images"].items()}
    only["image_masks"] = {k: v[demo] for k, v in batch["image_masks"].items()}
    model.zero_grad()
    model(only, noise[demo], time[demo]).mean().backward()
    grad = model.action_expert.action_out.weight.grad
    a = view.views[0].spec.action_dim
    assert grad[a:].abs().max() == 0 and grad[:a].abs().max() > 0


def test_a_mixture_policy_predicts_for_the_named_robot_in_its_own_units(
    view, mixture_cfg, tmp_path
):
    from raytrain_vla import policy as policy_lib
    from raytrain_vla.policy.format import PolicyMeta, write_policy

    model, processor, _ = _model_and_batch(view, mixture_cfg)
    meta = PolicyMeta(
        "flow_vla", model.config, view.spec, tuple(view.tasks), tuple(view.mean_action.tolist()),
        tuple(view.embodiments), view.layout,
    )  # fmt: skip
    write_policy(tmp_path / "p", model.state_dict(), meta, view.normalizer)
    policy = policy_lib.load(tmp_path / "p")
    assert [e.name for e in policy.meta.embodiments] == view.names
    assert policy.meta.embodiments[1].normalizer.stats  # each robot's statistics travel along
    arm = view.views[1]
    raw = arm.source.read(arm.val_ids[:1])
    obs = {k: raw[f"image/{k}"][0].transpose(1, 2, 0) for k in ARM_CAMERAS}
    obs.update({"observation.state": raw["state"][0], "task": str(raw["task"][0])})
    chunk = policy.predict_action(obs, embodiment="arm")
    assert chunk.shape == (mixture_cfg.data.chunk_size, 6)
    # The same sample through the training layout and the model gives the same actions.
    enc = processor.collate(
        processor.encode(view.source.read(arm.val_ids[:1] + view.source.offsets[1])), "cpu"
    )
    noise = torch.randn(1, *model.noise_shape, generator=torch.Generator().manual_seed(0))
    policy.reset()
    expect = view.embodiments[1].robot_actions(model.eval().sample_actions(enc, noise))[0]
    np.testing.assert_allclose(
        policy.predict_action_chunk(obs, noise=noise, embodiment="arm"),
        expect.numpy(),
        rtol=1e-5,
        atol=1e-5,
    )
    robot = policy.for_embodiment("arm")  # the single-robot calls
    assert (robot.action_dim, robot.state_dim, robot.camera_keys) == (6, 6, list(ARM_CAMERAS))
    np.testing.assert_allclose(
        robot.predict_action_chunk(obs, noise=noise), expect.numpy(), rtol=1e-5, atol=1e-5
    )
    with pytest.raises(ValueError, match="one of"):
        policy.predict_action(obs)
    with pytest.raises(ValueError, match="one of"):
        policy.for_embodiment("nope")
    with pytest.raises(ValueError, match="missing.*observation.image'"):  # the demo's camera
        policy.predict_action(obs, embodiment="demo")


def test_v21_v30_and_shards_mix_and_read_the_same_frames(mixture_cfg, tmp_path):
    """The arm three times: v3.0, its v2.1 copy and shards of it; each
    dataset's samples of a global batch equal the v3.0 reader's for the same frames."""
    from _v21_writer import write_v21_copy

    from raytrain_vla.data.formats.shards import convert_to_shards

    demo, arm = (e.root for e in mixture_cfg.data.mixture)
    v21 = write_v21_copy(Path(arm), tmp_path / "arm_v21", lossless=False)
    shards = tmp_path / "arm_shards"
    convert_to_shards(
        Path(arm), shards, chunk_size=mixture_cfg.data.chunk_size, image_format="raw",
        use_ray=False,
    )  # fmt: skip
    roots = [demo, arm, str(v21), str(shards)]
    entries = ", ".join(f"{{root: {r}, name: d{i}}}" for i, r in enumerate(roots))
    cfg = absolute_paths(
        _cfg(
            f"--data.mixture=[{entries}]",
            "--data.val_fraction=0.25",
            "--train.global_batch_size=32",
            "--train.micro_batch_size=8",
        )
    )
    view = open_view(cfg.data, 0, 32)
    ids = np.concatenate([view.plan.global_batch(k) for k in range(4)])
    cols = view.source.read(ids)
    dataset = view.source.dataset_of(ids)
    assert set(dataset.tolist()) == {0, 1, 2, 3}
    reference = view.views[1].source
    for d in (1, 2, 3):
        sel = dataset == d
        frames = ids[sel] - view.source.offsets[d]
        want = view.source.read(frames + view.source.offsets[1])  # the same frames as v3.0
        for key in ("state", "actions", ACTION_DIM_MASK):  # v2.1's stats are aggregated
            np.testing.assert_allclose(cols[key][sel], want[key], atol=1e-5, err_msg=roots[d])
        for key in ARM_CAMERAS:  # a v2.1 writer re-encodes: pixels differ slightly at edges
            got, ref = cols[f"image/{key}"][sel].astype(int), want[f"image/{key}"].astype(int)
            assert np.abs(got - ref).mean() < (3 if d == 2 else 1e-9), roots[d]
    assert reference.camera_keys == view.views[3].source.camera_keys


def _pinned_mixture() -> MixturePlan:
    rng = np.random.default_rng(5)
    plans, offsets, off = [], [], 0
    for n in (30, 55, 12):
        lengths = rng.integers(20, 90, size=n)
        gaps = rng.integers(0, 30, size=n)
        starts = np.cumsum(lengths + gaps) - lengths
        plans.append(SamplePlan.from_runs(starts, lengths, 4, 1, shuffle_window=128))
        offsets.append(off)
        off += int(starts[-1] + lengths[-1])
    return MixturePlan(plans, offsets, [0.5, 0.3, 0.2], 9, 48)


def test_the_order_of_a_mixture_is_pinned():
    """Ids and per-dataset epochs as the step-by-step mixture first gave them: the batched
    slot order and plan lookups (several steps in one pass) must not move a sample."""
    mix = _pinned_mixture()
    work = list(mix.iter_rank_work(3, 150, 5, 6))
    assert work[0][0][:6].tolist() == [5726, 6509, 352, 4522, 1009, 5802]
    ids, epochs = work[-1]
    assert ids.tolist() == [6054, 4796, 1302, 6081, 1717, 2964, 3386, 4795]
    assert epochs.tolist() == [2, 0, 2, 2, 2, 0, 0, 0]
    assert mix.global_batch_datasets(77)[:12].tolist() == [0, 0, 1, 0, 2, 0, 1, 1, 1, 0, 2, 2]
