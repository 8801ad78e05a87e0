"""Video I/O for LeRobot-style datasets: encode frames to mp4, decode frames at timestamps.

Decoding is the training hot path, so it reads sequentially: sort the requested timestamps, seek
once (backward to a keyframe), decode forward, and re-seek only across large gaps. Every failure
(missing, truncated or corrupt file, a timestamp with no frame near it) is a `VideoDecodeError`
that names the file, so a bad sample can be reported instead of crashing a worker obscurely.
PyAV is the default backend; torchcodec is used only when asked for and importable.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path

import av
import av.error
import numpy as np
from av.video.reformatter import VideoReformatter

# Settings chosen for small synthetic frames: near-lossless colour, cheap random access
# (a keyframe every GOP frames) and no B-frames, so decode order equals presentation order.
DEFAULT_CODEC = "libx264"
DEFAULT_CRF = 10
DEFAULT_GOP = 2
DEFAULT_PRESET = "veryfast"
PIX_FMT = "yuv420p"
_MIN_RESEEK_S = 1.0  # never re-seek for a gap shorter than this; decoding forward is cheaper


class VideoDecodeError(ValueError):
    """A video could not be read, or has no frame close enough to a requested timestamp."""


def encode_video(
    path: str | os.PathLike,
    frames: np.ndarray,
    fps: int,
    codec: str = DEFAULT_CODEC,
    crf: int | None = DEFAULT_CRF,
    gop: int = DEFAULT_GOP,
    preset: str | int | None = DEFAULT_PRESET,
) -> None:
    """Write (N, H, W, 3) uint8 RGB frames as a yuv420p mp4; frame i is shown at i / fps.

    Written to a temporary sibling then renamed, so readers never see a half-written video.
    """
    frames = np.asarray(frames)
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8:
        raise ValueError(f"frames must be (N, H, W, 3) uint8, got {frames.shape} {frames.dtype}")
    if len(frames) == 0:
        raise ValueError(f"no frames to encode into {path}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.{uuid.uuid4().hex[:8]}.tmp{path.suffix}")
    options = {"g": str(gop), "bf": "0"}
    if crf is not None:
        options["crf"] = str(crf)
    if preset is not None:
        options["preset"] = str(preset)
    try:
        with av.open(str(tmp), "w", format="mp4") as out:
            stream = out.add_stream(codec, rate=fps, options=options)
            stream.width, stream.height = frames.shape[2], frames.shape[1]
            stream.pix_fmt = PIX_FMT
            sws = VideoReformatter()  # reused: a fresh swscale context per frame costs ~1 ms
            for i, img in enumerate(frames):
                rgb = av.VideoFrame.from_ndarray(img, format="rgb24")
                frame = sws.reformat(rgb, format=PIX_FMT)
                frame.pts, frame.time_base = i, Fraction(1, fps)
                out.mux(stream.encode(frame))
            out.mux(stream.encode(None))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def decode_frames(
    path: str | os.PathLike,
    timestamps: Sequence[float],
    tolerance_s: float | None = None,
    backend: str = "pyav",
) -> np.ndarray:
    """Frames (N, H, W, 3) uint8 nearest to `timestamps` (seconds, any order, repeats allowed).

    `tolerance_s` defaults to half a frame period; a timestamp whose nearest frame is further
    away (e.g. past the end of the video) raises VideoDecodeError.
    """
    path = Path(path)
    query = np.asarray(timestamps, dtype=np.float64).reshape(-1)
    if not np.isfinite(query).all():
        raise VideoDecodeError(f"{path}: non-finite timestamp requested")
    if not path.is_file():
        raise VideoDecodeError(f"{path}: video file not found")
    if backend == "torchcodec":
        frames, found, fps = _decode_torchcodec(path, query)
    elif backend == "pyav":
        frames, found, fps = _decode_pyav(path, query)
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


def _decode_pyav(path: Path, query: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """Sequential decode; returns (frames in query order, matched frame times, stream fps)."""
    wanted = np.unique(query)  # sorted, no repeats
    picked: dict[float, tuple[float, np.ndarray]] = {}
    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise VideoDecodeError(f"{path}: no video stream")
            stream = container.streams.video[0]
            rate = stream.average_rate or stream.guessed_rate
            fps = float(rate) if rate else 0.0
            shape = (0, stream.codec_context.height, stream.codec_context.width, 3)
            if wanted.size:
                _scan(container, stream, wanted, picked)
    except VideoDecodeError:
        raise
    except (av.error.FFmpegError, OSError, EOFError) as e:
        raise VideoDecodeError(f"{path}: cannot decode video ({type(e).__name__}: {e})") from e
    if not query.size:
        return np.zeros(shape, np.uint8), np.zeros(0), fps
    missing = [t for t in query if t not in picked]
    if missing:
        raise VideoDecodeError(
            f"{path}: no frame could be decoded near timestamp {missing[0]:.6g}s"
        )
    found = np.array([picked[t][0] for t in query])
    return np.stack([picked[t][1] for t in query]), found, fps


def _scan(container, stream, wanted: np.ndarray, picked: dict) -> None:
    """Decode forward from a seek, pairing each wanted time with its nearest decoded frame."""
    tb = stream.time_base
    sws = VideoReformatter()  # reused across frames: much cheaper than frame.to_ndarray(format=)

    def rgb(frame) -> np.ndarray:
        return sws.reformat(frame, format="rgb24").to_ndarray()

    j, n = 0, len(wanted)
    gop_s, last_key = None, None  # learnt keyframe spacing sets the re-seek distance

    def seek(t: float) -> None:
        container.seek(max(int(t / tb), 0), stream=stream, backward=True, any_frame=False)

    seek(wanted[0])
    progressed = False  # re-seek only after a match, so a seek can never repeat itself forever
    prev = None  # (time, frame) of the last decoded frame before the next wanted time
    while j < n:
        restart = False
        for frame in container.decode(stream):
            if frame.pts is None:
                continue
            t = float(frame.pts * tb)
            if frame.key_frame:
                if last_key is not None and t > last_key:
                    gop_s = t - last_key
                last_key = t
            while j < n and wanted[j] <= t:
                # nearest of the frame before and this one; ties go to the earlier frame
                if prev is not None and wanted[j] - prev[0] <= t - wanted[j]:
                    picked[wanted[j]] = (prev[0], rgb(prev[1]))
                else:
                    picked[wanted[j]] = (t, rgb(frame))
                j += 1
                progressed = True
            if j >= n:
                return
            prev = (t, frame)
            if progressed and wanted[j] - t > max(_MIN_RESEEK_S, 2 * (gop_s or 0.0)):
                seek(wanted[j])
                prev, restart, progressed = None, True, False
                break
        if not restart:  # end of stream: the rest match the last frame (and fail tolerance)
            if prev is not None:
                img = rgb(prev[1])
                for t in wanted[j:]:
                    picked[t] = (prev[0], img)
            return


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
