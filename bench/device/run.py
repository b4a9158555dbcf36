"""The device run: every section on the lent GPU, one JSON per section and a markdown table under ``--out``.

    python3 bench/device/run.py --out "$OUT"                      # there (after bench/device/unpack.py)
    .venv/bin/python bench/device/run.py --device cpu --quick     # here, or in the rehearsal environment

Sections (each ``run(ctx) -> dict``, each written as soon as it ends, none stopping the others): env (the machine,
and whether CTranslate2 sees the GPU), asr (the torch runtime alone, a large-v3 shape, the whole pipeline and one
process), embeddings (both profiles' shapes through the stage and /v1/embeddings against plain
sentence-transformers), memory (per-child VRAM, a real out-of-memory ladder, the 70/85 % warnings).
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import time
import traceback
from importlib import import_module
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.device.common import KIT, Context  # noqa: E402 - after the repository root is on sys.path

SECTIONS = ["env", "memory", "asr", "embeddings"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=KIT / "run-out")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true", help="small sizes: the CPU rehearsal")
    parser.add_argument("--weights", type=Path, default=KIT / "weights")
    parser.add_argument("--work", type=Path, default=Path("/tmp/device-run"))
    parser.add_argument("--budget", type=float, default=420.0, help="seconds for the whole run (default 420)")
    parser.add_argument("--only", nargs="*", default=SECTIONS, choices=SECTIONS)
    parser.add_argument("--section", choices=SECTIONS, help=argparse.SUPPRESS)  # one section, in this process
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    ctx = Context(
        out=args.out,
        device=args.device,
        quick=args.quick,
        weights=args.weights,
        work=args.work,
        budget_s=args.budget,
    )
    ctx.work.mkdir(parents=True, exist_ok=True)
    if args.section:
        return _one(ctx, args.section)
    # each section in a process of its own: a section that touches CUDA in-process (the ASR alone, plain
    # sentence-transformers) leaves no context behind for the next one's "0 MiB held by our process tree"
    summary: dict = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "sections": {}}
    summary["models"] = _models(ctx)
    started_all = time.monotonic()
    for name in args.only:
        started = time.perf_counter()
        left = args.budget - (time.monotonic() - started_all)
        print(f"== {name} ({left:.0f} s left)", flush=True)
        if left < 20:
            summary["sections"][name] = {"status": "skipped: out of time"}
            continue
        command = [sys.executable, str(Path(__file__).resolve()), "--section", name, "--out", str(ctx.out)]
        command += ["--device", ctx.device, "--weights", str(ctx.weights), "--work", str(ctx.work)]
        command += ["--budget", str(left)] + (["--quick"] if ctx.quick else [])
        try:
            code = subprocess.run(command, timeout=left + 30).returncode
            status = "ok" if code == 0 else f"exit {code}"
        except subprocess.TimeoutExpired:
            status = "timed out"
        summary["sections"][name] = {"status": status, "s": round(time.perf_counter() - started, 1)}
        print(f"== {name}: {status} in {summary['sections'][name]['s']} s", flush=True)
        ctx.write("summary", summary)
    ctx.write("summary", summary)
    (ctx.out / "device-run.md").write_text(table(ctx.out))
    print(table(ctx.out))
    return 0


def _one(ctx: Context, name: str) -> int:
    try:
        result = import_module(f"bench.device.{name}").run(ctx)
    except Exception as exc:  # noqa: BLE001 - a section that breaks is recorded; the next one runs
        result = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:]}
        ctx.write(name, result)
        print(json.dumps(result, default=str)[:3000], flush=True)
        return 1
    print(json.dumps(result, default=str)[:1500], flush=True)
    return 0


def _models(ctx: Context) -> dict:
    """The speed profile's shape (bge-small-en-v1.5, random weights) where the pipeline runs look for it, built
    in a child process so that this one never makes a CUDA context."""
    dest = ctx.weights / "bge-small"
    command = [
        sys.executable,
        "-m",
        "bench.device.models",
        "build",
        "speed",
        str(dest),
        "--device",
        ctx.device,
    ]
    if ctx.quick:
        command += ["--layers", "2"]
    started = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=180, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"bge-small": "timed out"}
    return {
        "bge-small": done.returncode,
        "s": round(time.perf_counter() - started, 1),
        "tail": done.stderr[-500:],
    }


def table(out: Path) -> str:
    """The figures of every section's JSON as one markdown table (section, figure, value)."""
    rows = ["| section | figure | value |", "| --- | --- | --- |"]
    for path in sorted(out.glob("*.json")):
        if path.stem == "summary":
            continue
        for key, value in _flat(json.loads(path.read_text())):
            if "traceback" in key or key.endswith(".config") or ".config." in key:
                continue
            text = str(value).replace("|", "/").replace("\n", " ")
            rows.append(f"| {path.stem} | {key} | {text[:160]} |")
    return "\n".join(rows) + "\n"


def _flat(data, prefix: str = ""):
    if isinstance(data, dict):
        for key, value in data.items():
            yield from _flat(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(data, list) and data and all(isinstance(v, dict) for v in data):
        for i, value in enumerate(data):
            yield from _flat(value, f"{prefix}[{i}]")
    else:
        yield prefix, data


if __name__ == "__main__":
    sys.exit(main())
