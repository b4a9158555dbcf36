"""The stage children's heap policy, side by side in one run: ``PIPELINE_CHILD_HEAP=system`` vs ``keep``.

    .venv/bin/python bench/allocator.py [--inputs 4] [--min-s 60] [--max-s 150] [--rounds 2]

Runs the whole pipeline (stage-major, real children, all stages, speakers on,
CPU, embedded models) over the same mixed inputs as ``bench/batch.py``, the two
policies alternated in each round, and prints per stage the compute seconds,
what the kernel counted over them (user and system CPU seconds, minor page
faults) and the child's peak RSS, then the ratio of each stage's compute
(best of the rounds). ``system`` is the C library's malloc as it comes;
``keep`` (the default) is one arena that reuses what it frees
(``stages.memory.configure_heap``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.batch import isolated, mixed_inputs

POLICIES = ("system", "keep")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--inputs", type=int, default=4)
    parser.add_argument("--min-s", type=float, default=60.0)
    parser.add_argument("--max-s", type=float, default=150.0)
    parser.add_argument("--seed", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-allocator-"))
    runs: dict[str, list] = {p: [] for p in POLICIES}
    try:
        sources, audio_s = mixed_inputs(work / "in", args.inputs, args.min_s, args.max_s, args.seed)
        print(
            f"{args.inputs} inputs of {args.min_s:.0f}-{args.max_s:.0f} s ({audio_s / 60:.1f} min of audio); "
            f"stage-major, all stages, CPU, embedded models",
            flush=True,
        )
        print(
            f"\n{'round':>5} {'heap':<7} {'stage':<12} {'compute':>8} {'user':>7} {'system':>7} "
            f"{'minflt':>10} {'peak RSS':>9}",
            flush=True,
        )
        for r in range(args.rounds):
            for policy in POLICIES:
                os.environ["PIPELINE_CHILD_HEAP"] = policy  # read by Settings, handed to every child
                wall, stages = isolated(sources, work / f"{policy}-{r}", chunk_size=len(sources))
                runs[policy].append((wall, stages))
                for name, row in stages.items():
                    cpu = row["compute_cpu"] or {}
                    print(
                        f"{r + 1:>5} {policy:<7} {name:<12} {row['compute_s']:>7.1f}s {cpu.get('user_s', 0):>6.1f}s "
                        f"{cpu.get('system_s', 0):>6.1f}s {cpu.get('minor_faults', 0):>10} "
                        f"{row['peak_rss_mb']:>7.0f} MiB",
                        flush=True,
                    )
                print(f"{r + 1:>5} {policy:<7} {'(wall)':<12} {wall:>7.1f}s", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nbest of {args.rounds}, keep vs system:")
    for name in runs["keep"][0][1]:
        best = {p: min(stages[name]["compute_s"] for _, stages in runs[p]) for p in POLICIES}
        rss = {p: max(stages[name]["peak_rss_mb"] for _, stages in runs[p]) for p in POLICIES}
        print(
            f"  {name:<12} compute {best['system']:6.1f} -> {best['keep']:6.1f} s "
            f"({best['system'] / best['keep'] if best['keep'] else 0:.2f}x)   "
            f"peak RSS {rss['system']:.0f} -> {rss['keep']:.0f} MiB"
        )
    wall = {p: min(w for w, _ in runs[p]) for p in POLICIES}
    print(
        f"  {'whole run':<12} wall    {wall['system']:6.1f} -> {wall['keep']:6.1f} s "
        f"({wall['system'] / wall['keep']:.2f}x; {audio_s / wall['system']:.1f} -> {audio_s / wall['keep']:.1f} "
        f"audio h/h)"
    )


if __name__ == "__main__":
    main()
