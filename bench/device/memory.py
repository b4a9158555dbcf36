"""The device run's memory section: where each stage child's VRAM went, a real out-of-memory ladder, and the
70 % / 85 % warnings from real readings.

    PYTHONPATH=. python -m bench.device.memory --out OUT [--device cpu] [--quick] [--model DIR]

Every part goes through the real pipeline (``orchestrator.Orchestrator`` with ``Settings``, stage children
spawned as in production, the GPU guard's NVML checks) and is recorded even when another part fails:

- ``children``: the fixture video through the pipeline (diarization, enrollment and word alignment off).
  Per stage child: NVML's peak for its process, device usage before and after, what our process tree held
  after it exited (must be 0 MiB). A different CUDA context per child: a context belongs to one process, so
  the evidence is that every GPU child has its own PID, that this PID appears in NVML's list of compute
  processes while the child runs and is gone from it by the time the parent records the child's end, and
  that the parent's PID never appears there (a thread here polls NVML every 0.1 s).
- ``oom``: a real CUDA out-of-memory. The embeddings stage, capped by ``gpu_memory_fraction`` at
  :data:`OOM_CAP_MIB` of the card, starts at batch :data:`OOM_START_BATCH` over 512-token texts that do not
  fit; the runner retries it with half the batch until it fits. The ladder (batch sizes tried, in order, and
  how each child ended) is read back from the performance log and the run report; an input of short texts
  that the first child finishes shows that nothing finished is redone.
- ``pressure``: a ballast process (a separate Python child holding a torch tensor) brings the card to 75 %,
  then 88 %, of its memory while a pipeline run goes. The ballast takes its own memory checkpoint with the
  stage children's code (``stages.runtime.memory.MemoryCheckpoints``), so the NOTICE and WARNING lines are the real
  ones from real CUDA readings; the stage child's own checkpoint lines and the parent's warning about other
  processes on the GPU are captured as well. (A child's thresholds are on what *its* torch allocator holds,
  so the stage child itself is not expected to warn because of another process's memory.)

The embeddings stage reads transcripts; to give it the texts these parts need without depending on ASR, its
input transcripts are written beforehand with the fingerprints the run expects (the pipeline then reuses
them and runs only the embeddings stage). On the CPU (``ctx.device == "cpu"``) ``oom`` and ``pressure``
record ``{"skipped": "needs CUDA"}``; ``children`` runs on the CPU so the code path is exercised.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import select
import shutil
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bench.device.common import ROOT, Context

log = logging.getLogger(__name__)

SPEECH = ROOT / "tests" / "fixtures" / "media" / "speech.mp4"
#: what the capped embeddings child may allocate: the model (64 MiB in float16) and a batch of a few dozen
#: 512-token texts fit; a batch of 512 such texts needs over 1.5 GiB (two 768 MiB activations per layer)
OOM_CAP_MIB = 768.0
#: the first batch size of the ladder
OOM_START_BATCH = 512
#: the ballast's steps, % of the card's memory in use
PRESSURE_STEPS = (75.0, 88.0)
#: device usage above the pre-stage baseline still counted as "back" (the GPU guard's default tolerance)
BASELINE_TOLERANCE_MIB = 256.0
#: a part does not start with less than this many seconds left of the run's budget
MIN_PART_S = 30.0
#: the substrings that make a line of a child's log worth keeping
KEPT = (
    "[GPU Memory]",
    "NOTICE:",
    "WARNING",
    "ERROR",
    "GPU memory cap",
    "gpu_memory_fraction",
    "out of memory",
)
#: words the long texts are made of (each one token for a BERT tokenizer)
WORDS = (
    "the quick brown fox jumps over a lazy dog while seven red birds sing in tall green trees near an old "
    "river and the small town wakes up to bright morning light with people walking to work"
).split()


def run(ctx: Context, embedding_model: Path | None = None) -> dict:
    """Measure the three parts (each recorded even when another fails); write ``memory.json``."""
    result: dict = {"device": ctx.device, "quick": ctx.quick, "gpu": _gpu()}
    profile, note = _embedding_profile(ctx, embedding_model)
    result["embedding_model"] = {"profile": profile, "note": note, "max_seq_length": _max_seq_length(profile)}
    work = ctx.work / "memory"
    shutil.rmtree(work, ignore_errors=True)
    parts = (("children", _children), ("oom", _oom), ("pressure", _pressure))
    for name, part in parts:
        started = time.monotonic()
        if ctx.device == "cpu" and name != "children":
            result[name] = {"skipped": "needs CUDA"}
        elif ctx.left() < MIN_PART_S:
            result[name] = {"skipped": f"out of time: {ctx.left():.0f} s left of the run's budget"}
        else:
            try:
                result[name] = part(ctx, work / name, profile)
            except Exception as exc:  # one part's failure must not stop the others
                log.exception("memory: %s failed", name)
                result[name] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
        if isinstance(result[name], dict):
            result[name]["seconds"] = round(time.monotonic() - started, 1)
        ctx.write("memory", result)
    return result


# -- the parts -----------------------------------------------------------------------------------------


def _children(ctx: Context, work: Path, profile: str) -> dict:
    """The fixture video through the pipeline; per stage child: memory, and the evidence of its own context."""
    copies = 1 if ctx.quick else 2
    inputs = _copies(work / "in", [f"speech{i}" for i in range(copies)])
    settings = _settings(ctx, work / "out", embedding_profile=profile)
    done = _run(settings, inputs)
    return {"inputs": copies, "settings": _shown(settings), **done, "evidence": _evidence(done)}


def _evidence(done: dict) -> dict:
    """What a run's stage children show: one CUDA context each, and nothing left behind by each."""
    children = done["children"]
    # the children that created a CUDA context: their memory checkpoints are torch's CUDA readings
    gpu = [c for c in children if any(cp["kind"] == "gpu" for cp in c["checkpoints"])]
    evidence = {
        "gpu_children": len(gpu),
        "cuda_children_without_a_context": [
            c["stage"] for c in children if (c["device"] or "").startswith("cuda") and c not in gpu
        ],
        "distinct_pids": len({c["pid"] for c in children}) == len(children),
    }
    nvml = done["nvml"]
    if not nvml.get("available"):
        return evidence | {"nvml": nvml.get("reason")}
    seen = [c["nvml"] for c in gpu if c["nvml"] is not None]
    proof = [c for c in gpu if c["tree_after_exit_mib"] is not None]
    checked = [c for c in gpu if c["device_before_mib"] is not None and c["device_after_mib"] is not None]
    evidence |= {
        "every_gpu_child_seen_in_nvml_while_running": bool(gpu)
        and len(seen) == len(gpu)
        and all(n["seen_while_running"] for n in seen),
        "every_gpu_child_gone_from_nvml_by_its_end": bool(seen) and all(n["gone_by_end"] for n in seen),
        "parent_never_in_nvml": nvml.get("parent_seen") is False,
        "zero_mib_after_every_gpu_child": bool(proof) and all(c["tree_after_exit_mib"] == 0 for c in proof),
        "gpu_children_checked_for_0_mib": len(proof),
        # the guard's other test, which needs no pid: device usage back to the pre-stage baseline
        "device_back_to_baseline_every_gpu_child": bool(checked)
        and all(c["device_after_mib"] - c["device_before_mib"] <= BASELINE_TOLERANCE_MIB for c in checked),
        "how": "a CUDA context belongs to one process: each GPU child has its own pid, that pid is listed by "
        "NVML (compute processes, polled every 0.1 s) only between its stage start and end, and the parent's "
        "pid is never listed; after each exit the GPU guard reads what our process tree holds",
    }
    if nvml.get("pids_not_visible_here") and not any(n["seen"] for n in seen):
        evidence["warning"] = (
            "NVML lists pids that this process cannot see (another PID namespace): per-process readings "
            "cannot be matched to our children, so the 0 MiB figure proves nothing; the device's return to "
            "its baseline is the evidence left"
        )
    return evidence


def _oom(ctx: Context, work: Path, profile: str) -> dict:
    """A real CUDA out-of-memory under the fraction cap, retried with half the batch until it fits."""
    total = _gpu().get("total_mib")
    if not total:
        return {"skipped": "NVML gives no total memory for GPU 0"}
    fraction = round(OOM_CAP_MIB / total, 6)
    batch = OOM_START_BATCH
    texts = {
        # finished by the first child (a group of its own: GROUP_BATCHES x batch texts), before the long ones
        "a-short": [f"short sentence number {i}" for i in range(4 * batch)],
        "b-long-1": _long_texts(batch // 2, seed=1),
        "b-long-2": _long_texts(batch // 2, seed=2),
    }
    settings = _settings(
        ctx,
        work / "out",
        embedding_profile=profile,
        embedding_fallback=False,
        embedding_batch_size=batch,
        gpu_memory_fraction=fraction,
    )
    inputs = _copies(work / "in", list(texts))
    _seed_transcripts(settings, inputs, list(texts.values()))
    done = _run(settings, inputs)
    attempts = [c for c in done["children"] if c["stage"] == "embeddings"]
    ladder = [c["batch_size"] for c in attempts]
    outcomes = [c["outcome"] for c in attempts]
    items = {i["id"]: i for i in done["inputs"]}
    short = items.get("a-short", {}).get("stages", {}).get("embeddings", {})
    return {
        "card_total_mib": total,
        "cap_mib": OOM_CAP_MIB,
        "gpu_memory_fraction": fraction,
        "texts": {name: len(t) for name, t in texts.items()},
        "ladder": ladder,
        "outcomes": outcomes,
        "items_per_attempt": [c["items"] for c in attempts],
        "retry_events": done["retries"],
        "report_ladder": [a[:2] for a in done["report_attempts"].get("embeddings", [])],
        "ladder_ok": (
            len(ladder) >= 2
            and all(b == a // 2 for a, b in zip(ladder, ladder[1:], strict=False))
            and all(o == "oom" for o in outcomes[:-1])
            and outcomes[-1] == "ok"
        ),
        # the short input: done by the first child, in no later child's request
        "finished_not_redone": (
            len(attempts) >= 2
            and short.get("status") == "ok"
            and short.get("retries", 0) == 0
            and short.get("batch_size") == batch
            and all(c["items"] == len(texts) - 1 for c in attempts[1:])
        ),
        **done,
        "evidence": _evidence(done),
    }


def _pressure(ctx: Context, work: Path, profile: str) -> dict:
    """A ballast at 75 % then 88 % of the card while a pipeline run goes: the warnings and the readings."""
    log_path = work / "ballast.log"
    work.mkdir(parents=True, exist_ok=True)
    steps = []
    with open(log_path, "w", encoding="utf-8") as stderr:
        ballast = _start_ballast(ctx.device, stderr)
        ready: dict = {}
        try:
            ready = _reply(ballast, 120)
            for pct in PRESSURE_STEPS:
                ballast.stdin.write(f"{pct}\n")
                ballast.stdin.flush()
                held = _reply(ballast, 60)
                name = f"at{pct:.0f}"
                inputs = _copies(work / name / "in", ["talk"])
                settings = _settings(ctx, work / name / "out", embedding_profile=profile)
                _seed_transcripts(settings, inputs, [_long_texts(32, seed=3)])
                done = _run(settings, inputs)
                peak = _pct(done["nvml"].get("device_peak_used_mib"), done["nvml"])
                steps.append({"target_pct": pct, "ballast": held, "run_device_peak_pct": peak, "run": done})
        except Exception as exc:
            tail = log_path.read_text(encoding="utf-8", errors="replace")[-3000:]
            raise RuntimeError(f"{exc}; after {len(steps)} step(s); the ballast's log ends: {tail}") from exc
        finally:
            _stop_ballast(ballast, ready.get("pid"))
    pid = str(ready.get("pid"))
    return {
        "ballast_pid": ready.get("pid"),
        # per step: the ballast's own checkpoint said NOTICE (INFO) / WARNING (WARNING), in the children's words
        "ballast_notice": [_said(s["ballast"].get("lines", []), "INFO", "NOTICE: GPU memory") for s in steps],
        "ballast_warning": [
            _said(s["ballast"].get("lines", []), "WARNING", "WARNING: GPU memory") for s in steps
        ],
        # per step: the stage child's own lines (its thresholds are on its own allocation)
        "stage_child_warned": [
            any("NOTICE: GPU" in line or "WARNING: GPU" in line for line in s["run"]["child_log_lines"])
            for s in steps
        ],
        # per step: the GPU guard's warning before the child starts names the ballast's pid
        "guard_named_the_ballast": [
            any(pid in line and "other processes hold memory" in line for line in s["run"]["warnings"])
            for s in steps
        ],
        "steps": steps,
        "ballast_log_tail": log_path.read_text(encoding="utf-8", errors="replace")[-4000:],
    }


def _said(lines: list[str], level: str, text: str) -> bool:
    return any(line.startswith(level + " ") and text in line for line in lines)


# -- the ballast (a separate process: python -m bench.device.memory ballast) ------------------------------


def ballast(device: str = "cuda") -> int:
    """Hold GPU memory in steps read from stdin (% of the card in use), each followed by a memory checkpoint
    taken with the stage children's own code; reply one JSON line per step. ``exit`` ends it. On the CPU
    (a rehearsal of the protocol) it holds nothing and its checkpoints are RSS readings."""
    import torch

    from contracts import StageRequest, WorkItem
    from stages.runtime.memory import MemoryCheckpoints

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    said: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            said.append(f"{record.levelname} {record.name}: {record.getMessage()}")

    logging.getLogger("stages.runtime.memory").addHandler(Keep())
    request = StageRequest(
        request_id="ballast",
        stage="ballast",
        module="bench.device.memory",
        items=[WorkItem(id="ballast", inputs={}, output="/dev/null", fingerprint="-")],
        batch_size=1,
        device=device,
        result_path="/dev/null",
    )
    cuda = device != "cpu"
    checkpoints = MemoryCheckpoints("ballast", device, request)
    held = []
    print(json.dumps({"ready": True, "pid": os.getpid()}), flush=True)
    for line in sys.stdin:
        command = line.strip()
        if command == "exit":
            break
        pct = float(command)
        free, total = torch.cuda.mem_get_info() if cuda else (0, 0)
        want = int(pct / 100 * total) - (total - free)
        if cuda and want > 0:
            held.append(torch.empty(want, dtype=torch.uint8, device=device).zero_())
            torch.cuda.synchronize()
        said.clear()
        checkpoint = checkpoints.check(f"holding {pct:.0f}% of the card")
        free, total = torch.cuda.mem_get_info() if cuda else (0, 0)
        print(
            json.dumps(
                {
                    "target_pct": pct,
                    "added_mib": max(0, want) / 2**20,
                    "torch_allocated_mib": checkpoint.allocated_mb,
                    "torch_allocated_pct": checkpoint.allocated_pct,
                    "device_used_pct": 100 * (total - free) / total if total else None,
                    "free_mib": free / 2**20,
                    "total_mib": total / 2**20,
                    "lines": list(said),
                }
            ),
            flush=True,
        )
    return 0


def _start_ballast(device: str, stderr) -> subprocess.Popen:
    """Start the ballast detached from this process tree (a shell starts it in the background and exits), so
    that the GPU guard counts it among the *other* processes on the GPU, as another user's job would be; its
    stdin and stdout stay our pipes."""
    env = {k: v for k, v in os.environ.items() if k != "PYTORCH_CUDA_ALLOC_CONF"}
    # the carried packages (/tmp/site on the device machine) stay on the path, the repository first
    path = [str(ROOT), *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]]
    env |= {"PYTHONPATH": os.pathsep.join(dict.fromkeys(path)), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    shell = subprocess.Popen(
        [
            "/bin/sh",
            "-c",
            'exec 3<&0; "$0" -m bench.device.memory ballast "$1" <&3 &',
            sys.executable,
            device,
        ],
        cwd=ROOT,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
    )
    shell.wait(timeout=30)
    return shell


def _stop_ballast(shell: subprocess.Popen, pid: int | None) -> None:
    """Ask the ballast to exit; kill it (by its pid) if it has not within 30 s."""
    import psutil

    try:
        shell.stdin.write("exit\n")
        shell.stdin.close()
    except OSError:
        pass
    deadline = time.monotonic() + 30
    while pid and time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:
            return
        time.sleep(0.2)
    if pid:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass


def _reply(shell: subprocess.Popen, timeout_s: float) -> dict:
    """The ballast's next JSON line (an error when it says nothing for ``timeout_s``, or ends)."""
    ready, _, _ = select.select([shell.stdout], [], [], timeout_s)
    line = shell.stdout.readline() if ready else ""
    if not line:
        raise RuntimeError(f"the ballast said nothing within {timeout_s:.0f} s (or ended): see ballast.log")
    return json.loads(line)


# -- one pipeline run, read back ---------------------------------------------------------------------------


def _run(settings, inputs: list[Path]) -> dict:
    """One ``Orchestrator.process`` with NVML polled alongside; what each stage child did, read back from the
    performance log, the run report and the children's logs."""
    from contracts.perf import read_events
    from orchestrator import Orchestrator
    from orchestrator.telemetry.perf_log import perf_log_path

    with _warnings() as warnings, NvmlWatch() as watch, Orchestrator(settings) as orch:
        report = orch.process(inputs)
    out = Path(settings.output_dir)
    events = read_events(perf_log_path(out, report.run_id))
    run_dir = out / ".runs" / report.run_id
    return {
        "run_id": report.run_id,
        "ok": report.ok,
        "failed": report.failed,
        "wall_s": round(report.wall_s, 1),
        "inputs": [
            {
                "id": i.id,
                "status": i.status,
                "error": i.error,
                "stages": {
                    name: s.model_dump(exclude_defaults=True) | {"seconds": round(s.seconds, 2)}
                    for name, s in i.stages.items()
                },
            }
            for i in report.inputs
        ],
        "children": _child_rows(events, watch),
        # the run report's own record of each stage's children (the ladder as run-report.json shows it)
        "report_attempts": {
            run.stage: [(a.batch_size, a.outcome, a.items, a.ok) for a in run.attempts]
            for run in report.stages
        },
        "retries": [
            {
                "attempt": e.attempt,
                "batch_size": e.batch_size,
                "items": e.items,
                "previous_outcome": e.previous_outcome,
                "previous_batch_size": e.previous_batch_size,
            }
            for e in events
            if e.event == "retry"
        ],
        "nvml": watch.summary(),
        "warnings": warnings,
        "child_log_lines": _child_log_lines(run_dir),
    }


def _child_rows(events: list, watch: NvmlWatch) -> list[dict]:
    """One row per stage child, in start order."""
    starts = {(e.stage, e.attempt): e for e in events if e.event == "stage_start"}
    ends = {(e.stage, e.attempt): e for e in events if e.event == "stage_end"}
    checks = {(e.stage, e.attempt): e for e in events if e.event == "gpu_check"}
    samples: dict[tuple, list] = {}
    for e in events:
        if e.event == "gpu_sample":
            samples.setdefault((e.stage, e.attempt), []).append(e)
    checkpoints: dict[int, list] = {}
    for e in events:
        if e.event == "checkpoint":
            checkpoints.setdefault(e.pid, []).append(e)
    rows = []
    for key, start in sorted(starts.items(), key=lambda kv: kv[1].t):
        end, check = ends.get(key), checks.get(key)
        record = end.record if end is not None else None
        pid = record.pid if record is not None else None
        seen = samples.get(key, [])
        rows.append(
            {
                "stage": key[0],
                "attempt": key[1],
                "pid": pid,
                "batch_size": start.batch_size,
                "items": start.items,
                "device": record.device if record else start.device,
                "outcome": record.outcome if record else None,
                "ok": record.ok if record else None,
                "wall_s": round(record.wall_s, 2) if record else None,
                "peak_torch_mib": _r(record.peak_vram_mb) if record else None,
                "peak_nvml_mib": _r(record.gpu_process_peak_mib) if record else None,
                "tree_after_exit_mib": record.gpu_tree_after_mib if record else None,
                "leak": record.gpu_leak if record else None,
                "max_allocated_pct": _r(record.max_allocated_pct) if record else None,
                "device_before_mib": _r(check.baseline_used_mib) if check else None,
                "device_after_mib": _r(check.device_used_mib) if check else None,
                "device_peak_sampled_mib": _r(max((s.device_used_mib or 0) for s in seen)) if seen else None,
                "samples": len(seen),
                "checkpoints": [
                    {
                        "point": c.point,
                        "kind": c.kind,
                        "allocated_mib": _r(c.allocated_mb),
                        "reserved_mib": _r(c.reserved_mb),
                        "free_mib": _r(c.free_mb),
                        "rss_mib": _r(c.rss_mb),
                    }
                    for c in checkpoints.get(pid, [])
                ],
                "nvml": watch.presence(pid, start.t, end.t if end else None) if watch.available else None,
            }
        )
    return rows


def _child_log_lines(run_dir: Path) -> list[str]:
    """The lines of the run's child logs worth keeping (memory lines, warnings, errors), file by file."""
    lines = []
    for path in sorted(run_dir.glob("*.log")):
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            if any(word in line for word in KEPT):
                lines.append(f"{path.stem}: {line.strip()[:600]}")
    return lines[:400]


@contextmanager
def _warnings() -> Iterator[list[str]]:
    """The parent's WARNING and ERROR log records while the block runs (the GPU guard's, the runner's, the
    children's as re-logged), as ``LEVEL name: message``."""
    kept: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            kept.append(f"{record.levelname} {record.name}: {record.getMessage()}"[:600])

    handler = Keep(level=logging.WARNING)
    logging.getLogger().addHandler(handler)
    try:
        yield kept
    finally:
        logging.getLogger().removeHandler(handler)


class NvmlWatch:
    """Polls NVML every ``every_s`` in a thread: when each PID was listed on GPU 0, the device's peak use."""

    def __init__(self, every_s: float = 0.1) -> None:
        from orchestrator.gpu.nvml import NvmlReader

        self.reader = NvmlReader()
        self.every_s = every_s
        first = self.reader.read()
        self.available = first.available and bool(first.devices)
        self.reason = first.reason
        self.total_mib = first.devices[0].total_mib if self.available else None
        #: pid -> [first seen, last seen, most MiB, command]
        self.pids: dict[int, list] = {}
        self.device_peak_used_mib = 0.0
        self.reads = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="memory-nvml", daemon=True)

    def __enter__(self) -> NvmlWatch:
        if self.available:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _poll(self) -> None:
        while not self._stop.is_set():
            snapshot = self.reader.read()
            now = time.time()
            dev = snapshot.device(0) if snapshot.available else None
            if dev is not None:
                self.reads += 1
                self.device_peak_used_mib = max(self.device_peak_used_mib, dev.used_mib)
                for p in dev.processes:
                    seen = self.pids.setdefault(p.pid, [now, now, 0.0, p.command])
                    seen[1] = now
                    seen[2] = max(seen[2], p.used_mib or 0.0)
            self._stop.wait(self.every_s)

    def presence(self, pid: int | None, start_t: float, end_t: float | None) -> dict:
        """Whether ``pid`` was listed while its child ran, and not after the parent recorded its end."""
        seen = self.pids.get(pid) if pid else None
        if seen is None:
            return {"seen": False, "seen_while_running": False, "gone_by_end": True}
        first, last, most, _ = seen
        return {
            "seen": True,
            "first_seen_after_start_s": round(first - start_t, 2),
            "last_seen_before_end_s": round(end_t - last, 2) if end_t else None,
            "most_mib": _r(most),
            "seen_while_running": first >= start_t and (end_t is None or first <= end_t),
            "gone_by_end": end_t is not None and last <= end_t,
        }

    def summary(self) -> dict:
        if not self.available:
            return {"available": False, "reason": self.reason}
        return {
            "available": True,
            "reads": self.reads,
            "total_mib": self.total_mib,
            "device_peak_used_mib": _r(self.device_peak_used_mib),
            "parent_pid": os.getpid(),
            "parent_seen": os.getpid() in self.pids,
            # listed by NVML but not visible here: another PID namespace (a container without the host's pids)
            "pids_not_visible_here": [
                pid for pid, seen in self.pids.items() if seen[3].startswith("(not visible")
            ],
            "pids_seen": {
                str(pid): {"most_mib": _r(most), "listed_s": round(last - first, 2), "command": command[:120]}
                for pid, (first, last, most, command) in self.pids.items()
            },
        }


# -- inputs and settings ------------------------------------------------------------------------------------


def _settings(ctx: Context, out: Path, **fields):
    """The run's settings: the stages that need no missing library, NVML sampled often, no waiting."""
    from orchestrator import Settings

    base = {
        "output_dir": out,
        "device": ctx.device,
        "speakers": False,  # diarization and enrollment off
        "corpus_speakers": False,
        "align": False,  # no wav2vec2 aligner
        "export_formats": ["txt"],
        "gpu_sample_s": 0.1,
        "memory_every_item": True,
        "refused_start_wait_s": 0.0,  # a refused start fails now instead of waiting up to 15 minutes
        "allow_hub": False,  # offline: the models resolve the same way when seeding and when running
    }
    # the ASR model that travelled: whisper-base converted for torch, else the tiny random CTranslate2 Whisper;
    # "auto" then has to find out which runtime can use the device (CTranslate2 sees the GPU there but has no
    # CUDA 12 libraries to run on it)
    for name in ("whisper-base-transformers", "ct2-whisper-tiny-random"):
        if any((ctx.weights / name / f).is_file() for f in ("model.safetensors", "model.bin")):
            base["asr_model"] = str(ctx.weights / name)
            break
    base["asr_runtime"] = "auto"
    return Settings(**(base | fields))


def _shown(settings) -> dict:
    keep = (
        "device",
        "asr_model",
        "embedding_profile",
        "embedding_batch_size",
        "gpu_memory_fraction",
        "weights_dir",
    )
    dumped = settings.model_dump(mode="json")
    return {k: dumped.get(k) for k in (*keep, "asr_runtime") if k in dumped}


def _embedding_profile(ctx: Context, model: Path | None) -> tuple[str, str | None]:
    """The embeddings model: ``model``, else ``ctx.weights / "bge-small"``, else the embedded MiniLM."""
    for candidate in (model, ctx.weights / "bge-small"):
        if candidate is not None and Path(candidate).is_dir():
            return str(Path(candidate).resolve()), None
    return (
        "embedded",
        f"no model directory ({model or ctx.weights / 'bge-small'}): the embedded all-MiniLM-L6-v2",
    )


def _max_seq_length(profile: str) -> int | None:
    """The model's longest input in tokens, from its files (None: not said there)."""
    if profile == "embedded":
        return 256
    for name, key in (
        ("sentence_bert_config.json", "max_seq_length"),
        ("config.json", "max_position_embeddings"),
    ):
        path = Path(profile) / name
        if path.is_file():
            value = json.loads(path.read_text()).get(key)
            if value:
                return int(value)
    return None


def _copies(folder: Path, names: list[str]) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in names:
        shutil.copy(SPEECH, folder / f"{name}{SPEECH.suffix}")
        paths.append(folder / f"{name}{SPEECH.suffix}")
    return paths


def _long_texts(count: int, seed: int) -> list[str]:
    """``count`` texts of 600 words (over 512 tokens: each fills the model's longest input)."""
    n = len(WORDS)
    return [" ".join(WORDS[(seed * 7 + i * 13 + j * 5) % n] for j in range(600)) for i in range(count)]


def _seed_transcripts(settings, inputs: list[Path], texts: list[list[str]]) -> None:
    """Write each input's transcripts (ASR's and the alignment stage's, one segment per text) with the
    fingerprints the run will expect, so the run reuses them and runs only the embeddings stage."""
    from contracts import save_model
    from contracts.artifacts import Segment, TranscriptArtifact
    from orchestrator import Orchestrator
    from orchestrator.planning.fingerprints import chain_fingerprints
    from orchestrator.planning.inputs import plan_inputs
    from orchestrator.planning.state import InputState

    with Orchestrator(settings) as orch:
        specs = orch.stage_specs()
    planned = [InputState(p) for p in plan_inputs(inputs, Path(settings.output_dir), dry=True)]
    by_source = {Path(p.source).resolve(): p for p in planned}
    for path, segments in zip(inputs, texts, strict=True):
        inp = by_source[path.resolve()]
        chain_fingerprints(inp, specs)
        inp.directory.mkdir(parents=True, exist_ok=True)
        for stage, key in (
            ("asr", "asr"),
            ("alignment", "transcript"),
        ):  # both are kept: both must be current
            transcript = TranscriptArtifact(
                item_id=inp.id,
                fingerprint=inp.fingerprints[stage],
                source=str(inp.source),
                language="en",
                segments=[Segment(id=i, start=float(i), end=i + 1.0, text=t) for i, t in enumerate(segments)],
                compute_type="seeded",
                batch_size=1,
                duration_s=float(len(segments)),
                model="seeded by bench.device.memory",
                requested_model="seeded by bench.device.memory",
                device="cpu",
            )
            save_model(transcript, inp.artifact(key))


# -- small things -------------------------------------------------------------------------------------------


def _gpu() -> dict:
    """GPU 0 as NVML sees it now (or why it cannot be seen)."""
    from orchestrator.gpu.nvml import NvmlReader

    snapshot = NvmlReader().read()
    if not snapshot.available or not snapshot.devices:
        return {"available": False, "reason": snapshot.reason or "NVML sees no GPU"}
    d = snapshot.devices[0]
    return {
        "available": True,
        "name": d.name,
        "driver": snapshot.driver,
        "total_mib": d.total_mib,
        "used_mib": d.used_mib,
        "processes": [{"pid": p.pid, "mib": p.used_mib, "command": p.command[:120]} for p in d.processes],
    }


def _pct(mib: float | None, nvml: dict) -> float | None:
    total = nvml.get("total_mib")
    return round(100 * mib / total, 1) if mib and total else None


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["ballast"]:
        return ballast(*argv[1:2])
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="where memory.json is written")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--model", type=Path, help="the embeddings model directory (default: WEIGHTS/bge-small)"
    )
    parser.add_argument("--weights", type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    ctx = Context(out=args.out, device=args.device, quick=args.quick)
    if args.weights:
        ctx.weights = args.weights
    result = run(ctx, args.model)
    print(json.dumps(result, indent=2, default=str)[-20000:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
