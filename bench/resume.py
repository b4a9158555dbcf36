"""Resume check: a rerun over N already-complete inputs starts no child; how long it takes.

    .venv/bin/python bench/resume.py [--inputs 5000] [--seconds 0.3]

Makes N short WAV files (a quiet tone: no speech, so the first run is quick), runs
``bin/pipeline process DIR`` once to complete them all, then again, and prints both wall
times, how many stage children each started (the run directory's child logs), and
whether every input of the rerun was reused. Goal: the rerun under 5 s at N = 5,000.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import wave
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def make_inputs(directory: Path, count: int, seconds: float) -> None:
    directory.mkdir(parents=True)
    t = np.arange(int(seconds * 16000)) / 16000
    for i in range(count):  # each file different, so each is its own input
        tone = (0.01 * np.sin(2 * np.pi * (200 + i % 500) * t) * 32767).astype("<i2")
        with wave.open(str(directory / f"clip{i:05d}.wav"), "wb") as fh:
            fh.setnchannels(1)
            fh.setsampwidth(2)
            fh.setframerate(16000)
            fh.writeframes(tone.tobytes())


def run(inputs: Path, out: Path) -> tuple[float, int, dict]:
    """(wall seconds, stage children started, the run report)."""
    runs = out / ".runs"
    before = set(runs.iterdir()) if runs.is_dir() else set()
    started = time.perf_counter()
    done = subprocess.run(
        [str(ROOT / "bin" / "pipeline"), "process", str(inputs), "--output", str(out), "--no-speakers", "-q"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"pipeline exited {done.returncode}: {done.stderr[-2000:]}")
    [run_dir] = set(runs.iterdir()) - before
    children = len(list(run_dir.glob("chunk*.log")))
    return wall, children, json.loads((out / "run-report.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--inputs", type=int, default=5000)
    parser.add_argument("--seconds", type=float, default=0.3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        inputs, out = Path(tmp) / "in", Path(tmp) / "out"
        make_inputs(inputs, args.inputs, args.seconds)
        first_s, first_children, first = run(inputs, out)
        again_s, again_children, again = run(inputs, out)
    reused = sum(
        all(s["status"] == "reused" for s in item["stages"].values()) or not item["stages"]
        for item in again["inputs"]
    )
    print(f"inputs: {args.inputs} (complete after the first run: {first['ok']})")
    print(f"first run:  {first_s:8.1f} s, {first_children} stage children")
    print(
        f"rerun:      {again_s:8.1f} s, {again_children} stage children, {again['ok']} ok, "
        f"{reused} with nothing redone"
    )
    print(f"goal: rerun under 5 s -> {'met' if again_s < 5 else 'NOT met'}")


if __name__ == "__main__":
    main()
