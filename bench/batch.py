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
    from orchestrator.run.progress import Progress

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
    parser.add_argument("--rounds", type=int, default=1,
                        help="alternate stage-major and one-process this many times and keep the fastest of each "
                             "(steadier on a busy machine)")
    parser.add_argument("--no-per-video", action="store_true", help="skip the slow child-per-video mode")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-batch-"))
    stage_major, one_process, per_video = [], [], None
    try:
        sources = copies(args.source, work / "in", args.videos)
        for r in range(args.rounds):
            stage_major.append(isolated(sources, work / f"stage-major-{r}", chunk_size=args.videos))
            one_process.append(run_in_process(sources, work / f"one-process-{r}")["total_s"])
        if not args.no_per_video:
            per_video = isolated(sources, work / "per-video", chunk_size=1)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    best_stage_major, best_one = min(stage_major), min(one_process)
    print(f"\n{args.videos} copies of {args.source.name}, CPU, embedded models, best of {args.rounds}\n")
    print(f"{'mode':<34} {'wall':>9} {'vs one process':>15}   all rounds")
    rows = [("stage-major (1 chunk of all)", best_stage_major, stage_major), ("one process", best_one, one_process)]
    if per_video is not None:
        rows.insert(1, ("child per stage per video", per_video, [per_video]))
    for name, wall, every in rows:
        print(f"{name:<34} {wall:>8.1f}s {wall / best_one:>14.2f}x   {' '.join(f'{w:.1f}' for w in every)}")
    print(f"\nstage-major vs one process: {100 * (best_stage_major / best_one - 1):+.1f} %")
    if per_video is not None:
        print(f"stage-major is {per_video / best_stage_major:.1f}x faster than a child per stage per video")


if __name__ == "__main__":
    main()
