"""How a stage child starts: a plain spawned process against the toolkit's ``spawn`` (SIGINT blocked across
the start so the terminal's Ctrl-C cannot kill a child still starting; multiprocess's resource tracker made
sure of first), side by side and alternating in one run.

    .venv/bin/python -m bench.spawn [--rounds 12]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from orchestrator.process.toolkit import CONTEXT, spawn


def plain():
    proc = CONTEXT.Process(target=os.getpid, daemon=True)
    proc.start()
    return proc


def toolkit_spawn():
    return spawn("os:getpid", [], name="bench", die_with_parent=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    args = parser.parse_args()
    times: dict[str, list[tuple[float, float]]] = {"plain": [], "spawn": []}
    for _ in range(args.rounds):
        for name, start in (("plain", plain), ("spawn", toolkit_spawn)):
            t0 = time.perf_counter()
            proc = start()
            started = time.perf_counter()
            proc.join()
            times[name].append((started - t0, time.perf_counter() - t0))
    for name, rows in times.items():
        start_ms = 1000 * statistics.median(a for a, _ in rows)
        whole_ms = 1000 * statistics.median(b for _, b in rows)
        print(
            f"{name:6s} start() {start_ms:6.2f} ms   start to exit {whole_ms:6.0f} ms   (median of {args.rounds})"
        )
    ratio = statistics.median(b for _, b in times["spawn"]) / statistics.median(b for _, b in times["plain"])
    print(f"spawn / plain, start to exit: {ratio:.3f}")


if __name__ == "__main__":
    main()
