"""Cost of isolation: N inputs through spawned stage children vs the same work in one process.

    .venv/bin/python bench/isolation.py [--copies 8] [--source tests/fixtures/media/speech.mp4]

Prints, per stage, the wall time split into spawn+import+exit, model load and
compute for the isolated run (one child per stage, all inputs in it), then the
same stages run in one process (imports once, same model loads), and the ratio.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import ROOT, copies, run_in_process


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--copies", type=int, default=8)
    parser.add_argument("--source", type=Path, default=ROOT / "tests/fixtures/media/speech.mp4")
    args = parser.parse_args()

    from orchestrator import Orchestrator, Settings

    work = Path(tempfile.mkdtemp(prefix="bench-isolation-"))
    try:
        sources = copies(args.source, work / "in", args.copies)

        t0 = time.perf_counter()
        with Orchestrator(
            Settings(output_dir=work / "isolated", embedding_profile="embedded", device="cpu")
        ) as orch:
            report = orch.process(sources)
        isolated_total = time.perf_counter() - t0
        assert report.ok == args.copies, [i.error for i in report.inputs if i.error]

        inproc = run_in_process(sources, work / "inproc")
    finally:
        shutil.rmtree(work, ignore_errors=True)

    audio_s = args.copies * 12.8 if args.source.name == "speech.mp4" else float("nan")
    print(f"\n{args.copies} copies of {args.source.name} on CPU (embedded models)\n")
    print(
        f"{'stage':<11} {'isolated wall':>13} {'spawn+import+exit':>18} {'load':>7} {'compute':>8} | "
        f"{'in-process wall':>15} {'import':>7} {'load':>7} {'compute':>8}"
    )
    for run in report.stages:
        a = run.attempts[0]
        other = a.wall_s - (a.load_s or 0) - (a.compute_s or 0)
        p = inproc[run.stage]
        print(
            f"{run.stage:<11} {a.wall_s:>12.2f}s {other:>17.2f}s {a.load_s:>6.2f}s {a.compute_s:>7.2f}s | "
            f"{p['wall_s']:>14.2f}s {p['import_s']:>6.2f}s {p['load_s']:>6.2f}s {p['compute_s']:>7.2f}s"
        )
    print(
        f"\ntotal: isolated {isolated_total:.2f}s, in-process {inproc['total_s']:.2f}s, "
        f"ratio isolated/in-process = {isolated_total / inproc['total_s']:.2f}x"
    )
    if audio_s == audio_s:
        print(
            f"audio processed: {audio_s:.0f}s; real-time factor isolated {isolated_total / audio_s:.3f}, "
            f"in-process {inproc['total_s'] / audio_s:.3f}"
        )


if __name__ == "__main__":
    main()
