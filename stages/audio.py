"""Decode a media file's default audio stream to 16 kHz mono float32 with PyAV.

With ``channels`` other than "mix" (``PIPELINE_CHANNELS``), a source of several channels is also decoded
channel by channel: :func:`measure_channels` measures how alike they are and :func:`decide_channels` says
which become tracks of their own (one ``.npy`` sidecar each, beside the mix's; docs/channels.md).

Decoding reads the one file it was given: FFmpeg is told to use only the ``file``
protocol and only the container formats in :data:`FORMATS`, so a playlist (HLS),
a concat list or an image sequence that points at other files or at URLs is
refused as "not a media file" without anything it names being opened. URL inputs
reach this stage only as files the parent has fetched.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from contracts import AudioArtifact, DiskFullError, InputError, SourceVersion, StageRequest, WorkItem
from contracts.artifacts import LISTEN_COPY, ChannelMeasure, ChannelTrack
from contracts.stage_settings import AudioSettings
from stages.runtime.base import Stage, save_array

log = logging.getLogger(__name__)

SAMPLE_RATE = 16000
MEDIA_HINT = (".mp4", ".mkv", ".wav", ".mp3")

#: FFmpeg demuxers the stage opens (``format_whitelist``): audio and video containers that hold
#: their own media. Not here on purpose: hls, concat, image2 and other formats that name other files.
FORMATS = ",".join(
    (
        "mov,mp4,m4a,3gp,3g2,mj2",
        "matroska,webm",
        "wav",
        "w64",
        "aiff",
        "caf",
        "mp3",
        "aac",
        "ac3",
        "eac3",
        "flac",
        "ogg",
        "wv",
        "ape",
        "tta",
        "amr",
        "avi",
        "asf",
        "flv",
        "mpegts",
        "mpeg",
        "mxf",
        "nut",
        "dts",
    )
)
#: how FFmpeg opens inputs: local files only, no network or nested protocols
OPEN_OPTIONS = {"protocol_whitelist": "file", "format_whitelist": FORMATS}


class AudioStage(Stage):
    name = "audio"
    input = None
    input_key = "source"
    output = AudioArtifact
    settings_model = AudioSettings

    def import_libraries(self) -> None:
        global av, np
        import av
        import numpy as np

    def process(self, item: WorkItem, upstream, request: StageRequest) -> AudioArtifact:
        source = Path(upstream)
        size = check_readable(source)
        mode = self.settings.channels
        with open_confined(source, self.settings.roots) as (fd, opened):
            check_unchanged(source, item.source_version, fd=fd)
            samples, info, channels = decode_channels(opened, shown=source, by_channel=mode != "mix")
            check_unchanged(source, item.source_version, during=True, fd=fd)
        if info["damage"] and self.settings.on_damaged == "fail":
            raise InputError(
                f"damaged media: {info['damage']} (PIPELINE_ON_DAMAGED=keep transcribes what decoded)"
            )
        if info["damage"]:
            log.warning("audio: %s is damaged: %s; keeping what decoded", source, info["damage"])
        sidecar = Path(item.output).with_suffix(".npy")
        digest = save_array(sidecar, samples)
        tracks, measure, decision = [], None, None
        if mode != "mix" and info["source_channels"] > MAX_CHANNELS:
            decision = (
                f"mixed: {info['source_channels']} channels (more than {MAX_CHANNELS} are never separated)"
            )
        elif channels is not None:
            channels = _fit(channels, samples.shape[0])
            measure = measure_channels(channels)
            keep, decision = decide_channels(measure, mode)
            for c in keep:
                path = sidecar.with_name(f"{sidecar.stem}.channel{c + 1}.npy")
                track = ChannelTrack(channel=c, sidecar=path.name, sha256=save_array(path, channels[c]))
                tracks.append(track)
            del channels
        if decision:
            log.info("audio: %s: %s", source, decision)
        try:
            write_listen_copy(sidecar.with_name(LISTEN_COPY), samples)
        except (av.FFmpegError, OSError) as exc:  # the transcript page then points at the source
            if getattr(exc, "errno", None) in (errno.ENOSPC, errno.EDQUOT):  # the run stops
                raise DiskFullError(
                    f"no space left writing {LISTEN_COPY} ({exc}) in {sidecar.parent}"
                ) from None
            log.warning("audio: no compressed copy of %s for the transcript page: %s", source, exc)
        return AudioArtifact(
            item_id=item.id,
            fingerprint=item.fingerprint,
            source=recorded_source(source),
            source_size=size,
            sidecar=sidecar.name,
            sha256=digest,
            num_samples=int(samples.shape[0]),
            duration_s=samples.shape[0] / SAMPLE_RATE,
            channel_mode=mode,
            channel_measure=measure,
            channel_decision=decision,
            channel_tracks=tracks,
            **info,
        )


def check_readable(path: Path) -> int:
    """Fail with a one-line reason when ``path`` cannot be a media file; return its size.

    Never opens what is not a regular file: a FIFO or a device would block the decoder forever.
    """
    try:
        info = os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            raise InputError(f"broken symbolic link: {path}") from None
        raise InputError(f"file not found: {path}") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise InputError(f"symbolic link loop: {path}") from None
        raise InputError(f"cannot read ({exc.strerror}): {path}") from None
    if stat.S_ISDIR(info.st_mode):
        raise InputError(f"directory without media files ({', '.join(sorted(MEDIA_HINT))}...): {path}")
    if not stat.S_ISREG(info.st_mode):
        kind = (
            "FIFO"
            if stat.S_ISFIFO(info.st_mode)
            else "socket"
            if stat.S_ISSOCK(info.st_mode)
            else "device file"
            if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode)
            else "special file"
        )
        raise InputError(f"not a regular file ({kind}): {path}")
    if not os.access(path, os.R_OK):
        raise InputError(f"permission denied: {path}")
    if info.st_size == 0:
        raise InputError(f"empty file (0 bytes): {path}")
    return info.st_size


@contextmanager
def open_confined(path: Path, roots: list[str]) -> Iterator[tuple[int, Path]]:
    """Open ``path`` once and yield (descriptor, a path naming that very open file).

    The check against ``roots`` is made on the file actually opened (its real path, as the kernel
    reports it for the descriptor), not on the name: a folder swapped for a symbolic link after the
    parent checked the name reads nothing outside the roots. Everything after (decoding, the
    unchanged check) goes through ``/proc/self/fd/N``, the same open file, whatever the name points
    at by then. Non-blocking, so a name swapped for a FIFO cannot hang the child.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise InputError(f"cannot open ({exc.strerror}): {path}") from None
    try:
        opened = Path(f"/proc/self/fd/{fd}")
        if roots:
            real = Path(os.readlink(opened))
            allowed = [Path(os.path.realpath(root)) for root in roots]
            if not any(real == root or root in real.parents for root in allowed):
                log.warning("audio: %s opened %s, outside the allowed roots", path, real)
                raise InputError(
                    f"refused: the file opened is outside the allowed input roots (was a folder "
                    f"on its path replaced by a symbolic link?): {path}"
                )
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise InputError(f"not a regular file (replaced since it was checked): {path}")
        yield fd, opened
    finally:
        os.close(fd)


def recorded_source(path: Path) -> str:
    """The source as artifacts record it. A name that is not UTF-8 reaches this stage as the parent's link in
    the output directory: the file it points at is recorded, its bytes escaped as \\xNN (as the report does)."""
    if path.is_symlink():
        target = os.fsencode(os.path.realpath(path))
        try:
            target.decode("utf-8")
        except UnicodeDecodeError:
            return target.decode("utf-8", "backslashreplace")
    return str(path)


def check_unchanged(
    path: Path, planned: SourceVersion | None, during: bool = False, fd: int | None = None
) -> None:
    """Fail when ``path`` (or the open file ``fd``) is not the file the run planned (written to, replaced,
    truncated since)."""
    if planned is None:
        return
    try:
        st = os.fstat(fd) if fd is not None else os.stat(path)
    except OSError as exc:
        raise InputError(f"source disappeared while it was read ({exc.strerror}): {path}") from None
    if (st.st_size, st.st_mtime_ns) == (planned.size, planned.mtime_ns):
        return
    when = "while it was decoded" if during else "since the run was planned"
    what = (
        f"size {planned.size} -> {st.st_size} bytes"
        if st.st_size != planned.size
        else "same size, modified again"
    )
    raise InputError(f"source changed {when} ({what}); a rerun processes the new version: {path}")


def pick_stream(container):
    """The audio stream a player would play: the one marked default, else the first."""
    audio = list(container.streams.audio)
    marked = [s for s in audio if s.disposition & av.stream.Disposition.default]
    return (marked or audio)[0], bool(marked) and len(audio) > 1


def decode(path: Path, shown: Path | None = None):
    """Return (float32 mono 16 kHz samples, facts about the source stream); errors name ``shown`` (the
    source's name when ``path`` is its open descriptor's ``/proc/self/fd/N``)."""
    samples, info, _ = decode_channels(path, shown)
    return samples, info


def decode_channels(path: Path, shown: Path | None = None, by_channel: bool = False):
    """:func:`decode`, and the source's channels (None: not asked for, or not split).

    ``by_channel``: a source of 2 to :data:`MAX_CHANNELS` channels is also resampled channel by channel, from
    the same frames (channels x samples, float32 16 kHz); the mix stays FFmpeg's downmix, as without it."""
    opened, path = path, shown or path
    try:
        container = av.open(str(opened), options=dict(OPEN_OPTIONS))
    except av.FFmpegError as exc:
        # through /proc/self/fd/N FFmpeg sees no file name, so a playlist is "invalid data" rather than a
        # refused format: its first bytes tell either way
        why = _refusal(opened) or (
            "not an audio or video container the pipeline reads"  # "Invalid argument"
            if isinstance(exc, av.ArgumentError)
            else _reason(exc)
        )
        raise InputError(f"not a readable media file ({why}): {path}") from None
    with container:
        if not container.streams.audio:
            kinds = ", ".join(sorted({s.type for s in container.streams})) or "no streams"
            raise InputError(f"no audio stream (has {kinds}): {path}")
        stream, marked = pick_stream(container)
        count = len(container.streams.audio)
        info = {
            "source_stream": stream.index,
            "audio_streams": count,
            "track": None
            if count < 2
            else (
                f"{count} audio tracks: decoded stream {stream.index} ({'marked default' if marked else 'the first'})"
            ),
            "source_codec": stream.codec_context.name or "unknown",
            "source_sample_rate": int(stream.codec_context.sample_rate or stream.rate or 0) or 1,
            "source_channels": int(stream.codec_context.channels or 1),
            "expected_duration_s": _expected_duration(container, stream),
            "damage": None,
        }
        error = None
        resampler = av.AudioResampler(format="flt", layout="mono", rate=SAMPLE_RATE)
        split = None
        if by_channel and 2 <= info["source_channels"] <= MAX_CHANNELS:
            layout = stream.codec_context.layout
            split = av.AudioResampler(format="fltp", layout=layout.name, rate=SAMPLE_RATE)
        chunks, parts = [], []
        try:
            for frame in container.decode(stream):
                for out in resampler.resample(frame):
                    chunks.append(out.to_ndarray().reshape(-1))
                if split is not None:
                    parts += [out.to_ndarray() for out in split.resample(frame)]
        except av.FFmpegError as exc:
            if not chunks:
                raise InputError(f"audio stream cannot be decoded ({_reason(exc)}): {path}") from None
            error = _reason(exc)
        for out in resampler.resample(None):
            chunks.append(out.to_ndarray().reshape(-1))
        if split is not None:
            parts += [out.to_ndarray() for out in split.resample(None)]
    samples = np.concatenate(chunks).astype(np.float32, copy=False) if chunks else np.zeros(0, np.float32)
    if samples.size == 0:
        raise InputError(f"audio stream holds no samples (zero length): {path}")
    decoded, expected = samples.size / SAMPLE_RATE, info["expected_duration_s"]
    short = expected is not None and decoded < expected * DAMAGED_FRACTION - 0.5
    if error or short:
        of = f" of {expected:.1f} s" if expected else ""
        info["damage"] = f"decoded {decoded:.1f} s{of}" + (f" ({error})" if error else "")
    channels = None
    if parts:
        channels = np.concatenate(parts, axis=1).astype(np.float32, copy=False)
        if channels.shape[0] != info["source_channels"]:  # a layout FFmpeg reads otherwise: not split
            channels = None
    return samples, info, channels


# -- channels -----------------------------------------------------------------------------------------

#: sources with more channels than this are always mixed (surround mixes: their channels share one scene)
MAX_CHANNELS = 8
#: the measure's frames: 20 ms
FRAME = SAMPLE_RATE // 50
#: a frame has sound on a channel when it is this many dB above the channel's floor (its 10th percentile:
#: the pauses) ...
ABOVE_FLOOR_DB = 10.0
#: ... and above this level (dBFS): a steady hum or hiss has none, a digitally silent side none
SOUND_FLOOR_DBFS = -60.0
#: a channel is alone in a frame when every other channel is silent or this many dB quieter
QUIETER_DB = 20.0
#: a channel with less sound than this (seconds) is left out: no track, and "auto" does not count it
MIN_SOUND_S = 1.0
#: "auto" separates only channels whose levels go together less than this (the highest correlation of two
#: channels' frame levels): copies and music beds measured 0.62-1.0, one speaker per channel below 0
MAX_CORRELATION = 0.5


def measure_channels(channels) -> ChannelMeasure:
    """How alike a source's channels (channels x samples, 16 kHz) are, over 20 ms frames: each channel's
    seconds with sound and its share of them in which it is alone, and the highest correlation between two
    channels' levels (dB, frame by frame) over the frames where either has sound. Levels, not samples: a
    pair of microphones or a stereo music bed holds one sound a few samples apart (their samples correlate
    little at lag 0, their levels rise and fall together); two people each on their own channel do not."""
    count, n = channels.shape[0], channels.shape[1] // FRAME
    frames = [channels[c, : n * FRAME].reshape(n, FRAME) for c in range(count)]
    level = np.stack([10 * np.log10(np.einsum("ij,ij->i", f, f) / FRAME + 1e-12) for f in frames])
    floor = np.percentile(level, 10, axis=1, keepdims=True) if n else np.zeros((count, 1))
    sound = (level > SOUND_FLOOR_DBFS) & (level > floor + ABOVE_FLOOR_DB)
    alone = []
    for c in range(count):
        others = [d for d in range(count) if d != c]
        quiet = np.all(~sound[others] | (level[others] < level[c] - QUIETER_DB), axis=0)
        mine = int(sound[c].sum())
        alone.append(round(float((sound[c] & quiet).sum()) / mine, 3) if mine else 0.0)
    active_s = [round(float(sound[c].sum()) * FRAME / SAMPLE_RATE, 2) for c in range(count)]
    counted = [c for c in range(count) if active_s[c] >= MIN_SOUND_S]
    correlation = None
    for i, a in enumerate(counted):
        for b in counted[i + 1 :]:
            heard = sound[a] | sound[b]
            x, y = level[a, heard], level[b, heard]
            spread = float(np.sqrt(np.var(x) * np.var(y)))
            r = float(np.mean((x - x.mean()) * (y - y.mean()))) / spread if spread > 1e-9 else 1.0
            correlation = r if correlation is None else max(correlation, r)
    return ChannelMeasure(
        active_s=active_s, alone=alone, correlation=None if correlation is None else round(correlation, 3)
    )


def decide_channels(measure: ChannelMeasure, mode: str) -> tuple[list[int], str]:
    """(the channels that become tracks of their own, in order (empty: the mix is the one track), why).

    "separate": every channel with at least :data:`MIN_SOUND_S` of sound (a silent side gets no empty track).
    "auto": those channels only when there are two or more and no two of them have levels that go together
    (level correlation below :data:`MAX_CORRELATION`: not copies of one signal, even at another gain or with a
    little noise, not a music bed or a room that every channel hears); a source with sound on one side only
    is mixed (the mix holds that side's speech)."""
    counted = [c for c, seconds in enumerate(measure.active_s) if seconds >= MIN_SOUND_S]
    silent = [c + 1 for c in range(len(measure.active_s)) if c not in counted]
    names = ", ".join(str(c + 1) for c in counted)
    left_out = f"; channel(s) {', '.join(map(str, silent))} left out (no sound)" if silent else ""
    if not counted:
        return [], "mixed: no channel has sound that comes and goes (silence, or a steady hum)"
    if mode == "separate":
        return counted, f"separated (PIPELINE_CHANNELS=separate): channel(s) {names}{left_out}"
    if len(counted) < 2 or measure.correlation is None:
        return [], f"mixed: only channel {names} has sound"
    if measure.correlation >= MAX_CORRELATION:
        return [], (
            f"mixed: the channels' levels go together (correlation {measure.correlation:.2f} >= "
            f"{MAX_CORRELATION}): one sound on every channel (copies, a music bed, one room)"
        )
    return counted, (
        f"separated: the channels hold different sound (level correlation {measure.correlation:.2f} < "
        f"{MAX_CORRELATION}): channel(s) {names}{left_out}"
    )


def _fit(channels, length: int):
    """``channels`` cut or padded with silence to ``length`` samples (the mix's: its resampler may end a
    few samples apart)."""
    if channels.shape[1] >= length:
        return np.ascontiguousarray(channels[:, :length])
    return np.pad(channels, ((0, 0), (0, length - channels.shape[1])))


#: the compressed copy: Opus at this bit rate (speech at 16 kHz mono: ~11 MB an hour)
LISTEN_BIT_RATE = 24_000


def write_listen_copy(path: Path, samples) -> None:
    """``samples`` (16 kHz mono float32) as Ogg Opus at ``path`` (temp file, then rename): what the
    transcript page plays. Browsers seek in it; an hour encodes in seconds."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with av.open(
            str(tmp), "w", format="ogg", options={"fflags": "+bitexact"}
        ) as out:  # bitexact: a fixed Ogg serial, the same bytes each run
            stream = out.add_stream("libopus", rate=SAMPLE_RATE, layout="mono")
            stream.bit_rate = LISTEN_BIT_RATE
            step = SAMPLE_RATE * 10
            for at in range(0, samples.shape[0], step):
                frame = av.AudioFrame.from_ndarray(
                    np.ascontiguousarray(samples[None, at : at + step]), format="flt", layout="mono"
                )
                frame.sample_rate = SAMPLE_RATE
                for packet in stream.encode(frame):
                    out.mux(packet)
            for packet in stream.encode(None):
                out.mux(packet)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


#: a stream that decodes to less than this share of the length its container states is damaged
DAMAGED_FRACTION = 0.98


def _expected_duration(container, stream) -> float | None:
    """The stream's length as the container states it, in seconds (None when it does not say)."""
    if stream.duration and stream.time_base:
        return float(stream.duration * stream.time_base)
    if container.duration:
        return container.duration / 1_000_000  # AV_TIME_BASE
    return None


#: how the first bytes of files FFmpeg would follow elsewhere begin
_POINTERS = (
    (b"#EXTM3U", "an HLS/M3U playlist"),
    (b"ffconcat", "an FFmpeg concat list"),
    (b"[playlist]", "a PLS playlist"),
    (b"<?xml", "an XML document (DASH manifest or playlist)"),
)


def _refusal(path: Path) -> str | None:
    """Why a file that FFmpeg refused to open under :data:`OPEN_OPTIONS` is refused, when its first bytes tell
    (None when they do not)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(64).lstrip(b"\xef\xbb\xbf \t\r\n")
    except OSError:
        return None
    for magic, what in _POINTERS:
        if head[: len(magic)].lower() == magic.lower():
            return f"{what}: it points at other files, which are not read"
    return None


def _reason(exc: Exception) -> str:
    return getattr(exc, "strerror", None) or str(exc).split(":")[0]


STAGE = AudioStage()
