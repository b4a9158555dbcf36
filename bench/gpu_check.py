"""GPU memory check: run the pipeline on the fixtures on a GPU and show where VRAM went.

    .venv/bin/python bench/gpu_check.py [--copies 4] [--device cuda] [--asr-model embedded] [--json OUT.json]

Needs an NVIDIA GPU with NVML (it exits 2 with the reason on a machine without
one). Prints, per stage child: torch's peak allocated VRAM, NVML's peak for the
child process (it also sees CTranslate2's memory, which torch does not), what
our process tree held on the GPU after the child exited (the 0 MiB proof) and
device usage before/after; then the peak device usage of the whole run against
the largest single stage: with one child per stage they should be about equal,
because no stage's memory outlives its child.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from contracts.units import gib  # noqa: E402 - after the repository root is on sys.path


def _gib(mib: float | None) -> str:
    return "—" if mib is None else gib(mib)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--copies", type=int, default=4, help="copies of the fixture mp4 (default 4)")
    parser.add_argument("--source", type=Path, default=ROOT / "tests/fixtures/media/speech.mp4")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--asr-model", default="embedded")
    parser.add_argument("--embedding-profile", default="embedded")
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    parser.add_argument("--keep", action="store_true", help="keep the output directory")
    args = parser.parse_args()

    from contracts.perf import read_events
    from orchestrator import Orchestrator, Settings
    from orchestrator.gpu.nvml import NvmlReader
    from orchestrator.telemetry.perf_log import perf_log_path
    from orchestrator.telemetry.perf_report import run_peaks, summarize

    snapshot = NvmlReader().read()
    if not snapshot.available or not snapshot.devices:
        reason = snapshot.reason or "NVML sees no GPU"
        print(f"gpu_check: needs an NVIDIA GPU with NVML; none here: {reason}", file=sys.stderr)
        return 2
    for d in snapshot.devices:
        print(
            f"GPU {d.index}: {d.name}, {_gib(d.total_mib)} total, {_gib(d.used_mib)} used before the run "
            f"(driver {snapshot.driver})"
        )

    work = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    try:
        inputs = []
        for i in range(args.copies):
            target = work / "in" / f"copy{i:03d}{args.source.suffix}"
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(args.source, target)
            inputs.append(target)
        settings = Settings(
            output_dir=work / "out",
            device=args.device,
            asr_model=args.asr_model,
            embedding_profile=args.embedding_profile,
            gpu_sample_s=0.1,
            memory_every_item=True,
        )
        with Orchestrator(settings) as orch:
            report = orch.process(inputs)
        events = read_events(perf_log_path(settings.output_dir, report.run_id))
        summaries = summarize(events)
        peaks = run_peaks(events, summaries)
        checks = {(e.stage, e.attempt): e for e in events if e.event == "gpu_check"}

        print(f"\nrun {report.run_id}: {report.ok} ok, {report.failed} failed")
        header = (
            f"{'stage':<11} {'try':>3} {'batch':>5} {'outcome':<8} {'device':<7} {'peak torch':>11} "
            f"{'peak NVML':>11} {'after exit':>12} {'device before -> after':>24}"
        )
        print(header)
        print("-" * len(header))
        rows = []
        for s in summaries:
            check = checks.get((s.stage, s.attempt))
            after = "—" if s.gpu_tree_after_mib is None else f"{s.gpu_tree_after_mib:.0f} MiB"
            before_after = "—"
            if check is not None:
                before_after = f"{check.baseline_used_mib or 0:.0f} -> {check.device_used_mib:.0f} MiB"
            print(
                f"{s.stage:<11} {s.attempt:>3} {s.batch_size or 0:>5} {s.outcome or '?':<8} {s.device or '?':<7} "
                f"{_gib(s.peak_vram_mb):>11} {_gib(s.gpu_process_peak_mib):>11} {after:>12} {before_after:>24}"
                + (f"  LEAK: {s.gpu_leak}" if s.gpu_leak else "")
            )
            rows.append(
                {
                    "stage": s.stage,
                    "attempt": s.attempt,
                    "batch_size": s.batch_size,
                    "outcome": s.outcome,
                    "device": s.device,
                    "peak_torch_mib": s.peak_vram_mb,
                    "peak_nvml_mib": s.gpu_process_peak_mib,
                    "tree_after_exit_mib": s.gpu_tree_after_mib,
                    "device_after_mib": check.device_used_mib if check else None,
                    "device_before_mib": check.baseline_used_mib if check else None,
                    "leak": s.gpu_leak,
                }
            )
        proof = [r for r in rows if r["tree_after_exit_mib"] is not None]
        zero = all(r["tree_after_exit_mib"] == 0 for r in proof) and bool(proof)
        print(
            f"\n0 MiB proof: {'every' if zero else 'NOT every'} stage child left 0 MiB held by our process tree "
            f"({len(proof)} checked)"
        )
        largest = f"{_gib(peaks.largest_stage_mib)} ({peaks.largest_stage})" if peaks.largest_stage else "—"
        print(
            f"peak VRAM of the run (device, NVML, all processes): {_gib(peaks.device_peak_mib)}; "
            f"largest single stage (its own peak): {largest}"
        )
        if args.json:
            args.json.write_text(
                json.dumps(
                    {
                        "gpus": snapshot.model_dump(mode="json"),
                        "run_id": report.run_id,
                        "ok": report.ok,
                        "failed": report.failed,
                        "stages": rows,
                        "zero_mib_proof": zero,
                        "run_device_peak_mib": peaks.device_peak_mib,
                        "largest_stage_mib": peaks.largest_stage_mib,
                        "largest_stage": peaks.largest_stage,
                    },
                    indent=2,
                )
            )
        return 0 if zero and report.failed == 0 else 1
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
