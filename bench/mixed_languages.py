"""Inputs of several languages: the ASR stage vs faster-whisper's ``multilingual=True``, side by side in one run.

    .venv/bin/python bench/mixed_languages.py [--threads 2] [--repeats 3]

Recordings built from the committed language clips, 1.5 s of silence apart (as
tests/stages/test_asr_languages.py builds them): English then German, and English,
Spanish, English. Both systems run the embedded whisper-base (the same CTranslate2
directory), int8 on the CPU:

* ours: the ASR stage (stages/asr.py) in this process, as a child runs it (VAD,
  language identification per speech region where an input is not clearly one
  language, decoding, word timing);
* faster-whisper 1.2.1 ``WhisperModel.transcribe(multilingual=True,
  word_timestamps=True)``: a language per 30 s segment (its segments do not say
  which: the language column shows the one it reports for the file, with a ``*``).

Each word goes to the part of the recording its middle falls in; prints, per part,
the language it was decoded in and its WER against the clip's reference. Then the
cost on an English-only corpus (the English fixtures, twice): the ASR stage's
compute seconds with ``multilingual`` on and off (the best of ``--repeats`` runs
each, alternated), and the seconds spent in the per-region check itself
(``language.region_rankings``, timed inside the "on" runs).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

LANGUAGES = ROOT / "tests" / "fixtures" / "media" / "languages"
RECORDINGS = {"en_de": ("en", "de"), "en_es_en": ("en", "es", "en")}
GAP_S = 1.5


def parts(clips) -> list[tuple[float, float]]:
    """Each clip's (start, end) in the built recording."""
    import soundfile as sf

    out, at = [], 0.0
    for lang in clips:
        seconds = sf.info(str(LANGUAGES / f"{lang}.ogg")).duration
        out.append((at, at + seconds))
        at += seconds + GAP_S
    return out


def split(words: list[tuple[float, float, str, str]], spans) -> list[tuple[str, str]]:
    """(text, languages) of each span from (start, end, word, language) words, by each word's middle."""
    out = []
    for n, (start, end) in enumerate(spans):
        low = start - GAP_S / 2 if n else -1e9
        high = end + GAP_S / 2 if n < len(spans) - 1 else 1e9
        mine = [w for w in words if low <= (w[0] + w[1]) / 2 < high]
        out.append((" ".join(w[2] for w in mine), "/".join(dict.fromkeys(w[3] for w in mine)) or "-"))
    return out


def ours(tmp: Path, audio: dict, **settings):
    from tests.stages.test_asr import run_asr_stage

    tmp.mkdir(parents=True, exist_ok=True)
    result, transcripts, _ = run_asr_stage(
        tmp, audio, 16, {"model": "whisper-base", "runtime": "ctranslate2", **settings}
    )
    assert all(r.ok for r in result.items), result.items
    return result, transcripts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cost-only", action="store_true", help="only the cost on the English-only corpus")
    args = parser.parse_args()

    from faster_whisper import WhisperModel, decode_audio

    from contracts import AudioArtifact, load_artifact
    from stages.runtime.weights import whisper_base_path
    from stages.whisper import language
    from tests.conftest import wer
    from tests.stages.test_asr import decode_audio as stage_audio
    from tests.stages.test_asr_languages import build_recording
    from tests.stages.test_asr_torch import ENGLISH

    tmp = Path(tempfile.mkdtemp(prefix="mixed-languages-"))
    sources = {}
    for name, clips in RECORDINGS.items():
        build_recording(tmp / f"{name}.wav", clips)
        sources[name] = tmp / f"{name}.wav"
    audio = stage_audio(tmp, sources)
    refs = {lang: (LANGUAGES / f"{lang}.txt").read_text() for lang in ("en", "de", "es")}

    rows = []  # (recording, part, system, language, WER)
    _, transcripts = ({}, {}) if args.cost_only else ours(tmp / "ours", audio, join_inputs=False)
    for name, clips in RECORDINGS.items() if not args.cost_only else ():
        t = transcripts[name]
        words = [
            (w.start, w.end, w.word, s.language or t.language)
            for s in t.segments
            for w in s.words or []
            if w.start is not None
        ]
        for n, (text, found) in enumerate(split(words, parts(clips))):
            rows.append((name, f"{n + 1}:{clips[n]}", "ours", found, wer(refs[clips[n]], text)))

    model = WhisperModel(str(whisper_base_path()), "cpu", compute_type="int8", cpu_threads=args.threads)
    for name, clips in RECORDINGS.items() if not args.cost_only else ():
        samples = decode_audio(str(sources[name]), sampling_rate=16000)
        segments, info = model.transcribe(samples, multilingual=True, word_timestamps=True)
        words = []
        for (
            seg
        ) in segments:  # (its segments do not say their language: the file's first is printed, with a *)
            words += [(w.start, w.end, w.word, f"{info.language}*") for w in seg.words or []]
        for n, (text, found) in enumerate(split(words, parts(clips))):
            rows.append((name, f"{n + 1}:{clips[n]}", "faster-whisper", found, wer(refs[clips[n]], text)))
    del model

    print(
        f"{'recording':10} {'part':6} {'ours: lang':>11} {'WER':>7} {'faster-whisper: lang':>21} {'WER':>7}"
    )
    for name, clips in RECORDINGS.items() if not args.cost_only else ():
        for n in range(len(clips)):
            part = f"{n + 1}:{clips[n]}"
            mine = next(r for r in rows if r[:3] == (name, part, "ours"))
            theirs = next(r for r in rows if r[:3] == (name, part, "faster-whisper"))
            print(f"{name:10} {part:6} {mine[3]:>11} {mine[4]:7.1%} {theirs[3]:>21} {theirs[4]:7.1%}")

    # the cost on an English-only corpus: the stage's compute seconds with the per-region check on and off
    (tmp / "english").mkdir()
    english = stage_audio(tmp / "english", {f"{k}{c}": v for c in (1, 2) for k, v in ENGLISH.items()})
    spent = []
    rankings = language.region_rankings

    def timed(*a, **k):
        t0 = time.perf_counter()
        try:
            return rankings(*a, **k)
        finally:
            spent.append(time.perf_counter() - t0)

    language.region_rankings = timed
    best = {True: float("inf"), False: float("inf")}
    check = []
    mixed = 0
    for r in range(args.repeats):
        for on in (True, False):
            spent.clear()
            result, out = ours(tmp / f"cost-{r}-{on}", english, multilingual=on)
            best[on] = min(best[on], result.compute_s)
            if on:
                check.append(sum(spent))
                mixed += sum(t.language_id.regions > 0 for t in out.values())
    language.region_rankings = rankings
    seconds = sum(load_artifact(p, AudioArtifact).duration_s for p in english.values())
    print()
    print(
        f"English-only corpus: {len(english)} inputs, {seconds:.0f} s of audio, best of {args.repeats} runs each"
    )
    print(f"{'multilingual':13} {'ASR compute':>12}")
    print(f"{'off':13} {best[False]:11.2f}s")
    print(f"{'on':13} {best[True]:11.2f}s  ({best[True] / best[False] - 1:+.1%})")
    print(
        f"per-region check itself: {min(check):.2f} s per run ({min(check) / best[False]:.1%} of the compute "
        f"without it); inputs whose regions were identified one by one: {mixed // args.repeats}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
