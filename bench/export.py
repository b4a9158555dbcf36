"""`pipeline export` over 1,000 inputs: one real run's artifacts copied 1,000 times, then timed.

    .venv/bin/python -m bench.export [--inputs 1000] [--run DIR] [--formats srt,vtt,txt,html]

Without --run, one input (tests/fixtures/media/speakers/host_guest.mp4) is processed first, for real.
Each copy is a folder with the run's transcript.json, diarization.json and speaker_embeddings.json (ids
in .ids.json, an "outputs ok" journal line each), so the export reads and validates 1,000 transcripts.
Prints the wall time of the `pipeline export` command (a fresh process, imports included) per format set.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench.common import ROOT


def build(run: Path, out: Path, inputs: int) -> None:
    item = next(p.parent for p in run.glob("*/transcript.json"))
    names = [
        n
        for n in (
            "transcript.json",
            "diarization.json",
            "speaker_embeddings.json",
            "speaker_embeddings.npy",
            "audio.ogg",
        )
        if (item / n).exists()
    ]
    ids, journal = {}, []
    for n in range(inputs):
        target = out / f"talk{n:04d}"
        target.mkdir(parents=True)
        for name in names:
            shutil.copyfile(item / name, target / name)
        ids[f"/corpus/talk{n:04d}.mp4"] = target.name
        journal.append(
            json.dumps(
                {
                    "item": target.name,
                    "stage": "outputs",
                    "status": "ok",
                    "summary": {"notes": [], "duration_s": 18.0},
                }
            )
        )
    (out / ".ids.json").write_text(json.dumps(ids))
    (out / "journal.jsonl").write_text("\n".join(journal) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--inputs", type=int, default=1000)
    parser.add_argument(
        "--run", type=Path, help="an output folder of a finished run (default: process one now)"
    )
    parser.add_argument("--work", type=Path, default=ROOT / ".cache" / "bench-export")
    parser.add_argument("--formats", default="srt,vtt,txt,html;all")
    args = parser.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    run = args.run
    if run is None:
        run = args.work / "run"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "orchestrator.cli",
                "process",
                "-q",
                "-o",
                str(run),
                str(ROOT / "tests/fixtures/media/speakers/host_guest.mp4"),
            ],
            cwd=ROOT,
            check=True,
        )
    out = args.work / "out"
    build(run, out, args.inputs)
    words = sum(
        len(s.get("words") or [])
        for s in json.loads(next(run.glob("*/transcript.json")).read_text())["segments"]
    )
    print(f"{args.inputs} inputs of {words} words each")
    for formats in args.formats.split(";"):
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "orchestrator.cli", "export", str(out), "-f", formats],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        wall = time.perf_counter() - started
        if done.returncode != 0:
            raise SystemExit(done.stderr)
        print(f"export -f {formats}: {wall:.1f} s wall ({done.stderr.strip().splitlines()[-1]})")


if __name__ == "__main__":
    main()
