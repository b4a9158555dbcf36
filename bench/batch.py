"""The same N videos three ways, in one run: stage-major chunks, a child per stage per video, one process.

    .venv/bin/python bench/batch.py [--videos 50] [--source tests/fixtures/media/speech.mp4]

Goal (issue 4): stage-major within 5 % of one process, and at least 5x faster
than a spawned child per stage per video.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import ROOT, copies, run_in_process  # noqa: E402


def isolated(sources: list[str], out: Path, chunk_size: int) -> float:
    from orchestrator import Orchestrator, Settings
    from orchestrator.progress import Progress

    t0 = time.perf_counter()
    with Orchestrator(Settings(output_dir=out, embedding_profile="embedded", device="cpu",
                               chunk_size=chunk_size)) as orch:
        report = orch.process(sources, progress=Progress())
    assert report.ok == len(sources), [i.error for i in report.inputs if i.error]
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--videos", type=int, default=50)
    parser.add_argument("--source", type=Path, default=ROOT / "tests/fixtures/media/speech.mp4")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-batch-"))
    try:
        sources = copies(args.source, work / "in", args.videos)
        stage_major = isolated(sources, work / "stage-major", chunk_size=args.videos)
        per_video = isolated(sources, work / "per-video", chunk_size=1)
        one_process = run_in_process(sources, work / "one-process")["total_s"]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\n{args.videos} copies of {args.source.name}, CPU, embedded models\n")
    print(f"{'mode':<34} {'wall':>9} {'vs one process':>15}")
    for name, wall in [("stage-major (1 chunk of all)", stage_major),
                       ("child per stage per video", per_video), ("one process", one_process)]:
        print(f"{name:<34} {wall:>8.1f}s {wall / one_process:>14.2f}x")
    print(f"\nstage-major is {per_video / stage_major:.1f}x faster than a child per stage per video, "
          f"and {100 * (stage_major / one_process - 1):+.1f} % vs one process")


if __name__ == "__main__":
    main()
