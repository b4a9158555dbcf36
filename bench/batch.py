"""A realistic batch three ways, in one run: stage-major chunks, one process, a child per stage per video.

    .venv/bin/python bench/batch.py [--inputs 16] [--min-s 30] [--max-s 180] [--rounds 1] [--no-per-video]
    .venv/bin/python bench/batch.py --source tests/fixtures/media/speech.mp4 --inputs 50   # copies of one file

By default the inputs are a mix of lengths (``--min-s`` to ``--max-s``, evenly
spread, shuffled with a fixed seed), each made of the committed speech fixtures
(two dialogues, several voices and sentences) joined in a varied order. All
stages run, speakers on, CPU, embedded models. Every mode runs the same stage
code with the same cross-input packing:

- stage-major: ``Orchestrator.process``, one chunk of all inputs, a child per stage
- one process: every stage in one fresh Python process, no children (bench.common)
- a child per stage per video: the orchestrator with ``chunk_size=1``

It prints the wall times, a per-stage table of import, load and compute seconds
for each mode, and hours of audio per hour. The
three modes run side by side in the same run, so their ratios are comparable.
``--runtimes torch,onnx`` runs both diarization runtimes (``DIARIZATION_RUNTIME``)
in each round and prints each one's tables and the throughput of the last vs the
first; ``--before`` also runs the older path (torch diarization in batches of 4,
no joined ASR windows and the C library's heap defaults), first in each round, in
the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import ROOT, copies, run_in_process

MEDIA = ROOT / "tests" / "fixtures" / "media"
#: ``--before``: the settings that give the older path (torch diarization, batches of 4, no joined windows,
#: glibc's heap defaults)
BEFORE = {
    "DIARIZATION_RUNTIME": "torch",
    "ASR_JOIN_INPUTS": "false",
    "PIPELINE_CHILD_HEAP": "system",
    "DIARIZATION_BATCH_SIZE": "4",
}
FIXTURES = [
    *sorted((MEDIA / "speakers").glob("*.mp4")),
    MEDIA / "speech.wav",
    *sorted((MEDIA / "speakers").glob("*.wav")),
]


def mixed_inputs(
    directory: Path, count: int, min_s: float, max_s: float, seed: int
) -> tuple[list[str], float]:
    """``count`` WAVs of evenly spread lengths, each the fixtures joined in a shuffled order (0.4 s gaps)."""
    import numpy as np

    from bench.common import RATE, decode, write_wav
    from contracts import AudioArtifact, load_artifact

    directory.mkdir(parents=True, exist_ok=True)
    pieces = []
    for path in decode(FIXTURES, directory, [f"fixture{i}" for i in range(len(FIXTURES))]):
        audio = load_artifact(path, AudioArtifact)
        pieces.append(np.load(path.parent / audio.sidecar))
    rng = random.Random(seed)
    gap = np.zeros(int(0.4 * RATE), dtype=np.float32)
    lengths = [min_s + (max_s - min_s) * i / max(1, count - 1) for i in range(count)]
    rng.shuffle(lengths)
    out, total = [], 0.0
    for i, seconds in enumerate(lengths):
        want, parts = int(seconds * RATE), []
        while sum(len(p) for p in parts) < want:
            parts += [rng.choice(pieces), gap]
        samples = np.concatenate(parts)[:want]
        path = directory / f"input{i:02d}-{seconds:.0f}s.wav"
        write_wav(path, samples)
        out.append(str(path))
        total += len(samples) / RATE
    return out, total


def use(settings: dict[str, str]) -> None:
    """Run with ``settings`` and the defaults for the rest of ``BEFORE``'s (read by Settings here and in
    the one-process run)."""
    for name in BEFORE:
        os.environ.pop(name, None)
    os.environ.update(settings)


def isolated(sources: list[str], out: Path, chunk_size: int) -> tuple[float, dict[str, dict[str, float]]]:
    """Wall time and per-stage import/load/compute seconds (summed over the stage's children)."""
    from orchestrator import Orchestrator, Settings
    from orchestrator.run.progress import Progress

    t0 = time.perf_counter()
    with Orchestrator(
        Settings(output_dir=out, embedding_profile="embedded", device="cpu", chunk_size=chunk_size)
    ) as orch:
        report = orch.process(sources, progress=Progress())
    wall = time.perf_counter() - t0
    assert report.ok == len(sources), [i.error for i in report.inputs if i.error]
    stages: dict[str, dict] = {}
    for run in report.stages:
        row = stages.setdefault(
            run.stage, {"import_s": 0.0, "load_s": 0.0, "compute_s": 0.0, "compute_cpu": None}
        )
        for attempt in run.attempts:
            for key in ("import_s", "load_s", "compute_s"):
                row[key] += getattr(attempt, key) or 0.0
            row["peak_rss_mb"] = max(row.get("peak_rss_mb") or 0.0, attempt.peak_rss_mb or 0.0)
            if attempt.compute_cpu is not None:
                cpu = attempt.compute_cpu.model_dump()
                row["compute_cpu"] = {k: v + (row["compute_cpu"] or {}).get(k, 0) for k, v in cpu.items()}
    return wall, stages


def table(title: str, stages: dict[str, dict]) -> None:
    """Import, load and compute seconds per stage, and what the kernel counted over the compute:
    CPU seconds (user + system) and their share of the compute's wall time (2 threads busy = 2.00),
    minor page faults, and voluntary / involuntary context switches."""
    print(
        f"\n{title}\n{'stage':<12} {'import':>8} {'load':>8} {'compute':>9} {'user':>8} {'system':>8} "
        f"{'cpu/wall':>8} {'minflt':>9} {'vol cs':>9} {'invol cs':>9}"
    )
    for name, row in stages.items():
        line = f"{name:<12} {row['import_s']:>7.1f}s {row['load_s']:>7.1f}s {row['compute_s']:>8.1f}s"
        cpu = row.get("compute_cpu")
        if cpu:
            share = (cpu["user_s"] + cpu["system_s"]) / row["compute_s"] if row["compute_s"] else 0.0
            line += (
                f" {cpu['user_s']:>7.1f}s {cpu['system_s']:>7.1f}s {share:>8.2f} {cpu['minor_faults']:>9}"
                f" {cpu['voluntary_switches']:>9} {cpu['involuntary_switches']:>9}"
            )
        print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--inputs", "--videos", type=int, default=16, dest="inputs")
    parser.add_argument("--min-s", type=float, default=30.0)
    parser.add_argument("--max-s", type=float, default=180.0)
    parser.add_argument("--source", type=Path, help="use copies of this one file instead of the mix")
    parser.add_argument("--seed", type=int, default=4)
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="alternate stage-major and one-process this many times and keep the fastest of each "
        "(steadier on a busy machine)",
    )
    parser.add_argument("--no-per-video", action="store_true", help="skip the slow child-per-video mode")
    parser.add_argument(
        "--runtimes",
        default="onnx",
        help="DIARIZATION_RUNTIME values to run, comma-separated (e.g. torch,onnx: the earlier "
        "path and the new one side by side, alternating within each round)",
    )
    parser.add_argument(
        "--before",
        action="store_true",
        help="also run, first in each round, the older path: "
        "DIARIZATION_RUNTIME=torch, DIARIZATION_BATCH_SIZE=4, ASR_JOIN_INPUTS=false (no joined "
        "ASR windows) and PIPELINE_CHILD_HEAP=system (the C library's heap defaults)",
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-batch-"))
    runtimes = ["before"] * args.before + [r.strip() for r in args.runtimes.split(",") if r.strip()]
    stage_major = {r: [] for r in runtimes}
    one_process = {r: [] for r in runtimes}
    per_video = None
    try:
        if args.source:
            sources, audio_s = copies(args.source, work / "in", args.inputs), None
            what = f"{args.inputs} copies of {args.source.name}"
        else:
            sources, audio_s = mixed_inputs(work / "in", args.inputs, args.min_s, args.max_s, args.seed)
            what = (
                f"{args.inputs} inputs of {args.min_s:.0f}-{args.max_s:.0f} s "
                f"({audio_s / 60:.1f} min of audio, two to three voices each)"
            )
        for r in range(args.rounds):
            for runtime in runtimes:
                # read by Settings here and in the one-process run
                use(BEFORE if runtime == "before" else {"DIARIZATION_RUNTIME": runtime})
                stage_major[runtime].append(
                    isolated(sources, work / f"stage-major-{runtime}-{r}", chunk_size=len(sources))
                )
                one_process[runtime].append(run_in_process(sources, work / f"one-process-{runtime}-{r}"))
                print(
                    f"round {r + 1}, DIARIZATION_RUNTIME={runtime}: stage-major {stage_major[runtime][-1][0]:.1f} s, "
                    f"one process {one_process[runtime][-1]['total_s']:.1f} s",
                    flush=True,
                )
                # every figure of the round, kept if a later round is cut short
                print(
                    "measured: "
                    + json.dumps(
                        {
                            "round": r + 1,
                            "runtime": runtime,
                            "stage_major": stage_major[runtime][-1],
                            "one_process": one_process[runtime][-1],
                        }
                    ),
                    flush=True,
                )
        if not args.no_per_video:
            use({"DIARIZATION_RUNTIME": runtimes[-1]})
            per_video = isolated(sources, work / "per-video", chunk_size=1)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for runtime in runtimes:
        report(
            args,
            what,
            audio_s,
            runtime,
            stage_major[runtime],
            one_process[runtime],
            per_video if runtime == runtimes[-1] else None,
        )
    if len(runtimes) > 1:
        first, last = runtimes[0], runtimes[-1]
        for label, runs, wall in (
            ("stage-major", stage_major, lambda r: r[0]),
            ("one process", one_process, lambda r: r["total_s"]),
        ):
            a, b = min(map(wall, runs[first])), min(map(wall, runs[last]))
            rate = f" ({audio_s / a:.1f} -> {audio_s / b:.1f} audio h/h)" if audio_s else ""
            print(f"{label}: {last} is {a / b:.2f}x the throughput of {first}{rate}")


def report(
    args, what: str, audio_s: float | None, runtime: str, stage_major: list, one_process: list, per_video
) -> None:
    best_major = min(stage_major, key=lambda r: r[0])
    best_one = min(one_process, key=lambda r: r["total_s"])
    label = (
        ", ".join(f"{k}={v}" for k, v in BEFORE.items())
        if runtime == "before"
        else f"DIARIZATION_RUNTIME={runtime}"
    )
    print(f"\n{what}; all stages, speakers on, CPU, embedded models, {label}, best of {args.rounds}\n")
    print(f"{'mode':<30} {'wall':>9} {'vs one process':>15} {'audio h/h':>10}   all rounds")
    rows = [
        ("stage-major (1 chunk of all)", best_major[0], [r[0] for r in stage_major]),
        ("one process", best_one["total_s"], [r["total_s"] for r in one_process]),
    ]
    if per_video is not None:
        rows.insert(1, ("child per stage per video", per_video[0], [per_video[0]]))
    for name, wall, every in rows:
        rate = f"{audio_s / wall:>10.1f}" if audio_s else f"{'-':>10}"
        print(
            f"{name:<30} {wall:>8.1f}s {wall / best_one['total_s']:>14.2f}x {rate}   "
            f"{' '.join(f'{w:.1f}' for w in every)}"
        )
    table("stage-major, per stage (child's view):", best_major[1])
    table("one process, per stage:", {k: v for k, v in best_one.items() if isinstance(v, dict)})
    if per_video is not None:
        table("child per stage per video, per stage (summed over the children):", per_video[1])
    print(f"\nstage-major vs one process: {best_major[0] / best_one['total_s']:.2f}x (goal <= 1.03x)")
    child, alone = best_major[1].get("diarization"), best_one.get("diarization")
    asr = best_one.get("asr")
    if child and alone:
        print(
            f"diarization compute, child vs one process: {child['compute_s']:.1f} vs {alone['compute_s']:.1f} s "
            f"({child['compute_s'] / alone['compute_s']:.2f}x; goal <= 1.05x)"
        )
    if alone and asr:
        print(
            f"diarization vs ASR compute (one process): {alone['compute_s']:.1f} vs {asr['compute_s']:.1f} s "
            f"({alone['compute_s'] / asr['compute_s']:.2f}; goal <= 0.5)"
        )
    if per_video is not None:
        print(f"stage-major is {per_video[0] / best_major[0]:.1f}x faster than a child per stage per video")


if __name__ == "__main__":
    main()
