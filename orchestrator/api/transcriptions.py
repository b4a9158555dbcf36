"""``/v1/audio/transcriptions`` outside its route: the form's text fields, the upload saved to disk, and a
finished job answered in OpenAI's formats (json, text, srt, vtt, verbose_json), each made from the job's
``transcript.json`` (subtitles with the corpus renderers, whatever ``PIPELINE_FORMATS`` wrote).
:func:`model_name` also names the models of job results (``orchestrator.api.server``); :func:`redact`
keeps the server's folders out of answers.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import zlib
from pathlib import Path

from fastapi.responses import PlainTextResponse, Response

from contracts import TranscriptArtifact, load_artifact
from contracts.api import (
    EMBEDDED_MODEL_NAMES,
    JobRecord,
    Transcription,
    TranscriptionSegment,
    TranscriptionUsage,
    TranscriptionVerbose,
    TranscriptionWord,
)
from contracts.errors import ApiError, ArtifactError
from orchestrator.corpus.captions import CaptionRules
from orchestrator.corpus.export import load_sources
from orchestrator.corpus.labels import corpus_labels, read_corpus
from orchestrator.corpus.outputs import to_srt, to_vtt

log = logging.getLogger(__name__)

#: the subtitle renderers answers use (the corpus's own: the same cues as ``pipeline process`` writes)
SUBTITLES = {"srt": to_srt, "vtt": to_vtt}


def model_name(model: str) -> str:
    """A model as answers name it: a hub id, never a path on the server (the embedding worker's
    ``public_name`` does the same child-side)."""
    for directory, name in EMBEDDED_MODEL_NAMES.items():
        if model.rstrip("/").endswith(directory):
            return name
    return Path(model).name if Path(model).is_absolute() else model


def redact(text: str, replacements: dict[str, str]) -> str:
    """``text`` with each folder of ``replacements`` (and its resolved form) replaced by what the client
    may see: a name it sent, or a neutral word. Longer folders first, so a job's folder is replaced
    before the state folder holding it."""
    pairs: dict[str, str] = {}
    for folder, shown in replacements.items():
        for form in {str(folder), os.path.realpath(folder)}:
            if form and form != os.sep:
                pairs.setdefault(form, shown)
    for folder in sorted(pairs, key=len, reverse=True):
        text = text.replace(folder, pairs[folder])
    return text


def compression_ratio(text: str) -> float:
    """Whisper's ``compression_ratio``: bytes of the text over bytes of its zlib compression."""
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data)) if data else 0.0


def transcription_answer(
    record: JobRecord,
    response_format: str,
    granularities: list[str],
    rules: CaptionRules | None = None,
    shown: dict[str, str] | None = None,
) -> Response:
    """A finished transcription job as OpenAI answers it; 400 with the input's reason when it failed, the
    server's folders in it replaced as ``shown`` says (:func:`redact`). Subtitles follow ``rules``."""
    item = record.inputs[0] if record.inputs else None
    if item is None or item.status not in ("ok", "partial"):
        why = (item.error if item else None) or record.error or "the audio could not be transcribed"
        why = redact(why, shown or {})
        raise ApiError(400, why, type="invalid_request_error", param="file", code="invalid_audio")
    directory = Path(record.output_dir) / item.id
    # the speakers as the run's own files show them (corpus speakers, S0001...), in every format
    try:
        labels = corpus_labels(read_corpus(Path(record.output_dir))).get(item.id, {})
    except ArtifactError as exc:
        log.warning(
            "job %s: its corpus speakers are not read, speakers keep their own labels: %s", record.id, exc
        )
        labels = {}
    if response_format in SUBTITLES:
        src = load_sources(directory, item.id, rules or CaptionRules(), corpus=labels)
        return PlainTextResponse(SUBTITLES[response_format](src), media_type="text/plain; charset=utf-8")
    transcript = load_artifact(directory / "transcript.json", TranscriptArtifact)
    text = " ".join(seg.text.strip() for seg in transcript.segments if seg.text.strip())
    usage = TranscriptionUsage(seconds=round(transcript.duration_s, 3))
    if response_format == "text":
        return PlainTextResponse(text + "\n", media_type="text/plain; charset=utf-8")
    if response_format == "json":
        return Response(
            Transcription(text=text, usage=usage).model_dump_json(), media_type="application/json"
        )

    def shown_as(label: str | None) -> str | None:
        return labels[label][1] if label in labels else label

    segments, words, speakers = [], [], []
    for seg in transcript.segments:
        timed = [w for w in seg.words or [] if w.start is not None and w.end is not None]
        scores = [w.score for w in seg.words or [] if w.score is not None and w.score > 0]
        segments.append(
            TranscriptionSegment(
                id=len(segments),
                start=seg.start,
                end=seg.end,
                text=seg.text,
                speaker=shown_as(seg.speaker),
                avg_logprob=math.log(sum(scores) / len(scores)) if scores else 0.0,
                compression_ratio=compression_ratio(seg.text),
            )
        )
        words.extend(
            TranscriptionWord(
                word=w.word, start=w.start, end=w.end, speaker=shown_as(w.speaker or seg.speaker)
            )
            for w in timed
        )
        for name in map(shown_as, [seg.speaker, *(w.speaker for w in seg.words or [])]):
            if name and name not in speakers:
                speakers.append(name)
    verbose = TranscriptionVerbose(
        language=transcript.language,
        duration=transcript.duration_s,
        text=text,
        usage=usage,
        segments=segments if not granularities or "segment" in granularities else None,
        words=words if "word" in granularities else None,
        speakers=speakers,
        model=model_name(transcript.model),
    )
    return Response(verbose.model_dump_json(exclude_none=True), media_type="application/json")


def form_text(form, name: str) -> str | None:
    value = form.get(name)
    if value is None or isinstance(value, str):
        return value or None
    raise ApiError(400, f"'{name}' must be a text field", param=name, code="invalid_request")


async def save_upload(upload, directory: Path, limit: int) -> Path:
    """Copy the uploaded file into ``directory`` as ``audio<suffix>`` (the suffix only when it is a plain
    one) and return its path; 413 beyond ``limit`` bytes."""
    suffix = os.path.splitext(upload.filename or "")[1].lower()
    suffix = suffix if suffix[1:].isalnum() and suffix.isascii() and len(suffix) <= 8 else ""
    directory.mkdir(parents=True, exist_ok=True)
    size = 0
    path = directory / f"audio{suffix}"
    with open(path, "wb") as out:
        while chunk := await upload.read(1 << 20):
            size += len(chunk)
            if size > limit:
                raise ApiError(
                    413,
                    f"the audio file is larger than {limit} bytes (PIPELINE_MAX_UPLOAD_BYTES)",
                    type="request_too_large",
                    param="file",
                    code="file_too_large",
                )
            await asyncio.to_thread(out.write, chunk)
    if size == 0:
        raise ApiError(400, "the audio file is empty", param="file", code="invalid_audio")
    return path
