"""Whisper tiny.en (embedded) vs the embedded multilingual Whisper base, side by side in one run.

    .venv/bin/python bench/languages.py [--copies 3] [--threads 2]

Both models are loaded once in this process (CTranslate2 int8 on the CPU, the
ASR stage's own settings) and run the ASR stage's work on each input: VAD,
language identification (stages/whisper/language.py; whisper-base only, tiny.en cannot
identify) and batched transcription. Prints, per model:

* WER on the English fixtures (speech.wav, languages/en.ogg, the two speaker
  dialogues), and for whisper-base the WER on each language clip (de/es/fr);
* audio-hours per hour on a realistic batch: every English fixture and every
  language clip, ``--copies`` times over (wall time of VAD + identification +
  transcription; decoding excluded, as in the pipeline's own ASR stage).
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MEDIA = ROOT / "tests" / "fixtures" / "media"


def dialogue_text(name: str) -> str:
    """The words tests/fixtures/make_media.sh has espeak-ng say in dialogue ``name``."""
    script = (ROOT / "tests" / "fixtures" / "make_media.sh").read_text()
    block = script.split(f"dialogue {name} ", 1)[1].split("\ndialogue ", 1)[0].split("\n\n", 1)[0]
    return " ".join(turn.split("|", 2)[2] for turn in re.findall(r'"([^"]+)"', block))


def english_set() -> dict[str, tuple[Path, str]]:
    from tests.conftest import SPEECH_TEXT

    return {
        "speech.wav": (MEDIA / "speech.wav", SPEECH_TEXT),
        "en.ogg": (MEDIA / "languages" / "en.ogg", (MEDIA / "languages" / "en.txt").read_text()),
        "host_guest.mp4": (MEDIA / "speakers" / "host_guest.mp4", dialogue_text("host_guest")),
        "host_stranger.mp4": (MEDIA / "speakers" / "host_stranger.mp4", dialogue_text("host_stranger")),
    }


def other_set() -> dict[str, tuple[Path, str]]:
    return {
        f"{lang}.ogg": (
            MEDIA / "languages" / f"{lang}.ogg",
            (MEDIA / "languages" / f"{lang}.txt").read_text(),
        )
        for lang in ("de", "es", "fr")
    }


def run_one(model, samples, multilingual: bool):
    from stages.whisper import language

    found = None
    forced = "en"
    if multilingual:
        found = language.identify(model, samples, language.speech_windows(model, samples, 30))
        forced = found.language or (found.top[0].language if found.top else None)
    result = model.transcribe(samples, batch_size=16, language=forced, chunk_size=30)
    return " ".join(s["text"].strip() for s in result["segments"]), found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--copies", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    import whisperx.asr as whisperx_asr
    from faster_whisper import decode_audio

    from stages.runtime.weights import whisper_base_path
    from stages.whisper.models import embedded_model_path
    from tests.conftest import wer

    english, other = english_set(), other_set()
    audio = {
        name: decode_audio(str(path), sampling_rate=16000) for name, (path, _) in {**english, **other}.items()
    }
    models = {
        "tiny.en (embedded)": (str(embedded_model_path()), False),
        "whisper-base (embedded)": (str(whisper_base_path()), True),
    }
    rows = {}
    for label, (path, multilingual) in models.items():
        model = whisperx_asr.load_model(
            path,
            "cpu",
            compute_type="int8",
            language=None if multilingual else "en",
            vad_method="pyannote",
            local_files_only=True,
            threads=args.threads,
        )
        run_one(model, audio["speech.wav"], multilingual)  # warm-up
        scores = {}
        for name, (_, reference) in {**english, **(other if multilingual else {})}.items():
            text, found = run_one(model, audio[name], multilingual)
            scores[name] = (wer(reference, text), found.language if found else "en")
        batch = [audio[name] for name in (*english, *other)] * args.copies
        seconds = sum(len(x) for x in batch) / 16000
        start = time.perf_counter()
        for samples in batch:
            run_one(model, samples, multilingual)
        wall = time.perf_counter() - start
        rows[label] = (scores, seconds, wall)
        del model

    print(f"{'model':26} {'EN WER (4 files)':>17} {'batch audio':>12} {'wall':>8} {'audio-h/h':>10}")
    for label, (scores, seconds, wall) in rows.items():
        en = sum(scores[name][0] for name in english) / len(english)
        print(f"{label:26} {en:17.1%} {seconds:11.0f}s {wall:7.1f}s {seconds / wall:10.1f}")
    print()
    print(f"{'per file':18} " + " ".join(f"{label:>26}" for label in rows))
    for name in (*english, *other):
        cells = []
        for scores, _, _ in rows.values():
            cells.append(
                f"{scores[name][0]:19.1%} ({scores[name][1] or '?'})" if name in scores else f"{'-':>26}"
            )
        print(f"{name:18} " + " ".join(f"{c:>26}" for c in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
