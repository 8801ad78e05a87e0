"""Bad datasets fail loudly, naming the file, the episode and the feature; `inspect` lists them all.

Each case copies a small demo dataset (6 episodes in one data file and one video file) and
breaks one thing. Errors are `DatasetError` or `VideoDecodeError` (both ValueError).
"""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raytrain_vla.config.schema import DataConfig
from raytrain_vla.data.__main__ import main
from raytrain_vla.data.dataset import DatasetView
from raytrain_vla.data.demo import write_demo_dataset
from raytrain_vla.data.formats.lerobot import DatasetError, LeRobotMeta
from raytrain_vla.data.formats.lerobot_source import LeRobotSource
from raytrain_vla.data.formats.random_access import open_dataset
from raytrain_vla.data.formats.video import VideoDecodeError, decode_frames, encode_video
from raytrain_vla.data.inspect import find_problems

DATA = "data/chunk-000/file-000.parquet"
VIDEO = "videos/observation.image/chunk-000/file-000.mp4"
FEATURE = "feature 'observation.image'"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    return write_demo_dataset(tmp_path_factory.mktemp("bad") / "demo", 6, 0)


@pytest.fixture
def demo(pristine, tmp_path):
    return shutil.copytree(pristine, tmp_path / "demo")


def _frame_of(root, episode: int) -> int:
    meta = LeRobotMeta.load(root)
    return int(meta.episode_from_index[episode]) + 1


def _rewrite_column(root, name: str, rows: list) -> None:
    path = root / DATA
    table = pq.read_table(path)
    col = pa.array(rows, type=pa.list_(pa.float32()))
    pq.write_table(table.set_column(table.schema.get_field_index(name), name, col), path)


def test_missing_video_file(demo):
    source = LeRobotSource(LeRobotMeta.load(demo), chunk_size=4)
    (demo / VIDEO).unlink()
    missing = rf"{re.escape(VIDEO)}: video file missing; {FEATURE}, episode 0"
    with pytest.raises(DatasetError, match=missing):
        open_dataset(demo)
    with pytest.raises(DatasetError, match=missing):  # the training source, when it opens
        LeRobotSource(LeRobotMeta.load(demo), chunk_size=4)
    with pytest.raises(  # gone after the source opened: the read task names it too
        VideoDecodeError, match=rf"{re.escape(VIDEO)}: video file not found; {FEATURE}, episode 2"
    ):
        source.read(np.array([_frame_of(demo, 2)]))


def test_truncated_video_file(demo):
    data = (demo / VIDEO).read_bytes()
    (demo / VIDEO).write_bytes(data[: len(data) // 2])
    with pytest.raises(VideoDecodeError, match=rf"{re.escape(VIDEO)}: .*{FEATURE}, episode 3$"):
        open_dataset(demo)[_frame_of(demo, 3)]
    source = LeRobotSource(LeRobotMeta.load(demo), chunk_size=4)
    with pytest.raises(VideoDecodeError, match=rf"{re.escape(VIDEO)}: .*{FEATURE}, episode 4$"):
        source.read(np.array([_frame_of(demo, 4)]))


def test_corrupt_parquet_file(demo):
    (demo / DATA).write_bytes(b"PAR1 this is not parquet PAR1")
    for opener in (open_dataset, lambda r: LeRobotSource(LeRobotMeta.load(r), 4)):
        with pytest.raises(
            DatasetError, match=rf"{re.escape(DATA)}: unreadable parquet .*episodes 0-5"
        ):
            opener(demo)


def test_column_shape_disagrees_with_info(demo):
    action = pq.read_table(demo / DATA)["action"].to_pylist()
    episode = pq.read_table(demo / DATA)["episode_index"].to_numpy()
    _rewrite_column(
        demo, "action", [a + [0.0] if e == 3 else a for a, e in zip(action, episode, strict=True)]
    )
    msg = rf"{re.escape(DATA)}: column 'action' has rows of length \[2, 3\], info.json shape is \[2\]; in episode 3"
    with pytest.raises(DatasetError, match=msg):
        open_dataset(demo)
    with pytest.raises(DatasetError, match=msg):
        LeRobotSource(LeRobotMeta.load(demo), chunk_size=4)


def test_unknown_feature_key_requested(demo):
    with pytest.raises(
        DatasetError, match=r"info\.json: delta_timestamps key 'observation.wrist' is not a feature"
    ):
        open_dataset(demo, {"action": [0.0], "observation.wrist": [0.0]})


@pytest.mark.parametrize(
    ("name", "value", "episode"), [("observation.state", np.nan, 4), ("action", np.inf, 1)]
)
def test_non_finite_values(demo, name, value, episode):
    table = pq.read_table(demo / DATA)
    rows = table[name].to_pylist()
    bad_row = int(np.flatnonzero(table["episode_index"].to_numpy() == episode)[2])
    rows[bad_row][1] = value
    _rewrite_column(demo, name, rows)
    msg = rf"{re.escape(DATA)}: column '{re.escape(name)}' contains NaN or inf \(frame row {bad_row}\); in episode {episode}"
    with pytest.raises(DatasetError, match=msg):
        open_dataset(demo)
    with pytest.raises(DatasetError, match=msg):
        LeRobotSource(LeRobotMeta.load(demo), chunk_size=4)


def test_inspect_reports_every_problem(demo, capsys):
    assert main(["inspect", str(demo)]) == 0
    assert capsys.readouterr().out.rstrip().endswith("no problems found")

    rows = pq.read_table(demo / DATA)["action"].to_pylist()
    rows[0][0] = np.nan
    _rewrite_column(demo, "action", rows)
    frames = decode_frames(demo / VIDEO, np.arange(50) / 10)  # 74 frames: episodes 4-5 cut off
    encode_video(demo / VIDEO, frames, 10)
    (demo / "meta/stats.json").unlink()
    problems = find_problems(demo)
    assert len(problems) == 3, problems
    assert re.search(r"column 'action' contains NaN or inf .*; in episode 0", problems[0])
    assert re.search(
        rf"{re.escape(VIDEO)}: video ends at 4.9s, before the last frame of episodes 4-5",
        problems[1],
    )
    assert "stats.json: no statistics" in problems[2]
    with pytest.raises(SystemExit) as exit_info:
        main(["inspect", str(demo)])
    assert exit_info.value.code == 1
    out = capsys.readouterr().out
    assert "episodes: 6  frames: 74" in out and "stats: -" in out
    assert out.rstrip().splitlines()[-4:] == ["3 problem(s):", *(f"  {p}" for p in problems)]


@pytest.mark.parametrize(
    ("feature", "stat", "value", "expected"),
    [
        ("observation.state", "std", [float("nan"), 1.0], "'std' is nan at index 0"),
        ("action", "mean", [0.0, float("inf")], "'mean' is inf at index 1"),
        ("action", "std", [1.0, 1.0, 1.0], "'std' has shape [3], expected [2]"),
    ],
)
def test_unusable_stats_are_refused_when_the_training_view_opens(
    demo, feature, stat, value, expected
):
    """A NaN std made every sample "non-finite", so every sample was dropped and the loss was 0."""
    path = demo / "meta" / "stats.json"
    stats = json.loads(path.read_text())
    stats[feature][stat] = value
    path.write_text(json.dumps(stats))
    with pytest.raises(ValueError) as err:
        DatasetView.open(DataConfig(root=str(demo), val_fraction=0.25), 1, 4)
    message = str(err.value)
    assert message.startswith(f"{path}: '{feature}' statistic {expected}")
    assert "python -m raytrain_vla.data stats ROOT --force" in message


@pytest.mark.parametrize(
    ("template", "value", "expected"),
    [
        ("data_path", "../elsewhere/file-{file_index:03d}.parquet", "outside the dataset root"),
        ("data_path", "/etc/file-{file_index:03d}.parquet", "outside the dataset root"),
        ("video_path", "videos/{video_key.x}/file.mp4", "bad 'video_path'"),
    ],
)
def test_dataset_paths_never_leave_the_root(demo, template, value, expected):
    info_path = demo / "meta" / "info.json"
    info = json.loads(info_path.read_text())
    info[template] = value
    info_path.write_text(json.dumps(info))
    with pytest.raises(DatasetError) as err:
        open_dataset(demo)
    message = str(err.value)
    assert message.startswith(f"{info_path}: ") and repr(value) in message and expected in message


def test_an_image_cell_path_outside_the_root_is_refused(tmp_path):
    from raytrain_vla.data.formats.images import decode_images

    root = tmp_path / "dataset"
    root.mkdir()
    (tmp_path / "secret.png").write_bytes(b"not read")
    cells = [{"bytes": None, "path": "../secret.png"}]
    with pytest.raises(DatasetError, match=r"row 0.*image path.*outside the dataset root"):
        decode_images(cells, "data/file-000.parquet: feature 'observation.image'", [0], root)


def test_the_fingerprint_covers_every_visible_file_the_run_can_read(demo):
    from raytrain_vla.data.formats.lerobot import dataset_fingerprint

    before = dataset_fingerprint(LeRobotMeta.load(demo))
    (demo / ".cache" / "huggingface").mkdir(parents=True)  # `download --local-dir` metadata
    (demo / ".cache" / "huggingface" / "x.lock").write_text("1")
    assert dataset_fingerprint(LeRobotMeta.load(demo)) == before
    (demo / "images").mkdir()  # image files that cells name by path
    (demo / "images" / "frame_000.png").write_bytes(b"png")
    assert dataset_fingerprint(LeRobotMeta.load(demo)) != before


def test_timestamps_out_of_step_with_frame_index_are_refused_at_open(demo):
    """Training decoded such a frame with half-frame tolerance, i.e. a neighbouring frame."""
    table = pq.read_table(demo / DATA)
    times = table["timestamp"].to_numpy().copy()
    row = int(np.flatnonzero(table["episode_index"].to_numpy() == 3)[5])
    times[row] += 0.04  # 0.4 of a frame at 10 fps: still "decodable", but another frame's time
    col = pa.array(times, type=table.schema.field("timestamp").type)
    pq.write_table(
        table.set_column(table.schema.get_field_index("timestamp"), "timestamp", col), demo / DATA
    )
    msg = rf"{re.escape(DATA)}: timestamp .* is not frame_index / fps \(5 / 10.*; in episode 3, frame 5"
    with pytest.raises(DatasetError, match=msg):
        LeRobotSource(LeRobotMeta.load(demo), chunk_size=4)
    with pytest.raises(DatasetError, match=msg):
        open_dataset(demo)
    assert any(re.search(msg, p) for p in find_problems(demo))
