"""How stage children start, side by side in one run: warm children (next stage, all later stages) and the
fork server, against one process doing the same work.

    .venv/bin/python bench/startup.py [--inputs 4] [--min-s 10] [--max-s 20] [--rounds 1]

Each candidate runs the real pipeline (``bin/pipeline process``, a fresh process each time, so each starts
its own fork server) over the same inputs, made of the committed speech fixtures as ``bench/batch.py`` makes
them, CPU, embedded embeddings model:

- next/spawn: today's default before this bench: a spawned child per stage, the next stage's warm
- all/spawn: every later stage's child warm at the chunk's start (their imports compete with compute)
- off/forkserver: children forked from a fork server that imported every stage's libraries once
- next/forkserver: the same, the next stage's child forked ahead once the server is ready
- all/forkserver: the same, every later stage's child forked ahead

and the one-process baseline (``bench.common.run_in_process``: every stage in one Python process). It prints
wall, computing and exposed seconds (``run-report.json``), the ratio of the wall to the one process's, and
each candidate's exposed time on the README's first command (one ``speech.mp4``). The candidates run in a
rotating order each round; with ``--rounds`` above 1 each number is the median.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.batch import mixed_inputs
from bench.common import ROOT, run_in_process

#: candidate -> (PIPELINE_PREFETCH, PIPELINE_START_METHOD)
CANDIDATES = {
    "next/spawn": ("next", "spawn"),
    "all/spawn": ("all", "spawn"),
    "off/forkserver": ("off", "forkserver"),
    "next/forkserver": ("next", "forkserver"),
    "all/forkserver": ("all", "forkserver"),
}
README_INPUT = ROOT / "tests" / "fixtures" / "media" / "speech.mp4"


def pipeline(sources: list[str], out: Path, prefetch: str, method: str) -> dict[str, float]:
    """``bin/pipeline process`` over ``sources`` with the candidate's settings: wall (measured here),
    computing and exposed seconds (from its run report)."""
    env = os.environ | {
        "PIPELINE_PREFETCH": prefetch,
        "PIPELINE_START_METHOD": method,
        "EMBEDDING_PROFILE": "embedded",
    }
    t0 = time.perf_counter()
    done = subprocess.run(
        [str(ROOT / "bin" / "pipeline"), "process", *sources, "-o", str(out), "--device", "cpu"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - t0
    report = json.loads((out / "run-report.json").read_text())
    if done.returncode != 0 or report["ok"] != len(sources):
        raise SystemExit(f"{prefetch}/{method} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return {"wall_s": wall, "computing_s": report["computing_s"], "exposed_s": report["exposed_s"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=int, default=4)
    parser.add_argument("--min-s", type=float, default=10.0)
    parser.add_argument("--max-s", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--only", default=",".join(CANDIDATES), help="candidates to run, comma-separated")
    parser.add_argument("--no-readme", action="store_true", help="skip the README command's runs")
    args = parser.parse_args()
    chosen = [name for name in args.only.split(",") if name]
    work = Path(tempfile.mkdtemp(prefix="bench-startup-"))
    try:
        sources, audio_s = mixed_inputs(work / "in", args.inputs, args.min_s, args.max_s, args.seed)
        rows: dict[str, list[dict[str, float]]] = {name: [] for name in [*chosen, "one process"]}
        readme: dict[str, list[float]] = {name: [] for name in chosen}
        for round_ in range(args.rounds):
            order = chosen[round_ % len(chosen) :] + chosen[: round_ % len(chosen)]
            for name in order:
                prefetch, method = CANDIDATES[name]
                out = work / f"{name.replace('/', '-')}-{round_}"
                rows[name].append(pipeline(sources, out, prefetch, method))
                if not args.no_readme:
                    one = pipeline([str(README_INPUT)], out.with_name(out.name + "-readme"), prefetch, method)
                    readme[name].append(one["exposed_s"])
            t0 = time.perf_counter()
            timings = run_in_process(sources, work / f"one-{round_}")
            wall = time.perf_counter() - t0
            computing = sum(timings[s]["compute_s"] or 0.0 for s in timings if s != "total_s")
            rows["one process"].append(
                {"wall_s": wall, "computing_s": computing, "exposed_s": wall - computing}
            )
        one = statistics.median(r["wall_s"] for r in rows["one process"])
        print(
            f"{args.inputs} inputs, {audio_s:.0f} s of audio, {os.cpu_count()} CPUs, "
            f"median of {args.rounds} round(s)"
        )
        columns = (
            ("wall s", 8),
            ("computing s", 12),
            ("exposed s", 10),
            ("/ one", 6),
            ("README exposed s", 17),
        )
        print(f"{'candidate':18s} " + " ".join(f"{name:>{width}s}" for name, width in columns))
        for name, runs in rows.items():
            med = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
            first = f"{statistics.median(readme[name]):17.1f}" if readme.get(name) else f"{'':>17s}"
            print(
                f"{name:18s} {med['wall_s']:8.1f} {med['computing_s']:12.1f} {med['exposed_s']:10.1f} "
                f"{med['wall_s'] / one:6.2f} {first}"
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
