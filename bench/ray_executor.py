"""Local executor vs Ray executor on one machine: the same N videos, the same chunks, side by side.

    .venv/bin/python bench/ray_executor.py [--videos 50] [--chunk-size 25] [--speakers]

Both runs process the chunks one at a time (``parallel_chunks=1``), so the
difference is what Ray adds per stage task: scheduling, a worker process per
call (``max_calls=1``) and the task's round trip, on top of the same spawned
child. The per-task costs printed at the end (wall of each attempt minus the
child's own import + load + compute) feed the estimate in docs/scale-out.md.
A local Ray cluster is started for the Ray run (its start-up is timed apart).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import ROOT, copies  # noqa: E402


def run(sources: list[str], out: Path, executor: str, chunk_size: int, speakers: bool, parallel: int):
    from orchestrator import Orchestrator, Settings
    from orchestrator.pipeline import make_executor
    from orchestrator.progress import Progress

    settings = Settings(output_dir=out, embedding_profile="embedded", device="cpu", chunk_size=chunk_size,
                        speakers=speakers, executor=executor, parallel_chunks=parallel, ray_num_cpus=os.cpu_count(),
                        ray_cpus_per_task=os.cpu_count())  # like the local child: the whole machine (Ray sets
    # OMP_NUM_THREADS to the task's CPUs)
    t0 = time.perf_counter()
    backend = make_executor(settings)
    startup = time.perf_counter() - t0
    t1 = time.perf_counter()
    with Orchestrator(settings, executor=backend) as orch:
        report = orch.process(sources, progress=Progress())
    wall = time.perf_counter() - t1
    assert report.ok == len(sources), [i.error for i in report.inputs if i.error]
    return wall, startup, report


def task_costs(report) -> dict[str, float]:
    """Per stage: mean seconds of an attempt outside the child's own import + load + compute."""
    costs: dict[str, list[float]] = {}
    for stage in report.stages:
        for attempt in stage.attempts:
            own = (attempt.import_s or 0.0) + (attempt.load_s or 0.0) + (attempt.compute_s or 0.0)
            costs.setdefault(stage.stage, []).append(attempt.wall_s - own)
    return {stage: statistics.mean(values) for stage, values in costs.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--videos", type=int, default=50)
    parser.add_argument("--chunk-size", type=int, default=25)
    parser.add_argument("--source", type=Path, default=ROOT / "tests/fixtures/media/speech.mp4")
    parser.add_argument("--speakers", action="store_true", help="also diarize (off: ASR + alignment + embeddings)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-ray-"))
    try:
        sources = copies(args.source, work / "in", args.videos)
        local_wall, _, local = run(sources, work / "local", "local", args.chunk_size, args.speakers, 1)
        ray_wall, ray_start, ray = run(sources, work / "ray", "ray", args.chunk_size, args.speakers, 1)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    load = os.getloadavg()
    print(f"\n{args.videos} copies of {args.source.name}, chunks of {args.chunk_size}, one chunk at a time, CPU, "
          f"embedded models, speakers {'on' if args.speakers else 'off'}; load average {load[0]:.1f}\n")
    print(f"{'executor':<10} {'wall':>9} {'audio h/h':>10} {'tasks':>6}")
    for name, wall, report in (("local", local_wall, local), ("ray", ray_wall, ray)):
        tasks = sum(len(s.attempts) for s in report.stages)
        print(f"{name:<10} {wall:>8.1f}s {report.audio_s / wall:>10.1f} {tasks:>6}")
    print(f"\nray / local: {ray_wall / local_wall:.3f}x  (ray cluster start-up, not included: {ray_start:.1f}s)")
    print("\nper stage task, seconds outside the child's import + load + compute (spawn, scheduling, exit):")
    local_costs, ray_costs = task_costs(local), task_costs(ray)
    print(f"{'stage':<12} {'local':>8} {'ray':>8} {'ray extra':>10}")
    for stage in local_costs:
        extra = ray_costs[stage] - local_costs[stage]
        print(f"{stage:<12} {local_costs[stage]:>7.2f}s {ray_costs[stage]:>7.2f}s {extra:>9.2f}s")
    per_video = {name: statistics.mean(
        [a.compute_s or 0.0 for s in r.stages for a in s.attempts]) for name, r in (("local", local), ("ray", ray))}
    print(f"\nmean compute per stage task: local {per_video['local']:.2f}s, ray {per_video['ray']:.2f}s")


if __name__ == "__main__":
    main()
