"""run-report.json: what happened to every input and every stage child."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field, JsonValue

from contracts.artifacts import LanguageId, Strict


class CpuUsage(Strict):
    """What the kernel counted for a child's process over its compute phase (``getrusage``, all threads).

    Against ``compute_s`` it tells waiting from working: CPU seconds near
    ``threads x compute_s`` mean the child computed the whole time; far fewer
    mean it waited (for a core, the disk, a lock). Page faults and context
    switches say what it waited for.
    """

    user_s: float = Field(ge=0)
    system_s: float = Field(ge=0)
    minor_faults: int = Field(ge=0)
    major_faults: int = Field(ge=0)
    #: the process gave up its core (I/O, a lock, a thread pool's sleep)
    voluntary_switches: int = Field(ge=0)
    #: the kernel took its core away (something else wanted to run)
    involuntary_switches: int = Field(ge=0)

    @property
    def cpu_s(self) -> float:
        return self.user_s + self.system_s


class ChildTimeline(Strict):
    """The moments of one stage child, in seconds since the epoch (``time.time()``: the parent and its
    children share the clock of one machine; a Ray node's child, that node's clock).

    The parent stamps ``spawned``, ``handed`` and ``exited``; the child the rest. A cold child is handed
    its request before it is spawned; a warm one imports first and is handed it later, so
    ``handed - imported`` is the time it stood ready and waiting. Absent: not reached (a child that died
    before loading has no ``loaded``) or not measured (a child that wrote no result has only the parent's).
    """

    #: the parent started the process
    spawned: float | None = None
    #: the parent wrote the request file (a warm child starts on it the moment it appears)
    handed: float | None = None
    #: the stage's libraries imported (a warm child: ahead of its request)
    imported: float | None = None
    #: the model loaded: weights in memory, on the device
    loaded: float | None = None
    #: the first item started (its input read)
    first_item: float | None = None
    #: the last item finished (written)
    last_item: float | None = None
    #: the parent saw the process end
    exited: float | None = None

    def phases(self) -> dict[str, float] | None:
        """Spawn to exit in consecutive phases (seconds), or None when a moment is missing:
        ``start`` (interpreter, imports), ``ready`` (a warm child waiting for its request), ``load``,
        ``compute`` (model loaded to last item done) and ``exit`` (results written, process gone). Their
        sum is ``exited - spawned``."""
        m = self
        if None in (m.spawned, m.imported, m.loaded, m.last_item, m.exited):
            return None
        begun = max(m.imported, m.handed or m.imported)  # a warm child starts loading once handed
        return {
            "start": m.imported - m.spawned,
            "ready": begun - m.imported,
            "load": m.loaded - begun,
            "compute": m.last_item - m.loaded,
            "exit": m.exited - m.last_item,
        }


class Attempt(Strict):
    """One stage child: how it was asked to run and how it ended.

    The one telemetry record of a child: the run report's ``stages[].attempts`` and the
    performance log's ``stage_end`` event (which ``pipeline report`` reads) hold the same record.
    """

    stage: str
    attempt: int = Field(ge=1)
    batch_size: int = Field(ge=1)
    items: int = Field(ge=0)
    outcome: str
    signal: int | None = None
    #: items the child finished / failed (absent when it died before reporting)
    ok: int | None = None
    failed: int | None = None
    items_per_s: float | None = None
    #: parent's view: spawn to exit (a warm child: its request handed to exit; ``timeline`` has both)
    wall_s: float = Field(ge=0)
    #: child's view (absent when the child died before reporting); ``import_s`` of a warm child is the
    #: time it imported ahead of its request
    import_s: float | None = None
    load_s: float | None = None
    compute_s: float | None = None
    #: of ``compute_s``, the seconds inside model calls (``stages.runtime.clock.model_time``); the rest is
    #: host work (reading, preparing, writing)
    model_s: float | None = None
    #: seconds of audio in the items the child finished (None: not known to the stage)
    audio_s: float | None = None
    #: wall-clock moments of the child, spawn to exit
    timeline: ChildTimeline | None = None
    #: the child's CPU time, faults and switches over ``compute_s``
    compute_cpu: CpuUsage | None = None
    model: str | None = None
    device: str | None = None
    peak_rss_mb: float | None = None
    pid: int | None = None
    #: the Ray node the child ran on (its node id; the executor's log line names its host); None: this machine
    node: str | None = None
    #: torch.cuda.max_memory_allocated of the child, MiB (None on the CPU)
    peak_vram_mb: float | None = None
    #: NVML, parent's view: the child's peak MiB on its GPU, and what our process tree held after it exited
    #: (0.0 proves everything came back); None without NVML
    gpu_process_peak_mib: float | None = None
    gpu_tree_after_mib: float | None = None
    #: the leak error, when memory did not come back
    gpu_leak: str | None = None
    #: highest torch-allocated % of the card at a checkpoint (None on the CPU)
    max_allocated_pct: float | None = None

    @property
    def host_s(self) -> float | None:
        """Of ``compute_s``, the seconds outside model calls."""
        if self.compute_s is None or self.model_s is None:
            return None
        return max(0.0, self.compute_s - self.model_s)

    @property
    def peak_gpu_mib(self) -> float | None:
        """The child's own peak on the GPU: NVML's view when there is one (it sees CTranslate2), else torch's."""
        values = [v for v in (self.gpu_process_peak_mib, self.peak_vram_mb) if v]
        return max(values) if values else None


class StageRun(Strict):
    stage: str
    #: 1-based chunk of inputs this stage child ran for
    chunk: int = 1
    attempts: list[Attempt] = Field(default_factory=list)
    #: items whose valid, current artifact was already on disk
    reused: int = 0
    ok: int = 0
    failed: int = 0
    #: spawn/wait of all attempts
    wall_s: float = 0.0
    #: seconds the run waited for this stage's children to start computing, not hidden behind other work:
    #: from the previous stage's last child's exit (or the chunk's start) to the first item started, plus
    #: each respawn's exit-to-first-item (None: no child computed)
    waited_s: float | None = None


class ItemStage(Strict):
    #: "skipped": the fast path went on without this stage (it ran out of memory even at batch size 1)
    status: Literal["ok", "reused", "failed", "interrupted", "skipped"]
    seconds: float = Field(default=0.0, ge=0)
    batch_size: int | None = None
    retries: int = 0
    error: str | None = None


class InputReport(Strict):
    id: str
    source: str
    #: "interrupted": the run was stopped (Ctrl-C) before this input finished; rerun to resume;
    #: "partial": complete, but its source was damaged and only part of it decoded (``error`` says how much)
    status: Literal["ok", "partial", "failed", "interrupted"]
    error: str | None = None
    failed_stage: str | None = None
    duration_s: float | None = None
    outputs: dict[str, str] = Field(default_factory=dict)
    stages: dict[str, ItemStage] = Field(default_factory=dict)
    #: what the run left out for this input and why (e.g. "no speakers: diarization ran out of memory ...")
    notes: list[str] = Field(default_factory=list)
    #: language identification (the transcript's ``language_id``)
    language: LanguageId | None = None
    #: seconds during which the diarization has two or more voices at once (None: no diarization)
    overlap_s: float | None = None


class CatalogueWrites(Strict):
    """What a run's catalogue writer did beside the run (``OUT/.catalogue``: the chunks' segments)."""

    chunks: int = Field(default=0, ge=0)
    indexed: int = Field(default=0, ge=0)
    dropped: int = Field(default=0, ge=0)
    #: inputs not brought up to date (logged; the next run or ``pipeline index`` repairs them)
    failed: int = Field(default=0, ge=0)
    #: the writer's seconds (indexing, the tables' upkeep), in its own thread while the run goes on
    seconds: float = Field(default=0.0, ge=0)
    #: the run's seconds waiting for the writer: a hand-over queue full, its last chunks at the run's end
    waited_s: float = Field(default=0.0, ge=0)


class RunReport(Strict):
    schema_version: Literal[1] = 1
    run_id: str
    started_at: datetime
    finished_at: datetime
    output_dir: str
    settings: dict[str, JsonValue]
    ok: int
    failed: int
    interrupted: int = 0
    #: inputs complete but damaged part-way (not counted in ``ok``)
    partial: int = 0
    chunk_size: int
    chunks: int
    #: seconds of audio in the inputs that finished ok (reused ones included)
    audio_s: float = 0.0
    wall_s: float = 0.0
    #: hours of audio processed per hour of wall time, counting only work done in this run
    throughput: float | None = None
    #: of ``wall_s``, the seconds during which at least one stage child was computing (first item started
    #: to last item finished), and the rest: start-ups, loads, waits and the parent's own work
    computing_s: float | None = None
    exposed_s: float | None = None
    inputs: list[InputReport]
    stages: list[StageRun]
    #: one line per model that was asked for but not used, for the whole run: asked for, got, why, how to
    #: get the asked one (also printed on the console)
    substitutions: list[str] = Field(default_factory=list)
    #: one line per model repository the children downloaded into the Hugging Face cache during the run
    downloads: list[str] = Field(default_factory=list)
    #: why the run stopped before its end other than by a signal (a full disk: where, how much); the
    #: inputs it did not finish are ``interrupted`` and a rerun resumes them
    stopped: str | None = None
    #: the catalogue's writes (None: the catalogue is off)
    catalogue: CatalogueWrites | None = None


class StagePlan(Strict):
    """What one stage would do in a run (``pipeline process --dry-run``)."""

    stage: str
    #: the model the run resolved for the stage (None: no model)
    model: str | None = None
    reuse: int = Field(default=0, ge=0)
    redo: int = Field(default=0, ge=0)
    #: why inputs would be redone -> how many, e.g. {"model A -> B": 4000, "missing": 12}
    reasons: dict[str, int] = Field(default_factory=dict)


class RunPlan(Strict):
    """A run planned and not started: no child, nothing written."""

    output_dir: str
    inputs: int = Field(ge=0)
    #: sources given more than once (each one input)
    duplicates: int = Field(default=0, ge=0)
    #: folders the walk of the inputs left out: the pipeline's own output folders
    skipped: list[str] = Field(default_factory=list)
    #: inputs whose every stage is current
    complete: int = Field(default=0, ge=0)
    stages: list[StagePlan] = Field(default_factory=list)
    seconds: float = Field(default=0.0, ge=0)
