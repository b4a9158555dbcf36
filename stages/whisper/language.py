"""Language identification per input, from several speech windows spread over it.

whisperX identifies the language from the first 30 s of audio only (and warns that
short audio makes it unreliable). Here the VAD's speech windows are scored instead:
up to ``max_windows`` of them, spread evenly over the input, each padded to Whisper's
30 s frame, encoded in one batch and scored by CTranslate2's ``Whisper.detect_language``.
The per-window language probabilities are averaged, weighted by each window's speech
seconds, restricted (and renormalised) to an allowed set when one is given.

An input with too little speech, or whose best language is too uncertain, is
``undetermined`` with its reason instead of a guess; an English-only model cannot tell
at all (``not_detectable``). Child side only: called by stages/asr.py with the
loaded whisperX pipeline; numpy and whisperX are imported lazily.
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


def speech_windows(pipeline, samples, chunk_size: int | None = None) -> list[tuple[float, float]]:
    """(start, end) seconds of the speech windows whisperX's VAD finds in ``samples`` (merged to ``chunk_size``);
    a pipeline without whisperX's VAD (the torch runtime where whisperX is not installed) gives its own."""
    own = getattr(pipeline, "speech_windows", None)
    if own is not None:
        return own(samples, chunk_size or 30)
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
    return [(float(w["start"]), float(w["end"])) for w in merged]


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
    import numpy as np

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
    clips = [
        samples[int(start * SAMPLE_RATE) : int(end * SAMPLE_RATE)][: SAMPLE_RATE * 30]
        for start, end in chosen
    ]
    if hasattr(whisper, "features"):  # the torch runtime: its own log-mel, on its device
        batch = whisper.features(clips)
    else:
        from whisperx.audio import N_SAMPLES, log_mel_spectrogram

        n_mels = whisper.feat_kwargs.get("feature_size") or 80
        features = [log_mel_spectrogram(c, n_mels=n_mels, padding=N_SAMPLES - c.shape[0]) for c in clips]
        batch = np.stack([np.asarray(f, dtype=np.float32) for f in features])
    with model_time():
        results = whisper.model.detect_language(whisper.encode(batch))
    scored = []
    for (start, end), pairs in zip(chosen, results, strict=True):
        scored.append((end - start, [(token[2:-2], p) for token, p in pairs]))
    result = decide(combine(scored, allowed), speech_s, len(chosen), allowed, min_speech_s, min_probability)
    log.info(
        "language: %s (%s) from %d window(s), %.1f s of speech",
        result.language or result.status,
        f"{result.probability:.2f}" if result.probability is not None else result.reason,
        len(chosen),
        speech_s,
    )
    return result
