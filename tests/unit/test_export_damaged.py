"""A damaged training checkpoint is named in one line by `export` and `policy.load`, before DCP
reads it, and nothing is written: a real checkpoint (tiny flow_vla, one process) whose shard is
cut inside the model's bytes."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp

from raytrain_vla import export, policy
from raytrain_vla.common.normalize import Normalizer
from raytrain_vla.common.spec import DataSpec
from raytrain_vla.config import Config, to_yaml
from raytrain_vla.models.flow_vla.config import FlowVLAConfig
from raytrain_vla.models.flow_vla.model import FlowVLA
from raytrain_vla.policy.format import PolicyMeta
from raytrain_vla.train.checkpoint import save_checkpoint
from raytrain_vla.train.manifest import MANIFEST
from raytrain_vla.train.train_state import TrainState

STATS = {
    "observation.state": {"mean": [0.5, 0.5], "std": [0.2, 0.2]},
    "action": {"mean": [0.0, 0.0], "std": [0.03, 0.03]},
}


@pytest.fixture(scope="module")
def sound_checkpoint(tmp_path_factory) -> Path:
    """What a one-worker run writes: DCP shard and metadata, sidecars, RNG, manifest last."""
    config = FlowVLAConfig.from_size("tiny", image_size=(16, 16), num_inference_steps=2)
    spec = DataSpec({"observation.image": (3, 16, 16)}, state_dim=2, action_dim=2, chunk_size=8)
    torch.manual_seed(0)
    model = FlowVLA(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.ConstantLR(optimizer, factor=1.0)
    state = TrainState(
        step=1, epoch=0, sample_in_epoch=4, samples_seen=4, world_size=1, run_name="t",
        config_hash="-", dataset_fingerprint="-",
    )  # fmt: skip
    directory = tmp_path_factory.mktemp("run") / "checkpoint_000000"
    save_checkpoint(
        directory, model, optimizer, scheduler, state, 0, to_yaml(Config()),
        Normalizer.from_stats(STATS, "mean_std"),
        PolicyMeta("flow_vla", config, spec, ("reach the red disc",), (0.0, 0.0)),
    )  # fmt: skip
    assert (directory / MANIFEST).is_file()
    return directory


def _damaged_copy(sound: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A copy whose shard ends halfway through the largest model tensor."""
    checkpoint = tmp_path / sound.name
    shutil.copytree(sound, checkpoint)
    storage = dcp.FileSystemReader(str(checkpoint)).read_metadata().storage_data
    index, info = max(
        ((i, s) for i, s in storage.items() if i.fqn.startswith("model.")),
        key=lambda item: item[1].length,
    )
    shard = checkpoint / info.relative_path
    with open(shard, "r+b") as f:
        f.truncate(info.offset + info.length // 2)
    return checkpoint, shard


def test_a_sound_checkpoint_exports_and_the_export_loads(sound_checkpoint, tmp_path, capsys):
    out = tmp_path / "policy"
    assert export.main([str(sound_checkpoint), str(out)]) == 0
    obs = {"observation.image": np.zeros((16, 16, 3), np.uint8), "state": [0.4, 0.6], "task": "x"}
    assert policy.load(out).predict_action(obs).shape == (8, 2)


def test_export_of_a_truncated_shard_names_it_in_one_line_and_writes_nothing(
    sound_checkpoint, tmp_path, capsys
):
    checkpoint, shard = _damaged_copy(sound_checkpoint, tmp_path)
    out = tmp_path / "policy"
    assert export.main([str(checkpoint), str(out)]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert f"{shard}: " in err[0] and "bytes, the manifest says" in err[0], err[0]
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir()] == [checkpoint.name]  # no staging left over


def test_export_over_an_existing_policy_keeps_it_when_the_checkpoint_is_damaged(
    sound_checkpoint, tmp_path, capsys
):
    out = tmp_path / "policy"
    assert export.main([str(sound_checkpoint), str(out)]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    checkpoint, shard = _damaged_copy(sound_checkpoint, tmp_path / "damaged")
    shard.write_bytes(shard.read_bytes()[:-1] + b"\0" * 2)  # other bytes, and one too many
    assert export.main([str(checkpoint), str(out)]) == 1
    assert str(shard) in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_export_names_a_changed_shard_of_the_right_size(sound_checkpoint, tmp_path, capsys):
    checkpoint = tmp_path / sound_checkpoint.name
    shutil.copytree(sound_checkpoint, checkpoint)
    shard = next(checkpoint.glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert export.main([str(checkpoint), str(tmp_path / "policy")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{shard}: contents differ from the manifest (CRC32)" in err[0]


def test_policy_load_of_a_damaged_checkpoint_names_the_file(sound_checkpoint, tmp_path):
    checkpoint, shard = _damaged_copy(sound_checkpoint, tmp_path)
    with pytest.raises(ValueError, match=f"{shard}: .* bytes, the manifest says"):
        policy.load(checkpoint)


def test_policy_load_of_a_sound_checkpoint_says_to_export_it(sound_checkpoint):
    with pytest.raises(FileNotFoundError, match="a training checkpoint.*raytrain_vla.export"):
        policy.load(sound_checkpoint)


def test_a_checkpoint_without_a_manifest_still_fails_in_one_line(
    sound_checkpoint, tmp_path, capsys
):
    """Checkpoints from before manifests: DCP's own error, in one line naming the checkpoint.
    The model is read in its own key order, so the first record DCP fails on is always the cut
    one (a set's order once made it a record past the end, EOFError, in most processes)."""
    checkpoint, _ = _damaged_copy(sound_checkpoint, tmp_path)
    (checkpoint / MANIFEST).unlink()
    assert export.main([str(checkpoint), str(tmp_path / "policy")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        len(err) == 1
        and f"{checkpoint}: DCP could not read the model from its shards (RuntimeError: "
        "PytorchStreamReader failed reading zip archive"
        in err[0]
    ), err
    assert not (tmp_path / "policy").exists()


def test_a_damaged_checkpoint_in_object_storage_is_named_by_its_uri(
    sound_checkpoint, tmp_path, capsys
):
    """Export and `policy.load` check the downloaded copy but name the object the user gave."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from s3_server import S3Server

    checkpoint, shard = _damaged_copy(sound_checkpoint, tmp_path)
    server = S3Server().start()
    try:
        uri = server.upload(checkpoint, "runs/r/checkpoint_000000")
        out = tmp_path / "policy"
        assert export.main([uri, str(out)]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"{uri}/{shard.name}: " in err[0], err
        assert not out.exists()
        with pytest.raises(ValueError, match=f"{uri}/{shard.name}: .* the manifest says"):
            policy.load(uri)
    finally:
        server.stop()
        # fsspec caches filesystems by their arguments: later tests' servers get a fresh one.
        import s3fs

        s3fs.S3FileSystem.clear_instance_cache()
