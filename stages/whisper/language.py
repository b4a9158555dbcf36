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

Several languages in one input (an interview switching from English to German): a
window's language is Whisper's guess from its whole 30 s, dominated by its first
speech, so a window of English then German scores English at ~0.9. The speech regions
the VAD found inside each scored window (its segments before they are merged into
``chunk_size`` windows) are therefore scored too, from the window's encoder output
already computed, each with the frames outside it replaced by those of silence
(:func:`region_rankings`: one decoder step per region, no encoder pass). When a window
or a region is confidently of another language (:func:`is_mixed`), every speech
region of the input is identified on its own (:func:`detect_regions`), short or unsure
regions take their neighbours' language (:func:`label_regions`), and the regions are
merged again into decoding windows that never cross a language change
(:func:`language_windows`). An input clearly of one language costs only the regions'
decoder steps. Child side only: called by stages/asr.py with the loaded whisperX
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
#: a speech region of a scored window whose best language is another than the input's, at this probability
#: or more (and above the input's language), makes the input one that may hold several languages
REGION_PROBABILITY = 0.3
#: seconds of a scored window's encoder output kept either side of a region when it is scored alone
REGION_MARGIN_S = 0.2
#: regions scored per scored window, spread over its regions but its first (the window's own score is
#: swayed by its first speech: the later ones are where another language hides). Each costs a decoder step
#: over the window's 1500 frames (~0.1 s on 2 CPU threads); all of a dialogue's regions cost 6 % of its ASR
REGIONS_PER_WINDOW = 2
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
    per_region: Sequence[Sequence[tuple[str, float]]] = (),
    min_probability: float = MIN_PROBABILITY,
    region_probability: float = REGION_PROBABILITY,
) -> bool:
    """Whether an input may hold several languages (pure), from the rankings (best first) of its scored windows
    and of the speech regions inside them: a window at ``min_probability`` or more of another language than the
    input's best, or a region at ``region_probability`` or more of another, likelier there than the input's."""
    if result.status not in ("detected", "undetermined") or not result.top:
        return False
    best = result.top[0].language
    if any(ranked and ranked[0][0] != best and ranked[0][1] >= min_probability for ranked in per_window):
        return True
    for ranked in per_region:
        if ranked and ranked[0][0] != best and ranked[0][1] >= region_probability:
            return True
    return False


def _encode(pipeline, clips: list):
    """The encoder output of these clips (each at most 30 s, padded to Whisper's window), on the model's device."""
    import numpy as np

    whisper = pipeline.model
    if hasattr(whisper, "features"):  # the torch runtime: its own log-mel, on its device
        batch = whisper.features(clips)
    else:
        from whisperx.audio import N_SAMPLES, log_mel_spectrogram

        n_mels = whisper.feat_kwargs.get("feature_size") or 80
        features = [log_mel_spectrogram(c, n_mels=n_mels, padding=N_SAMPLES - c.shape[0]) for c in clips]
        batch = np.stack([np.asarray(f, dtype=np.float32) for f in features])
    with model_time():
        return whisper.encode(batch)


def _codes(pairs) -> list[tuple[str, float]]:
    """Whisper's language ranking with each token (``<|de|>``) as its language code (``de``)."""
    return [(token[2:-2], p) for token, p in pairs]


def _detect(pipeline, encoded) -> list:
    with model_time():
        return pipeline.model.model.detect_language(encoded)


def _as_tensor(encoded):
    """An encoder output as a torch tensor (CTranslate2's StorageView viewed, on its device)."""
    import numpy as np
    import torch

    if isinstance(encoded, torch.Tensor):
        return encoded
    if encoded.device == "cuda":
        return torch.as_tensor(encoded, device=f"cuda:{encoded.device_index}")
    return torch.as_tensor(np.asarray(encoded))


def _as_encoded(tensor, like):
    """A torch tensor of encoder output in the runtime's own type (that of ``like``)."""
    import torch

    if isinstance(like, torch.Tensor):
        return tensor
    import ctranslate2

    tensor = tensor.contiguous()
    return ctranslate2.StorageView.from_array(tensor if tensor.is_cuda else tensor.numpy())


def region_rankings(
    pipeline,
    encoded,
    chosen: Sequence[tuple[float, float]],
    regions: Sequence[tuple[float, float]],
    allowed: Sequence[str] = (),
    min_region_s: float = MIN_REGION_S,
    per_window: int = REGIONS_PER_WINDOW,
) -> list[list[tuple[str, float]]]:
    """Up to ``per_window`` speech regions (of ``min_region_s`` or more; spread over all but the first) inside
    each scored window that holds several: each one's language ranking from that window's encoder output
    (``encoded``, already computed to score the window), with every frame outside the region
    (``REGION_MARGIN_S`` either side) replaced by the encoder output of silence. One decoder step per region,
    no encoder pass but one of silence per child: what keeps the check cheap on an input of one language."""
    import numpy as np
    import torch

    inside = []
    for k, (start, end) in enumerate(chosen):
        mine = [(a - start, b - start) for a, b in regions if a >= start - 1e-3 and b <= end + 1e-3]
        later = [(a, b) for a, b in mine[1:] if b - a >= min_region_s]
        inside += [(k, a, b) for a, b in spread(later, per_window)]
    if not inside:
        return []
    whole = _as_tensor(encoded)
    if getattr(pipeline, "_silent_frames", None) is None:
        pipeline._silent_frames = _as_tensor(_encode(pipeline, [np.zeros(160, dtype=np.float32)]))[0].clone()
    silence = pipeline._silent_frames
    per_s = whole.shape[1] / 30.0  # Whisper's encoder: 50 frames a second
    masked = []
    for k, a, b in inside:
        first = max(0, int((a - REGION_MARGIN_S) * per_s))
        last = min(whole.shape[1], int(np.ceil((b + REGION_MARGIN_S) * per_s)))
        frames = silence.clone()
        frames[first:last] = whole[k, first:last]
        masked.append(frames)
    results = _detect(pipeline, _as_encoded(torch.stack(masked), encoded))
    return [combine([(1.0, _codes(pairs))], allowed) for pairs in results]


def _scores(pipeline, samples, spans: Sequence[tuple[float, float]], batch_size: int = 16) -> list:
    """Whisper's language ranking ([(token, probability)], best first) of each span of ``samples``."""
    out = []
    for first in range(0, len(spans), batch_size):
        clips = [
            samples[int(start * SAMPLE_RATE) : int(end * SAMPLE_RATE)][: SAMPLE_RATE * 30]
            for start, end in spans[first : first + batch_size]
        ]
        out += _detect(pipeline, _encode(pipeline, clips))
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
        ranked = combine([(1.0, _codes(pairs))], allowed)
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
    labels: list[str | None] = [f[0] if f is not None and f[1] >= min_probability else None for f in found]
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
    regions: Sequence[tuple[float, float]] | None = None,
) -> LanguageId:
    """Identify the language of ``samples`` (16 kHz mono float32) from its VAD ``windows`` (seconds); with the
    VAD's ``regions``, also whether it may hold several languages (``mixed``: :func:`is_mixed`)."""
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
    encoded = _encode(pipeline, clips)
    results = _detect(pipeline, encoded)
    scored = []
    for (start, end), pairs in zip(chosen, results, strict=True):
        scored.append((end - start, _codes(pairs)))
    result = decide(combine(scored, allowed), speech_s, len(chosen), allowed, min_speech_s, min_probability)
    if regions is not None:
        per_window = [combine([(1.0, pairs)], allowed) for _, pairs in scored]
        per_region = region_rankings(pipeline, encoded, chosen, regions, allowed)
        result = result.model_copy(
            update={"mixed": is_mixed(result, per_window, per_region, min_probability)}
        )
    log.info(
        "language: %s (%s) from %d window(s), %.1f s of speech%s",
        result.language or result.status,
        f"{result.probability:.2f}" if result.probability is not None else result.reason,
        len(chosen),
        speech_s,
        "; not clearly one language: its speech regions are identified one by one" if result.mixed else "",
    )
    return result
