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
import sys
import time
import traceback
from importlib import import_module
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.device.common import KIT, Context  # noqa: E402 - after the repository root is on sys.path

SECTIONS = ["env", "asr", "embeddings", "memory"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=KIT / "run-out")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true", help="small sizes: the CPU rehearsal")
    parser.add_argument("--weights", type=Path, default=KIT / "weights")
    parser.add_argument("--work", type=Path, default=Path("/tmp/device-run"))
    parser.add_argument("--budget", type=float, default=420.0, help="seconds for the whole run (default 420)")
    parser.add_argument("--only", nargs="*", default=SECTIONS, choices=SECTIONS)
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
    summary: dict = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "sections": {}}
    for name in args.only:
        started = time.perf_counter()
        print(f"== {name} ({ctx.left():.0f} s left)", flush=True)
        try:
            result = import_module(f"bench.device.{name}").run(ctx)
            status = "ok"
        except Exception as exc:  # noqa: BLE001 - a section that breaks is recorded; the next one runs
            result = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:]}
            ctx.write(name, result)
            status = "error"
        summary["sections"][name] = {"status": status, "s": round(time.perf_counter() - started, 1)}
        print(f"== {name}: {status} in {summary['sections'][name]['s']} s", flush=True)
        print(json.dumps(result, default=str)[:1500], flush=True)
    ctx.write("summary", summary)
    (ctx.out / "device-run.md").write_text(table(ctx.out))
    print(table(ctx.out))
    return 0


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
