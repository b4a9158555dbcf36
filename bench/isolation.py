"""Cost of isolation: N inputs through spawned stage children vs the same work in one process.

    .venv/bin/python bench/isolation.py [--copies 8] [--source tests/fixtures/media/speech.mp4]

Prints, per stage, the wall time split into spawn+import+exit, model load and
compute for the isolated run (one child per stage, all inputs in it), then the
same stages run in one process (imports once, same model loads), and the ratio.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

IN_PROCESS = r"""
import json, sys, time
t0 = time.perf_counter()
from contracts import StageRequest, WorkItem
from importlib import import_module
out, sources = sys.argv[1], sys.argv[2:]
from orchestrator import Orchestrator, Settings
specs = Orchestrator(Settings(output_dir=out, embedding_profile="embedded")).stage_specs()
timings, previous = {}, None
for spec in specs:
    items = []
    for i, src in enumerate(sources):
        inputs = {"source": src} if previous is None else {previous.kind: f"{out}/{i}/{previous.kind}.json"}
        items.append(WorkItem(id=str(i), inputs=inputs, output=f"{out}/{i}/{spec.kind}.json", fingerprint="x"))
    request = StageRequest(request_id=spec.name, stage=spec.name, module=spec.module, items=items,
                           batch_size=spec.batch_size, device="cpu", settings=spec.settings, result_path=f"{out}/r.json")
    s0 = time.perf_counter()
    result = import_module(spec.module).STAGE.run(request)
    assert all(r.ok for r in result.items), result.items
    timings[spec.name] = {"wall_s": time.perf_counter() - s0, "import_s": result.import_s,
                          "load_s": result.load_s, "compute_s": result.compute_s}
    previous = spec
timings["total_s"] = time.perf_counter() - t0
print(json.dumps(timings))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--copies", type=int, default=8)
    parser.add_argument("--source", type=Path, default=ROOT / "tests/fixtures/media/speech.mp4")
    args = parser.parse_args()

    from orchestrator import Orchestrator, Settings

    work = Path(tempfile.mkdtemp(prefix="bench-isolation-"))
    try:
        sources = []
        for i in range(args.copies):
            dst = work / "in" / f"copy{i:03d}{args.source.suffix}"
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(args.source, dst)
            sources.append(str(dst))

        t0 = time.perf_counter()
        with Orchestrator(Settings(output_dir=work / "isolated", embedding_profile="embedded", device="cpu")) as orch:
            report = orch.process(sources)
        isolated_total = time.perf_counter() - t0
        assert report.ok == args.copies, [i.error for i in report.inputs if i.error]

        done = subprocess.run([sys.executable, "-c", IN_PROCESS, str(work / "inproc"), *sources],
                              capture_output=True, text=True, cwd=ROOT, check=True)
        inproc = json.loads(done.stdout.splitlines()[-1])
    finally:
        shutil.rmtree(work, ignore_errors=True)

    audio_s = args.copies * 12.8 if args.source.name == "speech.mp4" else float("nan")
    print(f"\n{args.copies} copies of {args.source.name} on CPU (embedded models)\n")
    print(f"{'stage':<11} {'isolated wall':>13} {'spawn+import+exit':>18} {'load':>7} {'compute':>8} | "
          f"{'in-process wall':>15} {'import':>7} {'load':>7} {'compute':>8}")
    for run in report.stages:
        a = run.attempts[0]
        other = a.wall_s - (a.load_s or 0) - (a.compute_s or 0)
        p = inproc[run.stage]
        print(f"{run.stage:<11} {a.wall_s:>12.2f}s {other:>17.2f}s {a.load_s:>6.2f}s {a.compute_s:>7.2f}s | "
              f"{p['wall_s']:>14.2f}s {p['import_s']:>6.2f}s {p['load_s']:>6.2f}s {p['compute_s']:>7.2f}s")
    print(f"\ntotal: isolated {isolated_total:.2f}s, in-process {inproc['total_s']:.2f}s, "
          f"ratio isolated/in-process = {isolated_total / inproc['total_s']:.2f}x")
    if audio_s == audio_s:
        print(f"audio processed: {audio_s:.0f}s; real-time factor isolated {isolated_total / audio_s:.3f}, "
              f"in-process {inproc['total_s'] / audio_s:.3f}")


if __name__ == "__main__":
    main()
