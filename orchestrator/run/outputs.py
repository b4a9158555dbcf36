"""User-facing files written from validated artifacts: SRT, VTT, TXT, JSONL."""

from __future__ import annotations

import json
from pathlib import Path

from contracts import EmbeddingsArtifact, Segment, TranscriptArtifact
from contracts.io import atomic_write_text


def timestamp(seconds: float, separator: str) -> str:
    millis = max(0, round(seconds * 1000))
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    secs, millis = divmod(millis, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{separator}{millis:03d}"


def _caption(segment: Segment) -> str:
    return f"[{segment.speaker}] {segment.text}" if segment.speaker else segment.text


def to_srt(transcript: TranscriptArtifact) -> str:
    blocks = [
        f"{n}\n{timestamp(s.start, ',')} --> {timestamp(s.end, ',')}\n{_caption(s)}\n"
        for n, s in enumerate(transcript.segments, start=1)
    ]
    return "\n".join(blocks)


def to_vtt(transcript: TranscriptArtifact) -> str:
    blocks = [f"{timestamp(s.start, '.')} --> {timestamp(s.end, '.')}\n{_caption(s)}\n" for s in transcript.segments]
    return "WEBVTT\n\n" + "\n".join(blocks)


def to_txt(transcript: TranscriptArtifact) -> str:
    return "".join(f"{_caption(s)}\n" for s in transcript.segments)


def to_jsonl(transcript: TranscriptArtifact, embeddings: EmbeddingsArtifact, vectors) -> str:
    """One line per segment: text, times, its row in embeddings.npy and the vector itself."""
    if embeddings.count != len(transcript.segments):
        raise ValueError(f"{embeddings.count} embeddings for {len(transcript.segments)} segments")
    lines = []
    for row, segment in enumerate(transcript.segments):
        record = {
            "id": segment.id,
            "start": segment.start,
            "end": segment.end,
            "text": segment.text,
            "speaker": segment.speaker,
            "embedding_row": row,
            "embedding": [round(float(x), 7) for x in vectors[row]],
        }
        lines.append(json.dumps(record, ensure_ascii=False))
    return "".join(line + "\n" for line in lines)


def write_outputs(directory: Path, transcript: TranscriptArtifact, embeddings: EmbeddingsArtifact,
                  vectors) -> dict[str, str]:
    """Write the derived files next to transcript.json and embeddings.npy; return name -> path."""
    files = {
        "transcript.srt": to_srt(transcript),
        "transcript.vtt": to_vtt(transcript),
        "transcript.txt": to_txt(transcript),
        "segments.jsonl": to_jsonl(transcript, embeddings, vectors),
    }
    written = {name: str(atomic_write_text(directory / name, text)) for name, text in files.items()}
    written["transcript.json"] = str(directory / "transcript.json")
    written["embeddings.npy"] = str(directory / embeddings.sidecar)
    written["embeddings.json"] = str(directory / "embeddings.json")
    return written
