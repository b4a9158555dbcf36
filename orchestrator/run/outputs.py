"""User-facing files written from validated artifacts: SRT, VTT, TXT, JSONL."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from contracts import EmbeddingsArtifact, TranscriptArtifact
from contracts.io import atomic_write_text


def timestamp(seconds: float, separator: str) -> str:
    millis = max(0, round(seconds * 1000))
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    secs, millis = divmod(millis, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{separator}{millis:03d}"


#: caption layout: at most this many lines of about this many characters, and this many seconds
LINE_CHARS = 42
MAX_LINES = 2
CUE_MAX_S = 7.0
SENTENCE_ENDS = (".", "?", "!", "…")


@dataclass(frozen=True)
class Cue:
    start: float
    end: float
    speaker: str | None
    text: str


def _label(speaker: str | None, text: str) -> str:
    return f"[{speaker}] {text}" if speaker else text


def _wrap(text: str, line_chars: int, max_lines: int) -> str:
    """Text on at most ``max_lines`` lines of about ``line_chars`` (the last line takes any rest)."""
    lines: list[str] = []
    for word in text.split():
        if lines and len(lines) < max_lines and len(lines[-1]) + 1 + len(word) <= line_chars:
            lines[-1] += " " + word
        elif lines and len(lines) >= max_lines:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return "\n".join(lines)


def _balanced(words: list, budget: int, max_s: float) -> list[list]:
    """A sentence's words in the fewest near-equal parts (by characters) that each fit ``budget`` and ``max_s``."""
    for parts in range(1, len(words) + 1):
        size = sum(len(w.word) + 1 for w in words) / parts
        out: list[list] = [[]]
        used = 0.0
        for w in words:
            if out[-1] and used + len(w.word) / 2 > size * len(out) and len(out) < parts:
                out.append([])
            out[-1].append(w)
            used += len(w.word) + 1
        if all(len(" ".join(w.word for w in p)) <= budget and p[-1].end - p[0].start <= max_s for p in out):
            return out
    return [[w] for w in words]


def cues(transcript: TranscriptArtifact, line_chars: int = LINE_CHARS, max_s: float = CUE_MAX_S,
         max_lines: int = MAX_LINES) -> list[Cue]:
    """Caption cues: one speaker each (segments are speaker-pure), split at sentence ends, at most
    ``max_lines`` x ``line_chars`` characters and ``max_s`` seconds where word times allow, never overlapping."""
    budget = line_chars * max_lines
    out: list[Cue] = []
    for seg in transcript.segments:
        words = [w for w in seg.words or [] if w.start is not None and w.end is not None]
        if not words:
            out.append(Cue(seg.start, seg.end, seg.speaker, seg.text))
            continue
        budget_here = budget - (len(seg.speaker) + 3 if seg.speaker else 0)
        sentence: list = []
        for n, w in enumerate(words):
            sentence.append(w)
            if w.word.endswith(SENTENCE_ENDS) or n == len(words) - 1:
                for part in _balanced(sentence, budget_here, max_s):
                    out.append(Cue(part[0].start, part[-1].end, seg.speaker, " ".join(x.word for x in part)))
                sentence = []
    out.sort(key=lambda c: (c.start, c.end))
    fixed = []
    for n, cue in enumerate(out):
        end = min(cue.end, out[n + 1].start) if n + 1 < len(out) else cue.end
        fixed.append(Cue(cue.start, max(cue.start, end), cue.speaker, _wrap(_label(cue.speaker, cue.text),
                                                                              line_chars, max_lines)))
    return fixed


def to_srt(transcript: TranscriptArtifact, **layout) -> str:
    blocks = [
        f"{n}\n{timestamp(c.start, ',')} --> {timestamp(c.end, ',')}\n{c.text}\n"
        for n, c in enumerate(cues(transcript, **layout), start=1)
    ]
    return "\n".join(blocks)


def to_vtt(transcript: TranscriptArtifact, **layout) -> str:
    blocks = [f"{timestamp(c.start, '.')} --> {timestamp(c.end, '.')}\n{c.text}\n" for c in cues(transcript, **layout)]
    return "WEBVTT\n\n" + "\n".join(blocks)


def to_txt(transcript: TranscriptArtifact) -> str:
    """One line per speaker turn (consecutive segments of one speaker joined)."""
    turns: list[tuple[str | None, list[str]]] = []
    for seg in transcript.segments:
        if turns and turns[-1][0] == seg.speaker:
            turns[-1][1].append(seg.text)
        else:
            turns.append((seg.speaker, [seg.text]))
    return "".join(f"{_label(speaker, ' '.join(texts))}\n" for speaker, texts in turns)


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
                  vectors, line_chars: int = LINE_CHARS, max_s: float = CUE_MAX_S) -> dict[str, str]:
    """Write the derived files next to transcript.json and embeddings.npy; return name -> path."""
    layout = {"line_chars": line_chars, "max_s": max_s}
    files = {
        "transcript.srt": to_srt(transcript, **layout),
        "transcript.vtt": to_vtt(transcript, **layout),
        "transcript.txt": to_txt(transcript),
        "segments.jsonl": to_jsonl(transcript, embeddings, vectors),
    }
    written = {name: str(atomic_write_text(directory / name, text)) for name, text in files.items()}
    written["transcript.json"] = str(directory / "transcript.json")
    written["embeddings.npy"] = str(directory / embeddings.sidecar)
    written["embeddings.json"] = str(directory / "embeddings.json")
    return written
