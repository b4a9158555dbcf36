"""What every stage shares: the item loop, timing and result bookkeeping."""

from __future__ import annotations

import io
import logging
import os
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from contracts import (
    Artifact,
    InFlight,
    InputError,
    ItemResult,
    PipelineError,
    StageRequest,
    StageResult,
    WorkItem,
    load_artifact,
    save_model,
)
from contracts.errors import ArtifactError, DiskFullError
from contracts.io import atomic_write_bytes, is_disk_full
from contracts.models import portable_name
from contracts.report import ChildTimeline
from contracts.stage_settings import StageSettings
from stages.runtime.clock import model_seconds
from stages.runtime.memory import MemoryCheckpoints, cpu_counters, cpu_usage_since, is_oom, peak_rss_mb
from stages.runtime.noise import quiet_libraries

log = logging.getLogger(__name__)


class Stage(ABC):
    """A model stage. Subclasses declare their artifact types and fill in the hooks."""

    #: stage name used in requests, logs and reports
    name: ClassVar[str]
    #: artifact type read from each item's ``inputs[input_key]`` (None: the source media)
    input: ClassVar[type[Artifact] | None]
    input_key: ClassVar[str] = "source"
    #: artifact type written to each item's ``output``
    output: ClassVar[type[Artifact]]
    #: what this stage may read of the run's settings; ``run`` validates ``request.settings`` into
    #: ``self.settings`` before anything else (a mismatch is a contract error)
    settings_model: ClassVar[type[StageSettings]]
    #: the stage works on several items at once (:meth:`process_packed`) instead of one by one
    packs_items: ClassVar[bool] = False

    #: what :meth:`load` really loaded, what the settings asked for, and why the two differ (None: they do
    #: not), for stages whose artifact records them (``contracts.artifacts.Provenance``)
    model_name: str | None = None
    requested: str | None = None
    fallback_reason: str | None = None

    def import_libraries(self) -> None:  # noqa: B027 - optional hook
        """Import heavy libraries (timed separately from model loading)."""

    def resolve_device(self, requested: str) -> str:
        """Turn "auto" into a real device; stages without torch run on the CPU."""
        return "cpu" if requested == "auto" else requested

    def load(self, request: StageRequest, device: str) -> str | None:
        """Load the model once per child; return the name of the model actually used."""
        return None

    @abstractmethod
    def process(self, item: WorkItem, upstream: Artifact | str, request: StageRequest) -> Artifact:
        """Produce ``item``'s artifact (the loop validates and saves it to ``item.output``).

        ``upstream`` is the validated input artifact, or the source path for
        the first stage. Sidecar files go next to ``item.output``.
        """

    def process_packed(
        self, entries: Iterator[tuple[WorkItem, Artifact | str]], request: StageRequest
    ) -> Iterator[tuple[WorkItem, Artifact | BaseException]]:
        """For stages with :attr:`packs_items`: consume ``(item, upstream)`` pairs as needed and yield
        each item with its artifact (or the exception that failed it alone), in any order, as soon
        as it is done. Call :meth:`mark_in_flight` with the items whose work is under way."""
        raise NotImplementedError

    def close(self) -> None:  # noqa: B027 - optional hook
        """Drop the model (the process exits right after, which frees everything)."""

    def provenance(self) -> dict[str, Any]:
        """What really ran, as keywords of this stage's artifact: of the model actually loaded, the model
        asked for, why they differ, the device and the batch size, those that :attr:`output` records."""
        ran = {
            "model": self.model_name and portable_name(self.model_name),  # never a path on this machine
            "requested_model": self.requested and portable_name(self.requested),
            "fallback_reason": self.fallback_reason,
            "device": self.device,
            "batch_size": self.batch_size,
        }
        return {name: value for name, value in ran.items() if name in self.output.model_fields}

    # -- the shared loop -------------------------------------------------

    def run(
        self,
        request: StageRequest,
        on_item: Callable[[ItemResult], None] | None = None,
        imported_ahead: tuple[float, float] | None = None,
    ) -> StageResult:
        """Load the model once, then process every item; ``on_item`` hears of each finished one.

        ``imported_ahead``: a warm child's import, done before its request came, as (seconds, when it
        ended in seconds since the epoch): counted as this run's import instead of the cached re-import."""
        started = time.perf_counter()
        self.settings = self.read_settings(request)
        self.import_libraries()
        quiet_libraries()  # again: some libraries set their loggers' level when imported
        imported = time.perf_counter()
        import_s, imported_at = imported - started, time.time()
        if imported_ahead is not None:
            import_s, imported_at = import_s + imported_ahead[0], imported_ahead[1]
        device = self.resolve_device(request.device)
        self.batch_size = request.batch_size
        self.device = device
        # TF32 where supported, the GPU memory cap (gpu_memory_fraction), memory checkpoints
        memory = MemoryCheckpoints(self.name, device, request)
        memory.check("before model load")
        model = self.load(request, device)
        if model is not None:
            log.info("%s: loaded %s on %s (batch size %d)", self.name, model, device, request.batch_size)
        memory.check("model loaded")
        loaded, counters = time.perf_counter(), cpu_counters()
        loaded_at, model_before = time.time(), model_seconds()
        results: list[ItemResult] = []
        self._stopped = None
        self._first_item: float | None = None
        self._audio: dict[str, float] = {}

        def record(result: ItemResult) -> None:
            results.append(result)
            if on_item is not None:
                on_item(result)
            memory.after_item(len(results), len(request.items))

        try:
            if self._packs():
                self._run_packed(request, record)
            else:
                for item in request.items:
                    if self._stop_asked(request, item, len(request.items) - len(results)):
                        break
                    record(self._one(item, request))
        except BaseException:
            memory.check_quietly("at failure")  # e.g. out of memory: what the child held when it stopped
            raise
        finished, compute_cpu = time.perf_counter(), cpu_usage_since(counters)
        finished_at, model_s = time.time(), model_seconds() - model_before
        audio = [self._audio.get(r.id) for r in results if r.ok]
        self.close()
        memory.check("before exit")
        return StageResult(
            request_id=request.request_id,
            stage=self.name,
            items=results,
            device=device,
            batch_size=request.batch_size,
            import_s=import_s,
            load_s=loaded - imported,
            compute_s=finished - loaded,
            model_s=min(model_s, finished - loaded),
            audio_s=sum(audio) if audio and None not in audio else None,
            timeline=ChildTimeline(
                imported=imported_at, loaded=loaded_at, first_item=self._first_item, last_item=finished_at
            ),
            compute_cpu=compute_cpu,
            model=model and portable_name(model),
            peak_rss_mb=peak_rss_mb(),
            stopped=self._stopped,
            **memory.result_fields(),
        )

    def read_settings(self, request: StageRequest) -> StageSettings:
        """``request.settings`` validated against :attr:`settings_model` (ArtifactError: the request is broken)."""
        try:
            return self.settings_model.model_validate(request.settings)
        except ValueError as exc:
            raise ArtifactError(
                request.request_id,
                f"invalid stage settings for {self.name}: {' '.join(str(exc).split())[:300]}",
            ) from exc

    def _packs(self) -> bool:
        """Pack only when :meth:`process_packed` is the most derived of the two hooks: a subclass that
        overrides :meth:`process` of a packing stage gets its ``process`` called, one item at a time."""
        if not self.packs_items:
            return False
        for cls in type(self).__mro__:
            if "process_packed" in cls.__dict__:
                return True
            if "process" in cls.__dict__:
                return False
        return False

    def _stop_asked(self, request: StageRequest, item: WorkItem, left: int) -> bool:
        if request.stop_path and os.path.exists(request.stop_path):
            self._stopped = "interrupted"
            log.warning("%s: stopping before %s as asked (%d item(s) left)", self.name, item.id, left)
            return True
        return False

    def _item_started(self) -> None:
        if getattr(self, "_first_item", None) is None:
            self._first_item = time.time()

    def _one(self, item: WorkItem, request: StageRequest) -> ItemResult:
        t0 = time.perf_counter()
        self._item_started()
        self._in_flight(request, item, None)
        try:
            upstream = self._read_input(item)
            self._audio_of(item, upstream)
            if getattr(upstream, "duration_s", None):
                self._in_flight(request, item, upstream.duration_s)
            artifact = self.process(item, upstream, request)
        except BaseException as exc:  # noqa: BLE001 - _finish re-raises what must stop the child
            return self._finish(item, exc, t0)
        return self._finish(item, artifact, t0)

    def _audio_of(self, item: WorkItem, artifact: Artifact | str) -> None:
        """Note the item's audio seconds, from its input artifact or (the first stage) its output."""
        audio = getattr(self, "_audio", None)
        seconds = getattr(artifact, "duration_s", None)
        if audio is not None and seconds is not None and item.id not in audio:
            audio[item.id] = float(seconds)

    def charge(self, shares: dict[str, float], seconds: float) -> None:
        """Count ``seconds`` of shared work (one call over several inputs' parts) to those inputs, each in
        proportion to its share (audio seconds, parts): a packed input's reported seconds are its own part of
        the work, not the whole batch's, nor the time it waited for the batch to fill."""
        charged = self.__dict__.setdefault("_charged", {})
        total = sum(shares.values())
        for item_id, share in shares.items():
            part = seconds * share / total if total > 0 else seconds / len(shares)
            charged[item_id] = charged.get(item_id, 0.0) + part

    def _run_packed(self, request: StageRequest, record: Callable[[ItemResult], None]) -> None:
        """Feed :meth:`process_packed` the items whose input reads; unreadable ones fail alone at once.
        An item's seconds are what :meth:`charge` counted to it (its part of shared calls), else its wall."""
        started: dict[str, float] = {}
        done = 0
        self._charged = {}

        def entries() -> Iterator[tuple[WorkItem, Artifact | str]]:
            for item in request.items:
                if self._stop_asked(request, item, len(request.items) - done - len(started)):
                    return
                started[item.id] = time.perf_counter()
                self._item_started()
                self._in_flight(request, item, None)
                try:
                    upstream = self._read_input(item)
                    self._audio_of(item, upstream)
                except BaseException as exc:  # noqa: BLE001 - _finish re-raises what must stop the child
                    record(self._finish(item, exc, started.pop(item.id)))
                    continue
                yield item, upstream

        for item, outcome in self.process_packed(entries(), request):
            t0 = started.pop(item.id)
            if item.id in self._charged:
                t0 = time.perf_counter() - self._charged.pop(item.id)
            record(self._finish(item, outcome, t0))
            done += 1

    def _finish(self, item: WorkItem, outcome: Artifact | BaseException, t0: float) -> ItemResult:
        """Save ``item``'s artifact, or turn its failure into a one-line result (OOM and signals go up)."""
        try:
            if isinstance(outcome, BaseException):
                raise outcome
            if not isinstance(outcome, self.output):
                raise TypeError(
                    f"{self.name} produced {type(outcome).__name__}, expected {self.output.__name__}"
                )
            save_model(outcome, item.output)
            self._audio_of(item, outcome)
        except BaseException as exc:
            if is_oom(exc) or is_disk_full(exc) or not isinstance(exc, Exception):
                raise  # the whole child stops; the parent decides (halve the batch, stop the run, ...)
            reason = _one_line(exc)
            level = logging.WARNING if isinstance(exc, PipelineError) else logging.ERROR
            log.log(
                level,
                "%s: %s failed: %s",
                self.name,
                item.id,
                reason,
                exc_info=not isinstance(exc, PipelineError),
            )
            return ItemResult(id=item.id, ok=False, error=reason, seconds=time.perf_counter() - t0)
        seconds = time.perf_counter() - t0
        log.info("%s: %s done in %.2fs", self.name, item.id, seconds)
        return ItemResult(id=item.id, ok=True, output=item.output, seconds=seconds)

    def pack_groups(
        self,
        request: StageRequest,
        entries: Iterator[tuple[WorkItem, Artifact | str]],
        prepare: Callable[[WorkItem, Artifact | str], Member],
        compute: Callable[[list], object],
        finish: Callable[[Member, object], Artifact],
        batches: int,
    ) -> Iterator[tuple[WorkItem, Artifact | BaseException]]:
        """A :meth:`process_packed` for stages whose model work is one call over a list of parts (texts,
        clips): ``prepare`` turns each input into a :class:`Member` with its parts; once the group holds
        ``batches`` batches' worth of parts, ``compute`` runs once over all of them and ``finish`` gets each
        member's rows (``compute``'s result sliced). A failing shared call (other than out of memory) is
        repeated member by member, so only the input that breaks it fails."""
        group: list[Member] = []
        apart = set(request.isolate)  # in flight at deaths with others: their shared call is theirs alone
        for item, upstream in entries:
            if item.id in apart and group:
                yield from self._shared(request, group, compute, finish)
                group = []
            self.mark_in_flight(request, [item.id], getattr(upstream, "duration_s", None))
            t0 = time.perf_counter()
            try:
                group.append(prepare(item, upstream))
                self.charge({item.id: 1.0}, time.perf_counter() - t0)
            except Exception as exc:
                if is_oom(exc):
                    raise
                yield item, exc
                continue
            if sum(len(m.parts) for m in group) >= batches * self.batch_size or item.id in apart:
                yield from self._shared(request, group, compute, finish)
                group = []
        if group:
            yield from self._shared(request, group, compute, finish)

    def _shared(
        self, request: StageRequest, group: list[Member], compute, finish
    ) -> Iterator[tuple[WorkItem, Artifact | BaseException]]:
        seconds = [m.audio_s for m in group]
        self.mark_in_flight(request, [m.item.id for m in group], None if None in seconds else sum(seconds))
        t0 = time.perf_counter()
        try:
            rows = compute([part for m in group for part in m.parts])
            self.charge({m.item.id: len(m.parts) for m in group}, time.perf_counter() - t0)
        except Exception as exc:
            if is_oom(exc):
                raise
            if len(group) == 1:
                yield group[0].item, exc
                return
            log.warning(
                "%s: a shared batch of %d inputs failed (%s); going one by one",
                self.name,
                len(group),
                _one_line(exc),
            )
            rows = None
        start = 0
        for m in group:
            t0 = time.perf_counter()
            try:
                if rows is None:
                    self.mark_in_flight(request, [m.item.id], m.audio_s)
                    outcome = finish(m, compute(m.parts))
                else:
                    outcome = finish(m, rows[start : start + len(m.parts)])
                self.charge({m.item.id: 1.0}, time.perf_counter() - t0)
                yield m.item, outcome
            except Exception as exc:
                if is_oom(exc):
                    raise
                yield m.item, exc
            start += len(m.parts)

    def mark_in_flight(self, request: StageRequest, ids: list[str], audio_s: float | None) -> None:
        """Tell the parent which items the next step works on (crash blame, the watchdog's limit)."""
        self._write_in_flight(request, InFlight(ids=ids, since=time.time(), audio_s=audio_s))

    def _in_flight(self, request: StageRequest, item: WorkItem, audio_s: float | None) -> None:
        self.mark_in_flight(request, [item.id], audio_s)

    @staticmethod
    def _write_in_flight(request: StageRequest, in_flight: InFlight) -> None:
        if not request.inflight_path:
            return
        try:
            save_model(in_flight, request.inflight_path)
        except (DiskFullError, OSError) as exc:  # the work goes on; only crash blame loses these items' names
            log.warning("%s: cannot say %s is in flight: %s", request.stage, ", ".join(in_flight.ids), exc)

    def _read_input(self, item: WorkItem) -> Artifact | str:
        try:
            path = item.inputs[self.input_key]
        except KeyError:
            raise InputError(f"request has no '{self.input_key}' input for {item.id}") from None
        if self.input is None:
            return path
        try:
            return load_artifact(path, self.input)
        except ArtifactError as exc:
            raise InputError(f"upstream artifact unusable: {exc}") from exc


@dataclass(eq=False)
class Member:
    """One input of a :meth:`Stage.pack_groups` group: its parts for the shared call, and what ``finish`` needs."""

    item: WorkItem
    parts: list
    audio_s: float | None = None
    data: object = None


class TorchStage(Stage):
    """A stage whose model runs on torch: "auto" means CUDA when this child sees a GPU."""

    def resolve_device(self, requested: str) -> str:
        if requested != "auto":
            return requested
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"


def save_array(path: Path, array) -> str:
    """Write a numpy array as ``.npy`` atomically; return the file's sha256."""
    import hashlib

    import numpy as np

    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    data = buf.getvalue()
    atomic_write_bytes(path, data)
    return hashlib.sha256(data).hexdigest()


def read_tracks(item: WorkItem, audio, channels: bool = False) -> dict:
    """``item``'s decoded samples (16 kHz float32, the audio stage's sidecars beside ``item.inputs["audio"]``,
    checked against their sha256 as ``audio`` was loaded) by track: ``None`` -> the mix, and with
    ``channels`` each channel the audio stage separated."""
    import numpy as np

    folder = Path(item.inputs["audio"]).parent
    tracks = {None: np.load(folder / audio.sidecar, allow_pickle=False)}
    for track in audio.channel_tracks if channels else []:
        tracks[track.channel] = np.load(folder / track.sidecar, allow_pickle=False)
    return tracks


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    if not isinstance(exc, PipelineError):
        text = f"{type(exc).__name__}: {text}"
    return text[:500]
