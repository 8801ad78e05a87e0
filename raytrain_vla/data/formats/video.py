"""Video I/O for LeRobot-style datasets: encode frames to mp4, decode frames at timestamps.

Decoding is the training hot path. A read task asks one (concatenated) file for frames from many
short spans scattered through it, so the decoder plans from the container's frame index (mp4
reads it with the header): each requested timestamp maps to its nearest frame and that frame's
keyframe, and only those keyframe-to-frame runs are decoded, each once and in order; whatever
lies between runs is skipped by a seek, which in an indexed mp4 is nearly free. Decoder and
colour conversion run on one thread, because read tasks already decode in parallel.

Every failure (missing, truncated or corrupt file, a timestamp with no frame near it) is a
`VideoDecodeError` that names the file, so a bad sample can be reported instead of crashing a
worker obscurely. PyAV is the default backend; torchcodec is used only when asked for.
"""

from __future__ import annotations

import os
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path
from typing import NamedTuple

import av
import av.error
import numpy as np
from av.video.reformatter import VideoReformatter

from raytrain_vla.common.image_ops import resize_frames_hwc
from raytrain_vla.common.location import as_path, file_key, is_remote, open_container
from raytrain_vla.common.object_cache import CacheConfig
from raytrain_vla.errors import NotRetriable

# Settings chosen for small synthetic frames: near-lossless colour, cheap random access
# (a keyframe every GOP frames) and no B-frames, so decode order equals presentation order.
DEFAULT_CODEC = "libx264"
DEFAULT_CRF = 10
DEFAULT_GOP = 2
DEFAULT_PRESET = "veryfast"
PIX_FMT = "yuv420p"
_DECODER_THREADS = 1
# swscale's default thread pool (PyAV >= 15 exposes `threads`) costs ~4x the conversion of a
# small frame; older PyAV converts on one thread anyway.
_RGB = {"format": "rgb24"}
if "threads=" in (VideoReformatter.reformat.__doc__ or ""):
    _RGB["threads"] = 1


class VideoDecodeError(NotRetriable, ValueError):
    """A video could not be read, or has no frame close enough to a requested timestamp."""


class VideoEncoder:
    """Frames appended in batches into one yuv420p mp4, for writers that stream episodes; frame i
    is shown at i / fps. Written to a temporary sibling that `close` renames into place, so
    readers never see a half-written video; `abort` (or an exception inside `with`) drops it."""

    def __init__(
        self,
        path: str | os.PathLike,
        fps: int,
        codec: str = DEFAULT_CODEC,
        crf: int | None = DEFAULT_CRF,
        gop: int = DEFAULT_GOP,
        preset: str | int | None = DEFAULT_PRESET,
    ):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = self.path.with_name(
            f".{self.path.stem}.{uuid.uuid4().hex[:8]}.tmp{self.path.suffix}"
        )
        self.fps, self.codec, self.frames = fps, codec, 0
        self._encoded = 0
        self.options = {"g": str(gop), "bf": "0"}
        if crf is not None:
            self.options["crf"] = str(crf)
        if preset is not None:
            self.options["preset"] = str(preset)
        self._out = None
        self._stream = None
        self._sws = VideoReformatter()  # reused: a fresh swscale context per frame costs ~1 ms

    def add(self, frames: np.ndarray) -> None:
        frames = np.asarray(frames)
        if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8:
            raise ValueError(
                f"frames must be (N, H, W, 3) uint8, got {frames.shape} {frames.dtype}"
            )
        if self._out is None:
            self._out = av.open(str(self.tmp), "w", format="mp4")
            self._stream = self._out.add_stream(self.codec, rate=self.fps, options=self.options)
            self._stream.width, self._stream.height = frames.shape[2], frames.shape[1]
            self._stream.pix_fmt = PIX_FMT
        for img in frames:
            rgb = av.VideoFrame.from_ndarray(img, format="rgb24")
            frame = self._sws.reformat(rgb, format=PIX_FMT)
            frame.pts, frame.time_base = self.frames, Fraction(1, self.fps)
            packets = self._stream.encode(frame)
            self._encoded += sum(p.size for p in packets)
            self._out.mux(packets)
            self.frames += 1

    def bytes_written(self) -> int:
        """Encoded bytes so far (the muxer buffers some before they reach the file)."""
        return max(self._encoded, self.tmp.stat().st_size if self.tmp.exists() else 0)

    def close(self) -> None:
        if self._out is None:
            raise ValueError(f"no frames to encode into {self.path}")
        try:
            self._out.mux(self._stream.encode(None))
            self._out.close()
            self._out = None
            os.replace(self.tmp, self.path)
        finally:
            self.abort()

    def abort(self) -> None:
        if self._out is not None:
            self._out.close()
            self._out = None
        self.tmp.unlink(missing_ok=True)

    def __enter__(self) -> VideoEncoder:
        return self

    def __exit__(self, kind, *_exc) -> None:
        self.close() if kind is None else self.abort()


def encode_video(
    path: str | os.PathLike,
    frames: np.ndarray,
    fps: int,
    codec: str = DEFAULT_CODEC,
    crf: int | None = DEFAULT_CRF,
    gop: int = DEFAULT_GOP,
    preset: str | int | None = DEFAULT_PRESET,
) -> None:
    """Write (N, H, W, 3) uint8 RGB frames as a yuv420p mp4 in one go (`VideoEncoder`)."""
    frames = np.asarray(frames)
    if len(frames) == 0:
        raise ValueError(f"no frames to encode into {path}")
    with VideoEncoder(path, fps, codec, crf, gop, preset) as encoder:
        encoder.add(frames)


def decode_frames(
    path: str | os.PathLike,
    timestamps: Sequence[float],
    tolerance_s: float | None = None,
    backend: str = "pyav",
    cache: CacheConfig | None = None,
    size: tuple[int, int] | None = None,
    channels_first: bool = False,
) -> np.ndarray:
    """Frames (N, H, W, 3) uint8 nearest to `timestamps` (seconds, any order, repeats allowed).

    `tolerance_s` defaults to half a frame period; a timestamp whose nearest frame is further
    away (e.g. past the end of the video) raises VideoDecodeError. `cache` keeps a remote file
    on the node's disk (`object_cache`). `size` (H, W) resizes each frame as it is decoded
    (`image_ops.resize_frames_hwc`), so only frames of that size are ever held.
    `channels_first` returns (N, 3, H, W), written as each frame is placed: the model's
    layout without a second pass over the whole array.
    """
    path = as_path(path)
    query = np.asarray(timestamps, dtype=np.float64).reshape(-1)
    if not np.isfinite(query).all():
        raise VideoDecodeError(f"{path}: non-finite timestamp requested")
    if not is_remote(path) and not path.is_file():  # remote: the open below says so
        raise VideoDecodeError(f"{path}: video file not found")
    if backend == "torchcodec":
        frames, found, fps = _decode_torchcodec(path, query)
        frames = resize_frames_hwc(frames, size)
        if channels_first:
            frames = np.ascontiguousarray(frames.transpose(0, 3, 1, 2))
    elif backend == "pyav":
        frames, found, fps = _decode_pyav(path, query, cache, size, channels_first)
    else:
        raise ValueError(f"unknown video backend {backend!r}; expected 'pyav' or 'torchcodec'")
    if tolerance_s is None:
        tolerance_s = 0.5 / fps if fps else 1e-4
    err = np.abs(found - query)
    bad = np.flatnonzero(~(err <= tolerance_s))
    if bad.size:
        i = int(bad[0])
        raise VideoDecodeError(
            f"{path}: no frame within {tolerance_s:.4g}s of timestamp {query[i]:.6g}s "
            f"(nearest decoded frame is at {found[i]:.6g}s)"
        )
    return frames


def _decode_pyav(
    path: Path, query: np.ndarray, cache: CacheConfig | None = None,
    size: tuple[int, int] | None = None, channels_first: bool = False,
) -> tuple[np.ndarray, np.ndarray, float]:  # fmt: skip
    """Index-planned decode; returns (frames in query order, matched frame times, stream fps)."""
    wanted = np.unique(query)  # sorted, no repeats
    try:
        with open_container(path, cache) as container:
            if not container.streams.video:
                raise VideoDecodeError(f"{path}: no video stream")
            stream = container.streams.video[0]
            # One thread: read tasks already decode in parallel, a frame-threaded decoder holds
            # frames back (so every seek decodes past the frame needed), and on small frames
            # dav1d's thread pool costs more than it saves (5,100 vs 3,200 frames/s, 96px AV1).
            stream.codec_context.thread_count = _DECODER_THREADS
            rate = stream.average_rate or stream.guessed_rate
            fps = float(rate) if rate else 0.0
            if not query.size:
                hw = size or (stream.codec_context.height, stream.codec_context.width)
                shape = (0, 3, *hw) if channels_first else (0, *hw, 3)
                return np.zeros(shape, np.uint8), np.zeros(0), fps
            index = _frame_index(container, stream, path, from_packets=False)
            got = _decode_nearest(container, stream, index, wanted, size)
            if got is None and not index.from_packets:
                # the container's index disagrees with its packets (edit lists, truncation):
                # plan again from the packets themselves, which is what the decoder sees
                index = _frame_index(container, stream, path, from_packets=True)
                got = _decode_nearest(container, stream, index, wanted, size)
    except VideoDecodeError:
        raise
    except (av.error.FFmpegError, OSError, EOFError) as e:
        raise VideoDecodeError(f"{path}: cannot decode video ({type(e).__name__}: {e})") from e
    if got is None:
        raise VideoDecodeError(f"{path}: no frame could be decoded near timestamp {wanted[0]:.6g}s")
    found, images = got
    pos = np.searchsorted(wanted, query)
    # One copy from the decoded frames into the output, in its final layout: stacking and then
    # transposing made two more passes over every frame of the task. (swscale's planar gbrp
    # output would give (3, H, W) directly, but FFmpeg's yuv420p -> gbrp path leaves columns
    # past a multiple of 32 unwritten for some widths, 40 among them.)
    h, w, c = images[0].shape
    out = np.empty((len(query), c, h, w) if channels_first else (len(query), h, w, c), np.uint8)
    placed = out.transpose(0, 2, 3, 1) if channels_first else out
    for row, i in enumerate(pos.tolist()):
        placed[row] = images[i]
    return out, found[pos], fps


class _FrameIndex(NamedTuple):
    """Every frame of a stream, in presentation order: where to seek, time, keyframe flag."""

    pts: np.ndarray  # int64, stream time base; what decoded frames carry
    seek_ts: np.ndarray  # int64, the timestamp that seeks land on (the decode time)
    times: np.ndarray  # float64 seconds
    is_key: np.ndarray  # bool
    from_packets: bool


_INDEX_CACHE: OrderedDict[tuple, _FrameIndex] = OrderedDict()
_INDEX_CACHE_SIZE = 256


def _frame_index(container, stream, path: Path, from_packets: bool) -> _FrameIndex:
    """The frame index: mp4's own (free: it is read with the header) or one pass over packets.

    Cached per process by (path, size, mtime): a worker reads the same files task after task.
    """
    cache_key = (*file_key(path), from_packets)
    if cache_key in _INDEX_CACHE:
        _INDEX_CACHE.move_to_end(cache_key)
        return _INDEX_CACHE[cache_key]
    entries = getattr(stream, "index_entries", None) or ()  # PyAV >= 15
    if not from_packets and len(entries) and not stream.codec_context.has_b_frames:
        # without reordering, the index's decode timestamps are the presentation timestamps
        rows = [(e.timestamp, e.timestamp, e.is_keyframe) for e in entries if not e.is_discard]
    else:
        if from_packets:  # a re-plan: the first attempt left the demuxer somewhere mid-file
            container.seek(0, stream=stream, backward=True)
        from_packets = True
        rows = [
            (p.pts, p.pts if p.dts is None else p.dts, p.is_keyframe)
            for p in container.demux(stream)
            if p.pts is not None
        ]
    arr = np.array(rows, dtype=np.int64).reshape(-1, 3)
    arr = arr[np.argsort(arr[:, 0], kind="stable")]
    is_key = arr[:, 2].astype(bool)
    is_key[:1] = True  # decoding has to start somewhere; the first frame is where it can
    tb = stream.time_base
    times = arr[:, 0] * tb.numerator / tb.denominator  # exact rational, rounded once
    index = _FrameIndex(arr[:, 0], arr[:, 1], times, is_key, from_packets)
    _INDEX_CACHE[cache_key] = index
    if len(_INDEX_CACHE) > _INDEX_CACHE_SIZE:
        _INDEX_CACHE.popitem(last=False)
    return index


def _decode_nearest(
    container, stream, index: _FrameIndex, wanted: np.ndarray, size: tuple[int, int] | None = None
) -> tuple[np.ndarray, list[np.ndarray]] | None:
    """(matched times, RGB frames) for sorted `wanted`, or None if the index proved wrong.

    The index names each wanted time's nearest frame (ties go to the earlier one) and the
    keyframe it decodes from. Only those keyframe-to-target runs are decoded: the decoder
    continues forward when the next run starts at or before the next frame anyway, and
    otherwise jumps (a seek in an indexed mp4 costs about as much as reading one packet). So
    a task's scattered spans each cost one sequential decode and nothing between them.
    """
    n = len(index.times)
    if n == 0:
        return None
    times = index.times
    after = np.clip(np.searchsorted(times, wanted, side="left"), 1, max(n - 1, 1))
    if n == 1:
        nearest = np.zeros(len(wanted), np.int64)
    else:
        nearest = np.where(wanted - times[after - 1] <= times[after] - wanted, after - 1, after)
    targets = np.unique(nearest)
    keys = np.flatnonzero(index.is_key)
    key_of = keys[np.searchsorted(keys, targets, side="right") - 1]
    sws = VideoReformatter()  # reused across frames: much cheaper than frame.to_ndarray(format=)
    images: dict[int, np.ndarray] = {}
    frames, pos = None, -1  # the decoder's frame iterator; index of the frame it yielded last
    for target, key in zip(targets.tolist(), key_of.tolist(), strict=True):
        if frames is None or key > pos + 1:
            container.seek(int(index.seek_ts[key]), stream=stream, backward=True, any_frame=False)
            frames = container.decode(stream)
        want_pts = int(index.pts[target])
        for frame in frames:
            if frame.pts is None or frame.pts < want_pts:
                continue
            if frame.pts > want_pts:
                return None  # the target frame was not where the index said
            images[target] = resize_frames_hwc(sws.reformat(frame, **_RGB).to_ndarray(), size)
            break
        else:
            return None  # the stream ended before the target frame
        pos = target
    return times[nearest], [images[t] for t in nearest.tolist()]


def _decode_torchcodec(path: Path, query: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """Optional backend: torchcodec's batched frame lookup, when it is installed."""
    try:
        from torchcodec.decoders import VideoDecoder
    except ImportError as e:
        raise VideoDecodeError(f"{path}: torchcodec backend requested but not importable") from e
    try:
        decoder = VideoDecoder(str(path))
        batch = decoder.get_frames_played_at(seconds=query.tolist())
        fps = float(decoder.metadata.average_fps or 0.0)
    except Exception as e:  # torchcodec raises plain RuntimeError/IndexError
        raise VideoDecodeError(f"{path}: cannot decode video ({type(e).__name__}: {e})") from e
    frames = batch.data.permute(0, 2, 3, 1).contiguous().numpy()
    return frames, batch.pts_seconds.numpy().astype(np.float64), fps
