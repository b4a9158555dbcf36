"""A speaker on each channel: ``separate`` vs each channel transcribed alone, and ``mix``, side by side.

    .venv/bin/python bench/channels.py [--model embedded]

Builds the two-speaker stereo recording of the tests (tests/fixtures/generate.py: ``channel_recordings``:
the Caller on the left, languages/en.ogg's voice on the right from 2.5 s, over the Caller's), writes each
of its channels alone as a mono file, and runs ``bin/pipeline process`` (real children, no speakers,
offline) three times:

* ``--channels separate`` on the stereo recording: WER of each channel's segments against its reference;
* ``--channels mix`` on each channel alone (mono files) and on the stereo recording: each channel's WER
  alone (the goal: ``separate`` within 0.05 of it), and the mix's WER over both references (in the order
  that suits it best: overlapping speech has no one order);
* ``--channels auto`` on a stereo copy of speech.wav and on speech.wav itself: the same text or not.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def run(inputs: Path, out: Path, model: str, *options: str) -> float:
    """``pipeline process INPUTS --output OUT OPTIONS`` (no speakers, offline); its wall seconds."""
    env = {**os.environ, "ASR_MODEL": model}
    command = [sys.executable, "-m", "orchestrator.cli", "process", str(inputs), "--output", str(out)]
    done = subprocess.run(
        [*command, "--no-speakers", "--offline", *options], cwd=ROOT, env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(done.stderr[-3000:])
    return json.loads((out / "run-report.json").read_text())["wall_s"]


def text(out: Path, item: str, channel: int | None = None) -> str:
    from contracts import TranscriptArtifact, load_artifact

    transcript = load_artifact(out / item / "transcript.json", TranscriptArtifact)
    return " ".join(s.text for s in transcript.segments if channel is None or s.channel == channel)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="embedded", help="ASR_MODEL (default: embedded, tiny.en)")
    args = parser.parse_args()

    import numpy as np

    from tests.conftest import MEDIA, normalise, wer
    from tests.fixtures.generate import CALLER_TEXT, channel_recordings, write_channels

    references = [CALLER_TEXT, (MEDIA / "languages" / "en.txt").read_text().strip()]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        made = channel_recordings(tmp / "made")
        stereo = tmp / "stereo"
        stereo.mkdir()
        (stereo / "call.wav").write_bytes(made["two_speakers"].read_bytes())
        alone = tmp / "alone"
        import wave

        with wave.open(str(made["two_speakers"])) as fh:
            frames = np.frombuffer(fh.readframes(fh.getnframes()), "<i2").reshape(-1, 2) / 32768
        for c, name in enumerate(("left", "right")):
            write_channels(alone / f"{name}.wav", [frames[:, c].astype(np.float32)])
        copies = tmp / "copies"
        copies.mkdir()
        (copies / "stereo_copy.wav").write_bytes(made["copy"].read_bytes())
        (copies / "mono.wav").write_bytes(made["mono"].read_bytes())

        walls = {
            "separate": run(stereo, tmp / "out-separate", args.model, "--channels", "separate"),
            "alone": run(alone, tmp / "out-alone", args.model, "--channels", "mix"),
            "mix": run(stereo, tmp / "out-mix", args.model, "--channels", "mix"),
            "auto": run(copies, tmp / "out-auto", args.model, "--channels", "auto"),
        }
        separate = [
            wer(ref, text(tmp / "out-separate", "stereo/call", c)) for c, ref in enumerate(references)
        ]
        single = [
            wer(ref, text(tmp / "out-alone", f"alone/{n}")) for n, ref in zip(("left", "right"), references)
        ]
        mixed = text(tmp / "out-mix", "stereo/call")
        text_left, text_right = (text(tmp / "out-separate", "stereo/call", c) for c in (0, 1))
        mix_wer = min(wer(" ".join(references), mixed), wer(" ".join(reversed(references)), mixed))
        copy_text = normalise(text(tmp / "out-auto", "copies/stereo_copy"))
        mono_text = normalise(text(tmp / "out-auto", "copies/mono"))

    print(
        f"model: {args.model}; the two-speaker stereo recording ({len(frames) / 16000:.1f} s, overlap 2.5-8.0 s)"
    )
    print(f"{'channel':<10}{'separate WER':>14}{'alone WER':>11}{'diff':>8}")
    for c, name in enumerate(("1 (left)", "2 (right)")):
        print(f"{name:<10}{separate[c]:>14.3f}{single[c]:>11.3f}{separate[c] - single[c]:>+8.3f}")
    print(f"mix (both references, best order): WER {mix_wer:.3f}")
    print(
        f"wall s: separate {walls['separate']:.1f}, each channel alone {walls['alone']:.1f} (2 inputs), "
        f"mix {walls['mix']:.1f}"
    )
    print(f"stereo copy under auto == its mono source: {copy_text == mono_text} ({copy_text[:60]!r}...)")
    print(f"separate, channel 1: {text_left!r}")
    print(f"separate, channel 2: {text_right!r}")
    print(f"mix: {mixed!r}")


if __name__ == "__main__":
    main()
