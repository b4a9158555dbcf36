"""Word alignment (when its model is available) and the merge into the final transcript.

Reads the raw ASR transcript (``asr.json``) and, when they exist, the
diarization and the enrollment matches; writes ``transcript.json``:

- **alignment**: whisperx's wav2vec2 aligner (torchaudio ``WAV2VEC2_ASR_BASE_960H``
  for English, a Hugging Face model for other languages) when its model is already
  on disk (torch hub / HF cache); otherwise Whisper's own cross-attention alignment
  (CTranslate2 ``Whisper.align``) with the ASR model that produced the transcript:
  the words the ASR stage timed as it decoded (no model runs here), or, for a
  transcript without them, a second pass of that model in batches of segments.
  Either way every word gets start, end and a confidence.
- **no hallucinated fragments**: a segment whose timed words lie mostly outside
  the decoded speech, or that the aligner finds improbable, is dropped and counted
  (``stages.whisper.speech.keep_segments``).
- **speakers**: each word (aligned) or segment gets the diarization speaker it
  overlaps most; a segment whose words change speaker is split at the change.
  Cluster labels become enrolled names where the enrollment stage matched a
  profile; other speakers keep ``SPEAKER_nn``.
- **separated channels** (``PIPELINE_CHANNELS``): each segment's words are timed on
  its own channel's samples, and each segment and word is named after its channel
  (``channel_names``), diarization or not (``channel_speakers``).
"""

from __future__ import annotations

import logging
import os
from datetime import UTC, datetime
from pathlib import Path

from contracts import (
    AudioArtifact,
    DiarizationArtifact,
    Segment,
    SpeakerEmbeddingsArtifact,
    SpeakerTurn,
    StageRequest,
    TranscriptArtifact,
    Word,
    WorkItem,
    load_artifact,
)
from contracts.errors import ArtifactError, InputError
from contracts.stage_settings import AlignmentSettings
from stages.runtime.base import TorchStage, read_tracks
from stages.runtime.clock import model_time
from stages.runtime.memory import is_oom
from stages.runtime.weights import cached_name
from stages.whisper.speech import Decoded, keep_segments

log = logging.getLogger(__name__)

#: a word or segment further than this from every turn gets no speaker
MAX_GAP_S = 1.0
#: whisperx's torchaudio aligners (whisperx.alignment.DEFAULT_ALIGN_MODELS_TORCH), checked on disk before
#: whisperx is imported
TORCHAUDIO_ALIGNERS = {
    "en": "WAV2VEC2_ASR_BASE_960H",
    "fr": "VOXPOPULI_ASR_BASE_10K_FR",
    "de": "VOXPOPULI_ASR_BASE_10K_DE",
    "es": "VOXPOPULI_ASR_BASE_10K_ES",
    "it": "VOXPOPULI_ASR_BASE_10K_IT",
}


class AlignmentStage(TorchStage):
    name = "alignment"
    input = TranscriptArtifact
    input_key = "asr"
    output = TranscriptArtifact
    settings_model = AlignmentSettings

    def import_libraries(self) -> None:
        """What the first input needs whichever aligner it gets: torch hub and torchaudio (where the wav2vec2
        check looks) and the Whisper aligner's libraries; imported before the request, as other stages do."""
        import numpy  # noqa: F401 - imported ahead of the request
        import torch.hub  # noqa: F401 - imported ahead of the request
        import torchaudio  # noqa: F401 - imported ahead of the request

        import stages.whisper.align  # noqa: F401 - imported ahead of the request

    def load(self, request: StageRequest, device: str) -> str | None:
        settings: AlignmentSettings = self.settings
        self.want_align = settings.align
        self.allow_hub = settings.allow_hub
        self.aligners: dict[str, tuple] = {}
        self.unavailable: dict[str, str] = {}
        self.whisper: dict[tuple, object] = {}
        return None

    def process(self, item: WorkItem, asr: TranscriptArtifact, request: StageRequest) -> TranscriptArtifact:
        segments, aligned, aligner, note = list(asr.segments), False, None, None
        if self.want_align and segments:
            segments, aligned, aligner, note = self._align(item, asr)
        elif not self.want_align:
            note = "alignment off (PIPELINE_ALIGN=false)"
        dropped = 0
        if aligned:
            segments, dropped = drop_non_speech(segments, asr.speech)
            if dropped:
                log.info("alignment: %s: dropped %d segment(s) as not speech", item.id, dropped)
        diarization = _optional(item, "diarization", DiarizationArtifact)
        enrollment = _optional(item, "speaker_embeddings", SpeakerEmbeddingsArtifact)
        speakers_note = None
        translation = asr.translation
        if any(seg.channel is not None for seg in segments):  # separated: a speaker per channel
            names = list(self.settings.channel_names)
            segments = channel_speakers(segments, names)
            translation = channel_speakers(translation, names) if translation else translation
            if diarization is not None:
                speakers_note = (
                    "channels separated: each segment is named after its channel (the diarization's "
                    "voices are not used to name them)"
                )
        elif diarization is not None:
            names = {m.speaker: m.name for m in enrollment.matches if m.name} if enrollment else {}
            segments = split_at_speakers(assign_speakers(segments, diarization.turns, names))
            if translation:  # each translated window: the speaker heard most in it
                translation = assign_speakers(translation, diarization.turns, names)
            if enrollment is None and self.settings.skip_voice_embeddings:
                speakers_note = (
                    "enrollment skipped (SKIP_VOICE_EMBEDDINGS): speakers keep their SPEAKER_nn labels"
                )
        elif self.settings.speakers:
            speakers_note = (
                "no speakers: diarization did not run for this input (fast path; see run-report.json)"
            )
        return asr.model_copy(
            update={
                "fingerprint": item.fingerprint,
                "created_at": datetime.now(UTC),
                "segments": segments,
                "translation": translation,
                "aligned": aligned,
                "aligner": aligner,
                "alignment_note": note,
                "diarization": diarization.model if diarization else None,
                "speaker_encoder": enrollment.encoder_model if enrollment else None,
                "speakers_note": speakers_note,
                "dropped_segments": asr.dropped_segments + dropped,
                "speech_note": asr.speech_note
                or (
                    f"all {dropped} decoded segment(s) dropped as not speech"
                    if dropped and not segments
                    else None
                ),
            }
        )

    # -- alignment ------------------------------------------------------------------

    def _align(self, item: WorkItem, asr: TranscriptArtifact):
        language = asr.language
        if asr.languages_note:  # several languages: a wav2vec2 aligner knows one; Whisper's word times stay
            return self._align_whisper(item, asr, "several languages in one input")
        if language in self.unavailable:
            return self._align_whisper(item, asr, self.unavailable[language])
        try:
            model, metadata, name = self.aligners.get(language) or self._load_aligner(language)
        except Exception as exc:
            if is_oom(exc):
                raise
            reason = (
                f"no wav2vec2 alignment model for {language!r} offline ({type(exc).__name__}: "
                f"{' '.join(str(exc).split())[:160]})"
            )
            log.info("alignment: %s; Whisper cross-attention alignment instead", reason)
            self.unavailable[language] = reason
            return self._align_whisper(item, asr, reason)
        self.aligners[language] = (model, metadata, name)
        import whisperx.alignment as wxa

        def align(samples, segments: list[Segment]) -> list[Segment]:
            with model_time():  # wav2vec2's forward, and whisperx's CTC alignment of its output
                result = wxa.align(
                    [{"start": s.start, "end": s.end, "text": s.text} for s in segments],
                    model,
                    metadata,
                    samples,
                    self.device,
                )
            return _wav2vec2_segments(result, segments[0].channel)

        return per_channel(asr.segments, _tracks(item), align), True, name, None

    def _align_whisper(self, item: WorkItem, asr: TranscriptArtifact, why_not_wav2vec2: str):
        """Words timed by the ASR model's own cross-attention (stages.whisper.align): as the ASR stage timed
        them while decoding when it did (no model here), else by a second pass of that model."""
        from stages.whisper.align import WORD_TIMING, WhisperAligner, with_words

        if (asr.aligner or "").startswith(f"{WORD_TIMING}:") and all(s.words for s in asr.segments):
            return [with_words(s, s.words) for s in asr.segments], True, asr.aligner, None

        key = (asr.model, asr.compute_type)
        aligner = self.whisper.get(key)
        if aligner is None:
            try:
                aligner = WhisperAligner(self._asr_path(asr), asr.language, self.device, asr.compute_type)
            except Exception as exc:
                if is_oom(exc):
                    raise
                reason = (
                    f"{why_not_wav2vec2}; Whisper model {asr.model!r} unusable "
                    f"({type(exc).__name__}: {' '.join(str(exc).split())[:160]})"
                )
                log.warning("alignment: %s; keeping segment timestamps", reason)
                return list(asr.segments), False, None, reason
            self.whisper = {key: aligner}  # one model at a time
        segments = per_channel(
            asr.segments, _tracks(item), lambda samples, part: aligner.align(samples, part, self.batch_size)
        )
        return segments, True, f"{WORD_TIMING}:{asr.requested_model}", None

    def _asr_path(self, asr: TranscriptArtifact) -> str:
        """Where the model that made ``asr`` loads from: the transcript names it portably (never a path on this
        machine), so the ASR setting is resolved again as the ASR stage resolved it."""
        settings: AlignmentSettings = self.settings
        if settings.asr_model is None:
            return asr.model
        from stages.whisper.models import resolve_model

        return resolve_model(settings.asr_model, settings.weights_dir)[0]

    def _load_aligner(self, language: str):
        name = TORCHAUDIO_ALIGNERS.get(language)
        if name is not None and not self.allow_hub:
            # torchaudio bundles download from their own server, which HF_HUB_OFFLINE does not stop:
            # look for the file first (before importing whisperx, seconds), so offline runs never wait
            import torch.hub
            import torchaudio

            bundle = getattr(torchaudio.pipelines, name)
            path = Path(torch.hub.get_dir()) / "checkpoints" / os.path.basename(bundle._path)
            if not path.is_file():
                raise FileNotFoundError(f"{path} is not downloaded")
        import whisperx.alignment as wxa

        name = wxa.DEFAULT_ALIGN_MODELS_TORCH.get(language) or wxa.DEFAULT_ALIGN_MODELS_HF.get(language)
        if name is None:
            raise LookupError(f"whisperx has no default aligner for {language!r}")
        # Hugging Face models: HF_HUB_OFFLINE=1 (set by the orchestrator) and model_cache_only fail at once
        model, metadata = wxa.load_align_model(language, self.device, model_cache_only=not self.allow_hub)
        _sentences_without_download(wxa, self.allow_hub)
        if name in wxa.DEFAULT_ALIGN_MODELS_HF.values():
            name = cached_name(name)
        return model, metadata, name


def _sentences_without_download(wxa, allow_hub: bool) -> None:
    """whisperX splits each segment into sentences with NLTK's ``punkt_tab`` data, and downloads it where it is
    not on disk: offline (or where NLTK's server is out of reach) that download fails and every input with it,
    however cached the aligner is. Where the data is missing and may not be downloaded (or the download
    fails), an untrained Punkt splitter stands in: sentences end at ``.``, ``?`` and ``!`` (the sentences
    only group the aligned words; the words' times are the aligner's)."""
    load = wxa.nltk_load
    if getattr(load, "isostage_offline", False):
        return

    def nltk_load(resource: str, *args, **kwargs):
        try:
            return load(resource, *args, **kwargs)
        except LookupError:
            if allow_hub and wxa.nltk.download("punkt_tab", quiet=True):
                return load(resource, *args, **kwargs)
            from nltk.tokenize.punkt import PunktSentenceTokenizer

            log.info("alignment: NLTK's %s is not on disk: untrained Punkt sentence splitting", resource)
            return PunktSentenceTokenizer()

    nltk_load.isostage_offline = True
    wxa.nltk_load = nltk_load


def _wav2vec2_segments(result: dict, channel: int | None) -> list[Segment]:
    """whisperX's aligned segments as ours (``channel``: the track they were aligned on)."""
    segments = []
    for raw in result["segments"]:
        words = [
            Word(
                word=w["word"], start=_num(w.get("start")), end=_num(w.get("end")), score=_num(w.get("score"))
            )
            for w in raw.get("words", [])
        ]
        start = max(0.0, float(raw["start"]))
        segments.append(
            Segment(
                id=len(segments),
                start=round(start, 3),
                end=round(max(start, float(raw["end"])), 3),
                text=raw["text"].strip(),
                words=words or None,
                channel=channel,
            )
        )
    return segments


def _tracks(item: WorkItem) -> dict:
    """The input's samples by channel: None -> the mix, and each separated channel's own track."""
    return read_tracks(item, load_artifact(item.inputs["audio"], AudioArtifact), channels=True)


def per_channel(segments: list[Segment], tracks: dict, align) -> list[Segment]:
    """``align(samples, segments)`` on each channel's segments with that channel's samples (the mix's for
    segments of no channel); the results by start time (channel order at equal starts), numbered again."""
    out: list[Segment] = []
    for channel in dict.fromkeys(seg.channel for seg in segments):
        part = [seg for seg in segments if seg.channel == channel]
        samples = tracks.get(channel, tracks[None])
        out += [seg.model_copy(update={"channel": channel}) for seg in align(samples, part)]
    out.sort(key=lambda seg: (seg.start, -1 if seg.channel is None else seg.channel))
    return [seg.model_copy(update={"id": n}) for n, seg in enumerate(out)]


def channel_name(channel: int, names: list[str]) -> str:
    """The speaker name of separated channel ``channel`` (0-based): its entry in ``names`` when given and not
    blank, else "channel N" (N from 1)."""
    if channel < len(names) and names[channel].strip():
        return names[channel].strip()
    return f"channel {channel + 1}"


def channel_speakers(segments: list[Segment], names: list[str]) -> list[Segment]:
    """Segments of separated channels, each (and each of its words) named after its channel."""
    out = []
    for seg in segments:
        if seg.channel is None:
            out.append(seg)
            continue
        name = channel_name(seg.channel, names)
        words = [w.model_copy(update={"speaker": name}) for w in seg.words] if seg.words else seg.words
        out.append(seg.model_copy(update={"speaker": name, "words": words}))
    return out


def _num(value) -> float | None:
    return None if value is None else round(float(value), 3)


def _optional(item: WorkItem, key: str, cls):
    path = item.inputs.get(key)
    if path is None:
        return None
    try:
        return load_artifact(path, cls)
    except ArtifactError as exc:
        raise InputError(f"upstream artifact unusable: {exc}") from exc


# -- merge (pure) -------------------------------------------------------------------


def speaker_at(start: float, end: float, turns: list[SpeakerTurn]) -> str | None:
    """The speaker whose turns overlap [start, end] most; the nearest within MAX_GAP_S if none overlaps."""
    overlap: dict[str, float] = {}
    for t in turns:
        o = min(end, t.end) - max(start, t.start)
        if o > 0:
            overlap[t.speaker] = overlap.get(t.speaker, 0.0) + o
    if overlap:
        return max(sorted(overlap), key=lambda s: overlap[s])
    gaps = [(max(t.start - end, start - t.end), t.speaker) for t in turns]
    gaps = [g for g in gaps if g[0] <= MAX_GAP_S]
    return min(gaps)[1] if gaps else None


def assign_speakers(
    segments: list[Segment], turns: list[SpeakerTurn], names: dict[str, str]
) -> list[Segment]:
    """Segments (and their timed words) with speakers: enrolled names where matched, else cluster labels."""
    out = []
    for seg in segments:
        words = None
        if seg.words:
            words = []
            for w in seg.words:
                spk = speaker_at(w.start, w.end, turns) if w.start is not None and w.end is not None else None
                words.append(w.model_copy(update={"speaker": names.get(spk, spk) if spk else None}))
            timed: dict[str, float] = {}
            for w in words:
                if w.speaker and w.start is not None and w.end is not None:
                    timed[w.speaker] = timed.get(w.speaker, 0.0) + max(w.end - w.start, 1e-3)
            speaker = max(sorted(timed), key=lambda s: timed[s]) if timed else None
        else:
            spk = speaker_at(seg.start, seg.end, turns)
            speaker = names.get(spk, spk) if spk else None
        out.append(seg.model_copy(update={"speaker": speaker, "words": words}))
    return out


def drop_non_speech(
    segments: list[Segment], speech: list[tuple[float, float]] | None
) -> tuple[list[Segment], int]:
    """Timed segments without those that are not speech (stages.whisper.speech.keep_segments), renumbered."""
    decoded = []
    for seg in segments:
        timed = [w for w in seg.words or [] if w.start is not None and w.end is not None]
        scores = [w.score for w in seg.words or [] if w.score is not None]
        decoded.append(
            Decoded(
                start=seg.start,
                end=seg.end,
                word_spans=tuple((w.start, w.end) for w in timed) or None,
                confidence=sum(scores) / len(scores) if scores else None,
            )
        )
    kept, dropped = keep_segments(decoded, speech)
    return [segments[i].model_copy(update={"id": n}) for n, i in enumerate(kept)], dropped


def split_at_speakers(segments: list[Segment]) -> list[Segment]:
    """Segments whose timed words change speaker split at each change (ids renumbered).

    A word without a speaker stays with the word before it (the first ones with the word after).
    """
    out: list[Segment] = []
    for seg in segments:
        words = seg.words or []
        runs: list[list[Word]] = []
        current = None
        for w in words:
            spk = w.speaker
            if not runs:
                runs.append([w])
            elif spk is None or spk == current or current is None:
                runs[-1].append(w)
            else:
                runs.append([w])
            current = spk or current
        if len(runs) <= 1:
            out.append(seg.model_copy(update={"id": len(out)}))
            continue
        for run in runs:
            speaker = next((w.speaker for w in run if w.speaker), None)
            timed = [w for w in run if w.start is not None and w.end is not None]
            start = min(w.start for w in timed) if timed else seg.start
            end = max(w.end for w in timed) if timed else seg.end
            out.append(
                Segment(
                    id=len(out),
                    start=round(start, 3),
                    end=round(max(start, end), 3),
                    text=" ".join(w.word.strip() for w in run).strip(),
                    words=run,
                    speaker=speaker,
                    language=seg.language,
                )
            )
    return out


STAGE = AlignmentStage()
