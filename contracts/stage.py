"""The request a parent hands a stage child, and the result it gets back."""

from __future__ import annotations

from pydantic import Field, JsonValue, model_validator

from contracts.artifacts import Strict, VocabularyFile
from contracts.perf import MemoryCheckpoint
from contracts.report import ChildTimeline, CpuUsage
from contracts.stage_settings import MemorySettings


class SourceVersion(Strict):
    """What the planner saw of a local source file: the first stage refuses one that has changed since."""

    size: int = Field(ge=0)
    mtime_ns: int


class WorkItem(Strict):
    """One input to process in a stage."""

    id: str = Field(min_length=1)
    #: named inputs: the source media path, or paths of upstream artifacts
    inputs: dict[str, str]
    #: where the stage writes this item's artifact (JSON; sidecars go beside it)
    output: str
    #: copied into the artifact, so the parent can tell a current artifact from a stale one
    fingerprint: str = Field(min_length=1)
    #: the source file as planned (first stage, local sources only)
    source_version: SourceVersion | None = None
    #: the vocabulary files that apply to this input (the ASR stage's; nearest folder's, then the input's own)
    vocabulary: list[VocabularyFile] = Field(default_factory=list)


class StageRequest(Strict):
    request_id: str = Field(min_length=1)
    #: the stage's name, e.g. "asr"
    stage: str = Field(min_length=1)
    #: the Python module that implements it, e.g. "stages.asr"
    module: str = Field(pattern=r"^[A-Za-z_][\w.]*$")
    items: list[WorkItem] = Field(min_length=1)
    batch_size: int = Field(ge=1)
    #: "auto", "cpu", "cuda" or "cuda:N"; "auto" is resolved inside the child
    device: str = "auto"
    #: the stage's settings: the dump of its ``contracts.stage_settings`` model, validated by the child
    settings: dict[str, JsonValue] = Field(default_factory=dict)
    #: memory checkpoint options (thresholds, every item, TF32)
    memory: MemorySettings = MemorySettings()
    #: environment applied by the child before any heavy import
    env: dict[str, str] = Field(default_factory=dict)
    #: where the child writes its StageResult
    result_path: str
    #: where the child appends one ItemResult JSON line per finished item (live progress,
    #: and what the parent still learns when the child dies before its result)
    progress_path: str | None = None
    #: when this file exists, the child finishes the item in progress and stops (graceful Ctrl-C)
    stop_path: str | None = None
    #: where the child says which item it is working on (an :class:`InFlight`, rewritten before each item):
    #: the parent's watchdog reads it, and a child that dies blames only that item
    inflight_path: str | None = None
    #: 1 for the first child of this stage, counting every respawn
    attempt: int = Field(default=1, ge=1)
    #: items that were in flight together with others at ``max_item_crashes`` deaths of this stage's
    #: children: a stage that groups inputs (joined windows, shared batches) works on each of these apart,
    #: so the next death names one culprit; every other item keeps the grouping it was planned with
    isolate: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique_ids(self) -> StageRequest:
        ids = [item.id for item in self.items]
        if len(ids) != len(set(ids)):
            raise ValueError("work item ids must be unique within a request")
        return self


class InFlight(Strict):
    """The items a child is working on right now (one file per child, rewritten atomically)."""

    ids: list[str]
    #: when it started on them (seconds since the epoch)
    since: float
    #: seconds of audio in them, once known (the watchdog's limit grows with it)
    audio_s: float | None = None


class ItemResult(Strict):
    id: str
    ok: bool
    output: str | None = None
    #: one line a user can act on, when not ok
    error: str | None = None
    seconds: float = Field(default=0.0, ge=0)

    @model_validator(mode="after")
    def _consistent(self) -> ItemResult:
        if self.ok and self.output is None:
            raise ValueError("an ok item needs its output path")
        if not self.ok and not self.error:
            raise ValueError("a failed item needs an error message")
        return self


class StageResult(Strict):
    request_id: str
    stage: str
    items: list[ItemResult]
    #: device the child actually used
    device: str
    batch_size: int = Field(ge=1)
    #: seconds spent importing the stage's libraries inside the child (a warm child: ahead of its request)
    import_s: float = Field(ge=0)
    #: seconds spent loading the model
    load_s: float = Field(ge=0)
    #: seconds spent on the items themselves
    compute_s: float = Field(ge=0)
    #: of ``compute_s``, the seconds inside model calls (``stages.runtime.clock.model_time``)
    model_s: float | None = Field(default=None, ge=0)
    #: seconds of audio in the items finished (None: the stage's inputs do not say)
    audio_s: float | None = Field(default=None, ge=0)
    #: the child's moments (imported, loaded, first item, last item); the parent adds its own
    timeline: ChildTimeline | None = None
    #: what the kernel counted for the process over ``compute_s`` (absent from older children)
    compute_cpu: CpuUsage | None = None
    #: the model actually used, if the stage has one
    model: str | None = None
    peak_rss_mb: float | None = None
    #: torch.cuda.max_memory_allocated / max_memory_reserved of the child, MiB (None on the CPU)
    peak_vram_mb: float | None = None
    peak_vram_reserved_mb: float | None = None
    #: memory at "before model load", "model loaded", (after each item when asked) and "before exit"
    checkpoints: list[MemoryCheckpoint] = Field(default_factory=list)
    #: set when the child stopped early (e.g. out of memory) after writing some items
    stopped: str | None = None
