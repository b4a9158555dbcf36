"""Language identification per input, from several speech windows spread over it.

whisperX identifies the language from the first 30 s of audio only (and warns that
short audio makes it unreliable). Here the VAD's speech windows are scored instead:
up to ``max_windows`` of them, spread evenly over the input, each padded to Whisper's
30 s frame, encoded in one batch and scored by CTranslate2's ``Whisper.detect_language``.
The per-window language probabilities are averaged, weighted by each window's speech
seconds, restricted (and renormalised) to an allowed set when one is given.

An input with too little speech, or whose best language is too uncertain, is
``undetermined`` with its reason instead of a guess; an English-only model cannot tell
at all (``not_detectable``).

Several languages in one input (an interview switching from English to German): when
the scored windows do not clearly agree on one language (the best below
``MIXED_BELOW``, or one window confidently of another language), every speech region
the VAD found (its segments before they are merged into ``chunk_size`` windows) is
identified on its own (:func:`detect_regions`), short or unsure regions take their
neighbours' language (:func:`label_regions`), and the regions are merged again into
decoding windows that never cross a language change (:func:`language_windows`). An
input that is clearly one language costs nothing more: the windows already scored
decide it. Child side only: called by stages/asr.py with the loaded whisperX
pipeline; numpy and whisperX are imported lazily.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from contracts.artifacts import LanguageId, LanguageScore
from stages.runtime.clock import model_time

log = logging.getLogger(__name__)

SAMPLE_RATE = 16000
#: less speech than this (seconds) is undetermined: Whisper's guess on a word or two is noise
MIN_SPEECH_S = 1.0
#: a best language below this probability is undetermined
MIN_PROBABILITY = 0.5
#: speech windows scored per input (spread over it)
MAX_WINDOWS = 3
#: languages kept in ``top``
TOP = 3
#: an input whose best language is below this probability (or one of whose scored windows is, at
#: ``MIN_PROBABILITY`` or more, of another language) may hold several: its speech regions are identified
MIXED_BELOW = 0.9
#: a speech region shorter than this (seconds) is not identified alone: it takes its neighbours' language
MIN_REGION_S = 1.0
#: a stretch of one language shorter than this (seconds of speech) between others is taken for theirs
MIN_RUN_S = 2.0


def speech_windows(pipeline, samples, chunk_size: int | None = None) -> list[tuple[float, float]]:
    """(start, end) seconds of the speech windows whisperX's VAD finds in ``samples`` (merged to ``chunk_size``);
    a pipeline without whisperX's VAD (the torch runtime where whisperX is not installed) gives its own."""
    return speech_map(pipeline, samples, chunk_size)[0]


def speech_map(
    pipeline, samples, chunk_size: int | None = None
) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """(the speech windows, as :func:`speech_windows`; the VAD's speech regions they were merged from), seconds.
    Without whisperX's VAD each window is its own region."""
    own = getattr(pipeline, "speech_windows", None)
    if own is not None:
        windows = own(samples, chunk_size or 30)
        return windows, list(windows)
    from whisperx.vads import Pyannote, Vad

    if isinstance(pipeline.vad_model, Vad):
        waveform, merge = pipeline.vad_model.preprocess_audio(samples), pipeline.vad_model.merge_chunks
    else:
        waveform, merge = Pyannote.preprocess_audio(samples), Pyannote.merge_chunks
    with model_time():
        raw = pipeline.vad_model({"waveform": waveform, "sample_rate": SAMPLE_RATE})
    merged = merge(
        raw,
        chunk_size or 30,
        onset=pipeline._vad_params["vad_onset"],
        offset=pipeline._vad_params["vad_offset"],
    )
    windows = [(float(w["start"]), float(w["end"])) for w in merged]
    regions = [(float(a), float(b)) for w in merged for a, b in w.get("segments") or [(w["start"], w["end"])]]
    return windows, regions


def spread(windows: Sequence[tuple[float, float]], count: int) -> list[tuple[float, float]]:
    """``count`` windows picked evenly from first to last (all of them when there are fewer)."""
    if len(windows) <= count:
        return list(windows)
    if count == 1:
        return [windows[len(windows) // 2]]
    step = (len(windows) - 1) / (count - 1)
    return [windows[round(i * step)] for i in range(count)]


def combine(
    scored: Sequence[tuple[float, Sequence[tuple[str, float]]]], allowed: Sequence[str] = ()
) -> list[tuple[str, float]]:
    """Weighted mean of per-window (language, probability) lists, restricted to ``allowed``; best first, sums to 1."""
    total: dict[str, float] = {}
    for weight, pairs in scored:
        for language, probability in pairs:
            if allowed and language not in allowed:
                continue
            total[language] = total.get(language, 0.0) + weight * float(probability)
    mass = sum(total.values())
    if mass <= 0:
        return []
    return sorted(((lang, p / mass) for lang, p in total.items()), key=lambda lp: -lp[1])


def decide(
    ranked: Sequence[tuple[str, float]],
    speech_s: float,
    windows: int,
    allowed: Sequence[str] = (),
    min_speech_s: float = MIN_SPEECH_S,
    min_probability: float = MIN_PROBABILITY,
) -> LanguageId:
    """The result for one input from its combined ranking (pure: no model)."""
    top = [LanguageScore(language=lang, probability=round(p, 4)) for lang, p in ranked[:TOP]]
    common = dict(speech_s=round(speech_s, 3), windows=windows, allowed=list(allowed), top=top)
    if speech_s < min_speech_s:
        return LanguageId(
            status="undetermined",
            reason=f"too little speech to identify the language ({speech_s:.1f} s < {min_speech_s:.1f} s)",
            **common,
        )
    if not ranked:
        return LanguageId(status="undetermined", reason="no language of the allowed set scored", **common)
    language, probability = ranked[0]
    if probability < min_probability:
        return LanguageId(
            status="undetermined",
            reason=f"too uncertain: best {language} at {probability:.2f} < {min_probability:.2f}",
            **common,
        )
    return LanguageId(status="detected", language=language, probability=round(probability, 4), **common)


def is_mixed(
    result: LanguageId,
    per_window: Sequence[Sequence[tuple[str, float]]],
    min_probability: float = MIN_PROBABILITY,
    below: float = MIXED_BELOW,
) -> bool:
    """Whether an input may hold several languages (pure): its best language is below ``below``, or a scored
    window's ranking (best first) is at ``min_probability`` or more of another language."""
    if result.status not in ("detected", "undetermined") or not result.top:
        return False
    best = result.top[0]
    if best.probability < below:
        return True
    return any(
        ranked and ranked[0][0] != best.language and ranked[0][1] >= min_probability for ranked in per_window
    )


def _scores(pipeline, samples, spans: Sequence[tuple[float, float]], batch_size: int = 16) -> list:
    """Whisper's language ranking ([(token, probability)], best first) of each span of ``samples``."""
    import numpy as np

    whisper = pipeline.model
    out = []
    for first in range(0, len(spans), batch_size):
        clips = [
            samples[int(start * SAMPLE_RATE) : int(end * SAMPLE_RATE)][: SAMPLE_RATE * 30]
            for start, end in spans[first : first + batch_size]
        ]
        if hasattr(whisper, "features"):  # the torch runtime: its own log-mel, on its device
            batch = whisper.features(clips)
        else:
            from whisperx.audio import N_SAMPLES, log_mel_spectrogram

            n_mels = whisper.feat_kwargs.get("feature_size") or 80
            features = [
                log_mel_spectrogram(c, n_mels=n_mels, padding=N_SAMPLES - c.shape[0]) for c in clips
            ]
            batch = np.stack([np.asarray(f, dtype=np.float32) for f in features])
        with model_time():
            out += whisper.model.detect_language(whisper.encode(batch))
    return out


def detect_regions(
    pipeline,
    samples,
    regions: Sequence[tuple[float, float]],
    allowed: Sequence[str] = (),
    batch_size: int = 16,
    min_region_s: float = MIN_REGION_S,
) -> list[tuple[str, float] | None]:
    """Each speech region's best language and its probability (within ``allowed``), or None for a region
    shorter than ``min_region_s`` (not scored: Whisper's guess on a word is noise)."""
    scored = [k for k, (start, end) in enumerate(regions) if end - start >= min_region_s]
    results = _scores(pipeline, samples, [regions[k] for k in scored], batch_size)
    out: list[tuple[str, float] | None] = [None] * len(regions)
    for k, pairs in zip(scored, results, strict=True):
        ranked = combine([(1.0, [(token[2:-2], p) for token, p in pairs])], allowed)
        out[k] = ranked[0] if ranked else None
    return out


def label_regions(
    regions: Sequence[tuple[float, float]],
    found: Sequence[tuple[str, float] | None],
    fallback: str,
    min_probability: float = MIN_PROBABILITY,
    min_run_s: float = MIN_RUN_S,
) -> list[str]:
    """Each region's language (pure): its own where it was identified at ``min_probability`` or more, else its
    previous (or, at the start, next) neighbour's, else ``fallback``; then a stretch of one language holding
    less than ``min_run_s`` of speech between others takes the longer neighbouring stretch's language (a switch
    must be heard with some confidence)."""
    labels: list[str | None] = [
        f[0] if f is not None and f[1] >= min_probability else None for f in found
    ]
    known = [label for label in labels if label is not None]
    if not known:
        return [fallback] * len(regions)
    last = known[0]
    filled = []
    for label in labels:
        last = label or last
        filled.append(last)
    while True:
        runs = _runs(regions, filled)
        if len(runs) < 2:
            return filled
        seconds = [sum(regions[k][1] - regions[k][0] for k in run) for run in runs]
        weakest = min(range(len(runs)), key=lambda n: seconds[n])
        if seconds[weakest] >= min_run_s:
            return filled
        neighbours = [n for n in (weakest - 1, weakest + 1) if 0 <= n < len(runs)]
        into = max(neighbours, key=lambda n: seconds[n])
        for k in runs[weakest]:
            filled[k] = filled[runs[into][0]]


def _runs(regions: Sequence, labels: Sequence[str]) -> list[list[int]]:
    """Indices of consecutive regions of one language."""
    runs: list[list[int]] = []
    for k, label in enumerate(labels):
        if runs and labels[runs[-1][0]] == label:
            runs[-1].append(k)
        else:
            runs.append([k])
    return runs


def language_windows(
    regions: Sequence[tuple[float, float]], labels: Sequence[str], chunk_size: float
) -> list[tuple[float, float, str]]:
    """The regions merged into decoding windows of at most ``chunk_size`` seconds, as whisperX merges them, but
    never across a change of language (pure): (start, end, language)."""
    out: list[list] = []
    for (start, end), label in zip(regions, labels, strict=True):
        if out and out[-1][2] == label and end - out[-1][0] <= chunk_size:
            out[-1][1] = end
        else:
            out.append([start, end, label])
    return [(float(a), float(b), lang) for a, b, lang in out]


def main_language(spans: Sequence[tuple[float, float, str]]) -> list[tuple[str, float]]:
    """Seconds per language of (start, end, language) spans, most first (pure)."""
    total: dict[str, float] = {}
    for start, end, language in spans:
        total[language] = total.get(language, 0.0) + max(0.0, end - start)
    return sorted(total.items(), key=lambda ls: -ls[1])


def identify(
    pipeline,
    samples,
    windows: Sequence[tuple[float, float]],
    allowed: Sequence[str] = (),
    max_windows: int = MAX_WINDOWS,
    min_speech_s: float = MIN_SPEECH_S,
    min_probability: float = MIN_PROBABILITY,
) -> LanguageId:
    """Identify the language of ``samples`` (16 kHz mono float32) from its VAD ``windows`` (seconds)."""
    speech_s = float(sum(max(0.0, end - start) for start, end in windows))
    whisper = pipeline.model  # faster-whisper WhisperModel; .model is the CTranslate2 Whisper
    if not whisper.model.is_multilingual:
        return LanguageId(
            status="not_detectable",
            speech_s=round(speech_s, 3),
            allowed=list(allowed),
            reason="the ASR model is English-only and cannot tell the language; "
            "use ASR_MODEL=whisper-base (multilingual) to identify it",
        )
    if speech_s < min_speech_s:
        return decide([], speech_s, 0, allowed, min_speech_s, min_probability)
    chosen = spread(windows, max_windows)
    results = _scores(pipeline, samples, chosen)
    scored = []
    for (start, end), pairs in zip(chosen, results, strict=True):
        scored.append((end - start, [(token[2:-2], p) for token, p in pairs]))
    result = decide(combine(scored, allowed), speech_s, len(chosen), allowed, min_speech_s, min_probability)
    per_window = [combine([(1.0, pairs)], allowed) for _, pairs in scored]
    result = result.model_copy(update={"mixed": is_mixed(result, per_window, min_probability)})
    log.info(
        "language: %s (%s) from %d window(s), %.1f s of speech%s",
        result.language or result.status,
        f"{result.probability:.2f}" if result.probability is not None else result.reason,
        len(chosen),
        speech_s,
        "; not clearly one language: its speech regions are identified one by one" if result.mixed else "",
    )
    return result
