"""Decode any container's first audio stream to 16 kHz mono float32 with PyAV."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from contracts import AudioArtifact, InputError, StageRequest, WorkItem
from contracts.stage_settings import AudioSettings
from stages.base import Stage, save_array

log = logging.getLogger(__name__)

SAMPLE_RATE = 16000
MEDIA_HINT = (".mp4", ".mkv", ".wav", ".mp3")


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
        samples, info = decode(source)
        sidecar = Path(item.output).with_suffix(".npy")
        digest = save_array(sidecar, samples)
        return AudioArtifact(
            item_id=item.id,
            fingerprint=item.fingerprint,
            source=str(source),
            source_size=size,
            sidecar=sidecar.name,
            sha256=digest,
            num_samples=int(samples.shape[0]),
            duration_s=samples.shape[0] / SAMPLE_RATE,
            **info,
        )


def check_readable(path: Path) -> int:
    """Fail with a one-line reason when ``path`` cannot be a media file; return its size."""
    if not path.exists():
        raise InputError(f"file not found: {path}")
    if path.is_dir():
        raise InputError(f"directory without media files ({', '.join(sorted(MEDIA_HINT))}...): {path}")
    if not os.access(path, os.R_OK):
        raise InputError(f"permission denied: {path}")
    size = path.stat().st_size
    if size == 0:
        raise InputError(f"empty file (0 bytes): {path}")
    return size


def decode(path: Path):
    """Return (float32 mono 16 kHz samples, facts about the source stream)."""
    try:
        container = av.open(str(path))
    except av.FFmpegError as exc:
        raise InputError(f"not a readable media file ({_reason(exc)}): {path}") from None
    with container:
        if not container.streams.audio:
            kinds = ", ".join(sorted({s.type for s in container.streams})) or "no streams"
            raise InputError(f"no audio stream (has {kinds}): {path}")
        stream = container.streams.audio[0]
        info = {
            "source_codec": stream.codec_context.name or "unknown",
            "source_sample_rate": int(stream.codec_context.sample_rate or stream.rate or 0) or 1,
            "source_channels": int(stream.codec_context.channels or 1),
        }
        resampler = av.AudioResampler(format="flt", layout="mono", rate=SAMPLE_RATE)
        chunks = []
        try:
            for frame in container.decode(stream):
                for out in resampler.resample(frame):
                    chunks.append(out.to_ndarray().reshape(-1))
        except av.FFmpegError as exc:
            if not chunks:
                raise InputError(f"audio stream cannot be decoded ({_reason(exc)}): {path}") from None
            log.warning("audio: %s is damaged after %d frames; keeping what decoded (%s)", path, len(chunks), _reason(exc))
        for out in resampler.resample(None):
            chunks.append(out.to_ndarray().reshape(-1))
    samples = np.concatenate(chunks).astype(np.float32, copy=False) if chunks else np.zeros(0, np.float32)
    if samples.size == 0:
        raise InputError(f"audio stream holds no samples (zero length): {path}")
    return samples, info


def _reason(exc: Exception) -> str:
    return getattr(exc, "strerror", None) or str(exc).split(":")[0]


STAGE = AudioStage()
