"""Shared by the bench scripts: input copies, the audio stage in this process, WAV writing and the one-process
baseline."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import wave
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RATE = 16000

# The same stage code as the isolated run, all stages in this one process:
# imports once, one model load per stage, no children.
IN_PROCESS = r"""
import json, sys, time
t0 = time.perf_counter()
from importlib import import_module
from contracts import StageRequest, WorkItem
from orchestrator import Orchestrator, Settings
from stages.runtime.memory import configure_heap
configure_heap()  # PIPELINE_CHILD_HEAP, as a stage child does first
out, sources = sys.argv[1], sys.argv[2:]
specs = Orchestrator(Settings(output_dir=out, embedding_profile="embedded")).stage_specs()
timings, previous = {}, None
for spec in specs:
    items = []
    for i, src in enumerate(sources):
        keys = () if previous is None else (spec.inputs if spec.inputs is not None else (previous.kind,))
        inputs = {k: f"{out}/{i}/{k}.json" for k in keys} if keys else {"source": src}
        items.append(WorkItem(id=str(i), inputs=inputs, output=f"{out}/{i}/{spec.kind}.json", fingerprint="x"))
    request = StageRequest(request_id=spec.name, stage=spec.name, module=spec.module, items=items,
                           batch_size=spec.batch_size, device="cpu", settings=spec.settings.model_dump(mode="json"),
                           result_path=f"{out}/r.json")
    s0 = time.perf_counter()
    result = import_module(spec.module).STAGE.run(request)
    assert all(r.ok for r in result.items), result.items
    timings[spec.name] = {"wall_s": time.perf_counter() - s0, "import_s": result.import_s,
                          "load_s": result.load_s, "compute_s": result.compute_s,
                          "compute_cpu": result.compute_cpu.model_dump() if result.compute_cpu else None,
                          "peak_rss_mb": result.peak_rss_mb}
    previous = spec
timings["total_s"] = time.perf_counter() - t0
print(json.dumps(timings))
"""


def copies(source: Path, directory: Path, count: int) -> list[str]:
    directory.mkdir(parents=True, exist_ok=True)
    out = []
    for i in range(count):
        dst = directory / f"copy{i:03d}{source.suffix}"
        shutil.copy(source, dst)
        out.append(str(dst))
    return out


def run_in_process(sources: list[str], out: Path) -> dict:
    """Run every stage over ``sources`` in one fresh Python process; return its timings.

    It gets the environment stage children get (offline hub, allocator settings),
    so both sides do the same work.
    """
    from orchestrator import Settings

    env = os.environ | Settings().child_env()
    done = subprocess.run(
        [sys.executable, "-c", IN_PROCESS, str(out), *sources],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
        env=env,
    )
    return json.loads(done.stdout.splitlines()[-1])


def decode(paths: list[Path], out: Path, ids: list[str] | None = None) -> list[Path]:
    """The audio stage, in this process: one audio.json per path."""
    from contracts import StageRequest, WorkItem
    from orchestrator.registry import stage_settings
    from orchestrator.settings import Settings
    from stages.audio import STAGE as AUDIO

    ids = ids or [p.stem for p in paths]
    items = [
        WorkItem(id=i, inputs={"source": str(p)}, output=str(out / f"{i}.audio.json"), fingerprint="x")
        for i, p in zip(ids, paths)
    ]
    AUDIO.import_libraries()
    result = AUDIO.run(
        StageRequest(
            request_id="a",
            stage="audio",
            module="stages.audio",
            batch_size=1,
            settings=stage_settings("audio", Settings()).model_dump(mode="json"),
            result_path=str(out / "a.json"),
            items=items,
        )
    )
    assert all(r.ok for r in result.items), [r.error for r in result.items if not r.ok]
    return [out / f"{i}.audio.json" for i in ids]


def write_wav(path: Path, samples) -> None:
    """16 kHz mono 16-bit PCM."""
    import numpy as np

    pcm = (np.clip(samples, -1, 1) * 32767).astype("<i2")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(RATE)
        w.writeframes(pcm.tobytes())
