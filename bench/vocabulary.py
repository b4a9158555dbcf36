"""Vocabulary and translation, measured on the committed fixtures with the ASR stage itself (CPU, int8).

    .venv/bin/python bench/vocabulary.py [--copies 3] [--only names|translate] [--cut]

* Names Whisper misspells (tests/fixtures/media/names: six espeak-ng sentences
  with 17 name words such as Siobhan Kowalczyk, Przybylski, Wojciechowski): the
  share of name words missing from the transcript (case and punctuation aside),
  without vocabulary and with the names as a folder ``vocabulary.txt`` (one
  ``WorkItem.vocabulary`` file, as the parent sends it), for tiny.en (embedded)
  and the multilingual whisper-base.
* The cost of ``--translate`` (whisper-base, languages/{de,es,fr}.ogg, once
  each, then each ``--copies`` times: the copies of a language share joined
  windows; with ``--cut`` also each clip cut at its pause into two clips,
  ``--copies`` times): the seconds of the second decode (``AsrStage._translate``, over the
  transcription's encoder output) over the stage's compute seconds without
  translation (VAD, language identification, encode, decode, word timing), and
  the windows the encoder ran over (``AsrStage._encode``) without and with
  translation; the run without translation is repeated after, to show the
  machine's noise.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MEDIA = ROOT / "tests" / "fixtures" / "media"
NAMES = MEDIA / "names"
#: the names each sentence holds (what a corpus would list in its vocabulary.txt)
SPOKEN_NAMES = {
    "minutes": ["Siobhan Kowalczyk"],
    "chair": ["Nguyen", "Okonkwo"],
    "guest": ["Aoife Przybylski", "Warsaw"],
    "contract": ["Joaquim Ferreira", "Ingrid Szczepanski"],
    "project": ["Tadhg Wojciechowski", "Rzeszow"],
    "results": ["Niamh Oyelaran", "Reykjavik"],
}


def _words(text: str) -> list[str]:
    return [w for w in re.sub(r"[^\w\s']", " ", text.lower()).split() if w]


def misspelled(transcripts: dict[str, str]) -> tuple[int, int, list[str]]:
    """(name words missing from their transcript, name words, the missing ones)."""
    missing, total = [], 0
    for clip, names in SPOKEN_NAMES.items():
        heard = set(_words(transcripts[clip]))
        for word in (w for name in names for w in _words(name)):
            total += 1
            if word not in heard:
                missing.append(word)
    return len(missing), total, missing


def decode(tmp: Path, sources: dict[str, Path]) -> dict[str, Path]:
    from tests.stages.test_asr import decode_audio

    return decode_audio(tmp, sources)


def run_asr(tmp: Path, audio: dict[str, Path], vocabulary=None, spy=None, **settings):
    """The ASR stage in this process; (StageResult, transcripts by id)."""
    from contracts import StageRequest, TranscriptArtifact, WorkItem, load_artifact
    from stages.asr import AsrStage
    from tests.conftest import stage_settings

    tmp.mkdir(parents=True, exist_ok=True)
    items = [
        WorkItem(
            id=name,
            inputs={"audio": str(path)},
            output=str(tmp / f"{name}.json"),
            fingerprint="fp",
            vocabulary=list(vocabulary or []),
        )
        for name, path in audio.items()
    ]
    stage = AsrStage()
    if spy is not None:
        spy(stage)
    result = stage.run(
        StageRequest(
            request_id="r",
            stage="asr",
            module="stages.asr",
            batch_size=8,
            device="cpu",
            settings=stage_settings("asr", **settings),
            result_path=str(tmp / "result.json"),
            items=items,
        )
    )
    bad = [r for r in result.items if not r.ok]
    if bad:
        raise SystemExit(f"ASR failed: {bad}")
    return result, {r.id: load_artifact(r.output, TranscriptArtifact) for r in result.items}


def names_bench(tmp: Path) -> None:
    from contracts.artifacts import VocabularyFile

    audio = decode(tmp / "names-audio", {name: NAMES / f"{name}.ogg" for name in SPOKEN_NAMES})
    folder = VocabularyFile(
        level="folder",
        path=str(NAMES / "vocabulary.txt"),
        terms=[n for ns in SPOKEN_NAMES.values() for n in ns],
    )
    print("misspelled name words (of the names spoken in tests/fixtures/media/names):")
    for model in ("embedded", "whisper-base"):
        for label, vocabulary in (("no vocabulary", None), ("folder vocabulary.txt", [folder])):
            _, transcripts = run_asr(
                tmp / f"{model}-{bool(vocabulary)}", audio, vocabulary, model=model, language="en"
            )
            texts = {k: " ".join(s.text for s in t.segments) for k, t in transcripts.items()}
            wrong, total, which = misspelled(texts)
            print(
                f"  {model:13s} {label:22s} {wrong:2d}/{total} = {wrong / total:5.1%}  missing: {' '.join(which)}"
            )


def translate_bench(tmp: Path, copies: int, cut: bool = False) -> None:
    """The second decode's cost with each clip once (a window of one input each) and ``copies`` times (the
    copies of a language transcribed in joined windows), side by side; ``cut``: also each clip cut at its
    pause into two clips, ``copies`` times."""
    print(
        "--translate, whisper-base int8, CPU (de, es, fr; the second decode over the ASR compute without it):"
    )
    print(
        "  inputs | compute without (again) | with | second decode | ratio (goal <= 0.6x) | windows encoded"
    )
    rows = [translate_cost(tmp / f"x{n}", n) for n in dict.fromkeys((1, copies))]
    if cut:
        rows.append(translate_cost(tmp / "cut", copies, cut=True))
    for _, plain, again, both, spent, encoded, what in rows:
        print(
            f"  {what} | {plain:6.2f} s ({again:.2f} s) | "
            f"{both:6.2f} s | {spent:6.2f} s | {spent / plain:.2f}x | {encoded[False]} without, {encoded[True]} with"
        )


#: where each language clip pauses (s): after "kalt,", "frío,", "froid,"
PAUSES = {"de": 1.9, "es": 1.9, "fr": 1.7}


def translate_cost(tmp: Path, copies: int, cut: bool = False) -> tuple:
    """(copies, compute s without translation, the same again, with, s in ``AsrStage._translate``, windows
    encoded {translate: count}, what) over de, es, fr each ``copies`` times (``cut``: each cut at its pause
    into two clips, ``copies`` times)."""
    from stages.asr import AsrStage

    sources = {
        f"{lang}{n}": MEDIA / "languages" / f"{lang}.ogg"
        for lang in ("de", "es", "fr")
        for n in range(1 if cut else copies)
    }
    audio = decode(tmp / "lang-audio", sources)
    what = f"{len(audio):2d} ({'alone' if copies == 1 else f'x{copies} joined'})"
    if cut:
        import numpy as np

        from contracts import AudioArtifact, load_artifact
        from tests.stages.test_asr import wav_16k

        halves = {}
        for lang in ("de", "es", "fr"):
            path = audio[f"{lang}0"]
            samples = np.load(path.parent / load_artifact(path, AudioArtifact).sidecar)
            at = int(PAUSES[lang] * 16000)
            halves[f"{lang}a"] = Path(wav_16k(tmp / f"{lang}a.wav", samples[:at]))
            halves[f"{lang}b"] = Path(wav_16k(tmp / f"{lang}b.wav", samples[at:]))
        audio = decode(
            tmp / "cut-audio", {f"{name}{n}": path for n in range(copies) for name, path in halves.items()}
        )
        what = f"{len(audio):2d} (halves x{copies} joined)"
    spent = {"translate": 0.0}
    encoded = {False: 0, True: 0}

    def spy(translating: bool):
        def wrap(stage: AsrStage) -> None:
            inner, encode = stage._translate, stage._encode

            def translate(*args, **kwargs):
                started = time.perf_counter()
                try:
                    return inner(*args, **kwargs)
                finally:
                    spent["translate"] += time.perf_counter() - started

            def counted(pieces):
                encoded[translating] += len(pieces)
                return encode(pieces)

            stage._translate, stage._encode = translate, counted

        return wrap

    run_asr(tmp / "warm", dict(list(audio.items())[:1]), model="whisper-base")  # caches warm
    plain, _ = run_asr(tmp / "plain", audio, spy=spy(False), model="whisper-base")
    spent["translate"] = 0.0
    both, transcripts = run_asr(tmp / "both", audio, spy=spy(True), model="whisper-base", translate=True)
    again, _ = run_asr(tmp / "again", audio, model="whisper-base")  # the same again: the machine's noise
    for name in audio:
        t = transcripts[name]
        print(
            f"  {name} ({t.language}): {' '.join(s.text for s in t.segments)!r} -> "
            f"{' '.join(s.text for s in t.translation or [])!r}"
        )
    return copies, plain.compute_s, again.compute_s, both.compute_s, spent["translate"], encoded, what


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--copies", type=int, default=3)
    parser.add_argument(
        "--cut", action="store_true", help="translate: also each clip cut at its pause in two"
    )
    parser.add_argument("--only", choices=["names", "translate"], default=None)
    args = parser.parse_args()
    import logging

    logging.basicConfig(level=logging.ERROR)
    with tempfile.TemporaryDirectory() as tmp:
        if args.only in (None, "names"):
            names_bench(Path(tmp))
        if args.only in (None, "translate"):
            translate_bench(Path(tmp), args.copies, args.cut)


if __name__ == "__main__":
    main()
