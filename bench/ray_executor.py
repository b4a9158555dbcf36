"""Local executor vs Ray executor on one machine: the same N videos, the same chunks, side by side.

    .venv/bin/python bench/ray_executor.py [--videos 50] [--chunk-size 25] [--speakers]

Every run processes the chunks one at a time (``parallel_chunks=1``), so the
difference is what Ray adds per stage task: scheduling, a worker process per
call (``max_calls=1``) and the task's round trip, on top of the same spawned
child, and the warm start it cannot do. A third run, local without warm start,
separates the two; its per-task walls against Ray's feed the estimate in
docs/scale-out.md.
A local Ray cluster is started for the Ray run (its start-up is timed apart).

    .venv/bin/python bench/ray_executor.py --nodes [--videos 12] [--chunk-size 3]

compares the local executor with Ray on a 1-node and on a 3-node cluster on
this machine (``ray.cluster_utils.Cluster``: a head that places no tasks and two
workers), the same inputs one chunk at a time: what spreading the tasks over
raylets costs, as a ratio to the local run.
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

from bench.common import ROOT, copies


def run(
    sources: list[str],
    out: Path,
    executor: str,
    chunk_size: int,
    speakers: bool,
    parallel: int,
    prefetch: bool = True,
    address: str | None = None,
):
    from orchestrator import Orchestrator, Settings
    from orchestrator.run.pipeline import make_executor
    from orchestrator.run.progress import Progress

    settings = Settings(
        output_dir=out,
        embedding_profile="embedded",
        device="cpu",
        chunk_size=chunk_size,
        speakers=speakers,
        executor=executor,
        parallel_chunks=parallel,
        ray_num_cpus=os.cpu_count(),
        ray_cpus_per_task=os.cpu_count(),
        prefetch=prefetch,
        ray_address=address,
    )  # like the local child: the whole machine (Ray sets
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


def _per_stage(report) -> dict[str, tuple[float, float, float]]:
    """stage -> mean (attempt wall, child import, child compute) over its attempts."""
    rows: dict[str, list[tuple[float, float, float]]] = {}
    for stage in report.stages:
        for a in stage.attempts:
            rows.setdefault(stage.stage, []).append((a.wall_s, a.import_s or 0.0, a.compute_s or 0.0))
    return {k: tuple(statistics.mean(col) for col in zip(*v)) for k, v in rows.items()}


def _cluster(nodes: int):
    """A cluster of ``nodes`` raylets on this machine, each declaring every core (the tasks run one at a time):
    one node places the tasks itself; with more, the head places none and the workers share them."""
    from ray.cluster_utils import Cluster

    os.environ["PYTHONPATH"] = str(ROOT)  # the raylets' workers import the project
    cpus = os.cpu_count()
    head = {"num_cpus": cpus if nodes == 1 else 0, "include_dashboard": False}
    cluster = Cluster(initialize_head=True, head_node_args=head)
    for _ in range(nodes - 1):
        cluster.add_node(num_cpus=cpus)
    cluster.wait_for_nodes()
    return cluster


def nodes_main(args) -> None:
    """Local against a 1-node and a 3-node cluster on the same inputs."""
    import ray

    work = Path(tempfile.mkdtemp(prefix="bench-ray-nodes-"))
    results = {}
    try:
        sources = copies(args.source, work / "in", args.videos)
        wall, _, report = run(
            sources, work / "local", "local", args.chunk_size, args.speakers, 1, prefetch=False
        )
        results["local, no warm start"] = (wall, 0.0, report)
        for nodes in (1, 3):
            t0 = time.perf_counter()
            cluster = _cluster(nodes)
            start = time.perf_counter() - t0
            try:
                wall, _, report = run(
                    sources,
                    work / f"ray{nodes}",
                    "ray",
                    args.chunk_size,
                    args.speakers,
                    1,
                    address=cluster.address,
                )
            finally:
                ray.shutdown()
                cluster.shutdown()
            results[f"ray, {nodes} node(s)"] = (wall, start, report)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    load = os.getloadavg()
    print(
        f"\n{args.videos} copies of {args.source.name}, chunks of {args.chunk_size}, one chunk at a time, CPU, "
        f"embedded models, speakers {'on' if args.speakers else 'off'}; load average {load[0]:.1f}\n"
    )
    base = results["local, no warm start"][0]
    print(
        f"{'executor':<22} {'wall':>9} {'/ local':>8} {'tasks':>6} {'nodes used':>11} {'cluster start':>14}"
    )
    for name, (wall, start, report) in results.items():
        attempts = [a for s in report.stages for a in s.attempts]
        used = len({a.node for a in attempts if a.node})
        print(f"{name:<22} {wall:>8.1f}s {wall / base:>7.3f}x {len(attempts):>6} {used:>11} {start:>13.1f}s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--videos", type=int, default=50)
    parser.add_argument("--chunk-size", type=int, default=25)
    parser.add_argument("--source", type=Path, default=ROOT / "tests/fixtures/media/speech.mp4")
    parser.add_argument(
        "--speakers", action="store_true", help="also diarize (off: ASR + alignment + embeddings)"
    )
    parser.add_argument(
        "--nodes", action="store_true", help="local against a 1-node and a 3-node cluster on this machine"
    )
    args = parser.parse_args()
    if args.nodes:
        nodes_main(args)
        return
    work = Path(tempfile.mkdtemp(prefix="bench-ray-"))
    try:
        sources = copies(args.source, work / "in", args.videos)
        local_wall, _, local = run(sources, work / "local", "local", args.chunk_size, args.speakers, 1)
        cold_wall, _, cold = run(
            sources, work / "cold", "local", args.chunk_size, args.speakers, 1, prefetch=False
        )
        ray_wall, ray_start, ray = run(sources, work / "ray", "ray", args.chunk_size, args.speakers, 1)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    load = os.getloadavg()
    print(
        f"\n{args.videos} copies of {args.source.name}, chunks of {args.chunk_size}, one chunk at a time, CPU, "
        f"embedded models, speakers {'on' if args.speakers else 'off'}; load average {load[0]:.1f}\n"
    )
    print(f"{'executor':<22} {'wall':>9} {'audio h/h':>10} {'tasks':>6}")
    runs = (("local", local_wall, local), ("local, no warm start", cold_wall, cold), ("ray", ray_wall, ray))
    for name, wall, report in runs:
        tasks = sum(len(s.attempts) for s in report.stages)
        print(f"{name:<22} {wall:>8.1f}s {report.audio_s / wall:>10.1f} {tasks:>6}")
    print(
        f"\nray / local: {ray_wall / local_wall:.3f}x; ray / local without warm start: {ray_wall / cold_wall:.3f}x "
        f"(ray cluster start-up, not included: {ray_start:.1f}s)"
    )
    print("\nper stage task, seconds (no warm start on either side, so the child imports everything itself):")
    print(
        f"{'stage':<12} {'task wall local':>16} {'task wall ray':>14} {'ray extra':>10} {'import':>8} {'compute':>8}"
    )
    walls = {name: _per_stage(r) for name, r in (("cold", cold), ("ray", ray))}
    for stage, (wall, imp, comp) in walls["cold"].items():
        ray_wall_s = walls["ray"][stage][0]
        print(
            f"{stage:<12} {wall:>15.2f}s {ray_wall_s:>13.2f}s {ray_wall_s - wall:>9.2f}s {imp:>7.2f}s {comp:>7.2f}s"
        )


if __name__ == "__main__":
    main()
