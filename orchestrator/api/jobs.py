"""Jobs of the API server: confined input paths, job records on disk, and one queue run through the Orchestrator.

A job is a list of files (directories are expanded at submission) inside the
server's allowed input roots (at most ``job_max_paths`` paths expanding to
``job_max_files`` files, 413 beyond; at most ``job_max_queued`` jobs waiting,
429 beyond). Its state lives in ``<server_dir>/jobs/<id>/job.json`` (a
validated :class:`contracts.api.JobRecord`, written atomically when its status
changes) plus ``progress.jsonl`` beside it, where per-stage progress is
appended as the job runs (one line per stage start and per finished item,
never a rewrite of the record); on load the lines are applied over the record.
Its outputs go to ``<server_dir>/jobs/<id>/out/``. Reading a job takes no
lock: records are immutable snapshots replaced whole. One
thread runs the jobs one at a time, each through the same
:class:`orchestrator.run.pipeline.Orchestrator` as the CLI (isolated stage
children, chunks, journal). On start, jobs found ``queued`` or ``running``
are queued again; the Orchestrator's resume reuses whatever a previous run
finished, so re-running is safe.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import uuid
from collections import deque
from datetime import datetime, timezone
from pathlib import Path

from contracts import ItemResult, load_model, save_model
from contracts.api import JOB_ID, JobInput, JobRecord, JobReport
from contracts.errors import ApiError, ArtifactError
from contracts.report import RunReport
from orchestrator.run.pipeline import Orchestrator
from orchestrator.run.plan import expand_inputs, item_ids, shown
from orchestrator.run.progress import LogProgress
from orchestrator.settings import Settings

log = logging.getLogger(__name__)

JOB_FILE = "job.json"
PROGRESS_FILE = "progress.jsonl"


def confine(raw: str, roots: list[Path]) -> list[Path]:
    """The files ``raw`` names, each resolved and inside one of ``roots``; else an :class:`ApiError`.

    Refused with 403: no roots configured, ``..`` in the path, a path outside
    the roots, or one that resolves (through a symlink, anywhere on the way
    or inside a submitted directory) to a place outside them. Refused with
    422: an empty or NUL-carrying path, one that does not exist, a directory
    without media files. Relative paths are relative to the first root.
    """
    if not roots:
        raise ApiError(403, "this server accepts no jobs: it was started without input roots (--input-root)",
                       type="permission_error", param="paths", code="no_input_roots")
    if not raw or "\0" in raw:
        raise ApiError(422, "a path must be a non-empty string without NUL bytes", param="paths", code="invalid_path")
    path = Path(raw)
    if ".." in path.parts:
        raise ApiError(403, f"'..' is not allowed in paths: {raw}", type="permission_error", param="paths",
                       code="path_outside_roots")
    real_roots = [Path(os.path.realpath(root)) for root in roots]
    if not path.is_absolute():
        path = real_roots[0] / path
    path = Path(os.path.normpath(path))
    if not any(_inside(path, root) or _inside(path, Path(os.path.abspath(r))) for root, r in zip(real_roots, roots)):
        raise ApiError(403, f"outside the allowed input roots: {raw}", type="permission_error", param="paths",
                       code="path_outside_roots")
    real = Path(os.path.realpath(path))
    if not any(_inside(real, root) for root in real_roots):
        raise ApiError(403, f"resolves outside the allowed input roots (symlink): {raw} -> {real}",
                       type="permission_error", param="paths", code="path_outside_roots")
    if not real.exists():
        raise ApiError(422, f"does not exist: {raw}", param="paths", code="path_not_found")
    files = expand_inputs([real]) if real.is_dir() else [real]
    if files == [real] and real.is_dir():
        raise ApiError(422, f"directory without media files: {raw}", param="paths", code="no_media")
    confined = []
    for file in files:
        resolved = Path(os.path.realpath(file))
        if not any(_inside(resolved, root) for root in real_roots):
            raise ApiError(403, f"{file} in {raw} resolves outside the allowed input roots (symlink) -> {resolved}",
                           type="permission_error", param="paths", code="path_outside_roots")
        confined.append(resolved)
    return confined


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


class JobProgress(LogProgress):
    """Keeps a job's record current as the run goes (per input, per stage) and saves it."""

    def __init__(self, queue: JobQueue, record: JobRecord) -> None:
        super().__init__()
        self.queue = queue
        self.record = record
        self._names = {i.id: i for i in record.inputs}

    def stage_started(self, chunk: int, stage: str, items: int) -> None:
        super().stage_started(chunk, stage, items)
        self.queue._progress(self.record.id, {"stage": stage, "chunk": chunk})

    def show_start(self, resumed: int) -> None:
        super().show_start(resumed)
        self.queue._progress(self.record.id, {"chunks": self.chunks})

    def item_finished(self, stage: str, result: ItemResult, chunk: int | None = None) -> None:
        super().item_finished(stage, result, chunk)
        self.queue._item(self.record.id, result.id, stage, "ok" if result.ok else "failed", result.error)


class JobQueue:
    """Job records on disk and the thread that runs them, one at a time."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.directory = Path(settings.server_dir) / "jobs"
        self.directory.mkdir(parents=True, exist_ok=True)
        self._records: dict[str, JobRecord] = {}
        #: per job, its inputs' progress since the record was last written: {input id: JobInput}
        self._live: dict[str, dict[str, JobInput]] = {}
        self._queue: deque[str] = deque()
        self._cond = threading.Condition()
        self._closing = False
        self._current: Orchestrator | None = None
        self._running: str | None = None
        self._thread: threading.Thread | None = None

    # -- records ------------------------------------------------------------
    def _path(self, job_id: str) -> Path:
        return self.directory / job_id / JOB_FILE

    def _save(self, record: JobRecord) -> JobRecord:
        save_model(record, self._path(record.id))
        self._records[record.id] = record
        return record

    def _update(self, job_id: str, **changes) -> JobRecord:
        """Change the record and write it whole (status changes: a few times per job); the progress
        appended so far is folded in and its file emptied."""
        with self._cond:
            current = self.get(job_id)
            record = JobRecord.model_validate(current.model_copy(update=changes).model_dump())
            self._live.pop(job_id, None)
            self._save(record)
            (self.directory / job_id / PROGRESS_FILE).unlink(missing_ok=True)
            return record

    def _progress(self, job_id: str, line: dict) -> None:
        """Append one progress line (no rewrite of the record, no fsync) and apply it in memory."""
        with open(self.directory / job_id / PROGRESS_FILE, "a") as fh:
            fh.write(json.dumps(line) + "\n")
        with self._cond:
            self._apply(job_id, line)

    def _apply(self, job_id: str, line: dict) -> None:
        if "item" in line:
            live = self._live.setdefault(job_id, {})
            item = live.get(line["item"]) or next((i for i in self._records[job_id].inputs if i.id == line["item"]), None)
            if item is not None:
                live[item.id] = item.model_copy(update={"stages": {**item.stages, line["stage"]: line["status"]},
                                                        **({"error": line["error"]} if line.get("error") else {})})
        else:  # the stage running now, the chunk, the number of chunks: a shallow copy, inputs shared
            self._records[job_id] = self._records[job_id].model_copy(update=line)

    def _item(self, job_id: str, item: str, stage: str, status: str, error: str | None) -> None:
        self._progress(job_id, {"item": item, "stage": stage, "status": status, "error": error})

    def get(self, job_id: str) -> JobRecord:
        """The job's current state, without taking a lock (called from request handlers)."""
        import re

        if not re.fullmatch(JOB_ID, job_id):
            raise ApiError(404, f"no such job: {job_id}", type="not_found_error", param="id", code="job_not_found")
        record = self._records.get(job_id)
        if record is None:
            raise ApiError(404, f"no such job: {job_id}", type="not_found_error", param="id", code="job_not_found")
        live = self._live.get(job_id)
        if live:
            record = record.model_copy(update={"inputs": [live.get(i.id, i) for i in record.inputs]})
        return record

    def counts(self) -> dict[str, int]:
        with self._cond:
            counts = {status: 0 for status in ("queued", "running", "done", "failed")}
            for record in self._records.values():
                counts[record.status] += 1
            return counts

    @property
    def queued(self) -> int:
        return len(self._queue)

    @property
    def running(self) -> str | None:
        return self._running

    # -- lifecycle ------------------------------------------------------------
    def start(self) -> None:
        """Load every job on disk, queue again the unfinished ones (oldest first), start the runner."""
        found = []
        for path in sorted(self.directory.glob(f"*/{JOB_FILE}")):
            try:
                found.append(load_model(path, JobRecord))
            except ArtifactError as exc:
                log.error("ignoring an unreadable job: %s", exc)
        with self._cond:
            for record in sorted(found, key=lambda r: r.created_at):
                self._records[record.id] = record
                self._replay(record.id)
                if record.status in ("queued", "running"):
                    self._queue.append(record.id)
                    log.info("job %s: %s before the server stopped; queued again (resume)", record.id, record.status)
        self._thread = threading.Thread(target=self._loop, name="jobs", daemon=True)
        self._thread.start()

    def _replay(self, job_id: str) -> None:
        """Apply the progress appended after the record was last written."""
        path = self.directory / job_id / PROGRESS_FILE
        if not path.exists():
            return
        for number, text in enumerate(path.read_text().splitlines(), 1):
            try:
                self._apply(job_id, json.loads(text))
            except (ValueError, KeyError, TypeError):
                log.warning("job %s: ignoring line %d of %s (cut short?)", job_id, number, path)

    def submit(self, paths: list[str]) -> JobRecord:
        s = self.settings
        if len(paths) > s.job_max_paths:
            raise ApiError(413, f"too many paths in one job: {len(paths)} > {s.job_max_paths} (PIPELINE_JOB_MAX_PATHS)",
                           type="request_too_large", param="paths", code="too_many_paths")
        if len(self._queue) >= s.job_max_queued:
            raise ApiError(429, f"{len(self._queue)} jobs are waiting already (PIPELINE_JOB_MAX_QUEUED); retry later",
                           type="rate_limit_error", code="job_queue_full")
        files: list[Path] = []
        for raw in paths:
            files.extend(confine(raw, s.input_roots))
            if len(set(files)) > s.job_max_files:
                raise ApiError(413, f"the paths expand to more than {s.job_max_files} files (PIPELINE_JOB_MAX_FILES)",
                               type="request_too_large", param="paths", code="too_many_files")
        files = list(dict.fromkeys(files))
        now = datetime.now(timezone.utc)
        job_id = f"{now:%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:8]}"
        out = self.directory / job_id / "out"
        record = JobRecord(id=job_id, paths=[str(f) for f in files], output_dir=str(out), created_at=now,
                           inputs=[JobInput(id=i, source=shown(f)) for i, f in zip(item_ids(files), files)])
        with self._cond:
            if self._closing:
                raise ApiError(503, "the server is shutting down", code="shutting_down")
            self._save(record)
            self._queue.append(job_id)
            self._cond.notify()
        log.info("job %s: queued, %d input(s)", job_id, len(files))
        return record

    def close(self) -> None:
        """Stop: the running job's children finish their current item, and the job stays queued for the next start."""
        with self._cond:
            self._closing = True
            current = self._current
            self._cond.notify_all()
        if current is not None:
            current.stop()
        if self._thread is not None:
            self._thread.join()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    self._cond.wait()
                if self._closing:
                    return
                job_id = self._queue.popleft()
            try:
                self._run(job_id)
            except Exception as exc:  # noqa: BLE001 - one job's failure must not stop the queue
                log.exception("job %s failed", job_id)
                self._update(job_id, status="failed", error=f"{type(exc).__name__}: {exc}",
                             finished_at=datetime.now(timezone.utc))
            finally:
                self._running = None

    def _run(self, job_id: str) -> None:
        record = self.get(job_id)
        for source in record.paths:  # confined at submission; check again: the files may have changed since
            confine(source, self.settings.input_roots)
        record = self._update(job_id, status="running", started_at=datetime.now(timezone.utc),
                              runs=record.runs + 1, error=None)
        self._running = job_id
        settings = self.settings.replace(output_dir=Path(record.output_dir))
        orchestrator = Orchestrator(settings)
        with self._cond:
            self._current = orchestrator
            closing = self._closing
        if closing:
            orchestrator.stop()
        try:
            with orchestrator:
                report = orchestrator.process(record.paths, progress=JobProgress(self, record))
        finally:
            with self._cond:
                self._current = None
        self._finish(job_id, report)

    def _finish(self, job_id: str, report: RunReport) -> None:
        by_id = {i.id: i for i in report.inputs}
        record = self.get(job_id)
        inputs = []
        for item in record.inputs:
            done = by_id.get(item.id)
            if done is None:
                inputs.append(item)
                continue
            stages = {**item.stages, **{name: s.status for name, s in done.stages.items()}}
            inputs.append(item.model_copy(update={"status": done.status, "stages": stages, "error": done.error}))
        summary = JobReport(run_id=report.run_id, ok=report.ok, failed=report.failed, interrupted=report.interrupted,
                            wall_s=report.wall_s, audio_s=report.audio_s, throughput=report.throughput)
        if report.interrupted:
            # stopped by a server shutdown: queued again, resumed at the next start
            self._update(job_id, status="queued", inputs=inputs, report=summary, stage=None)
            log.info("job %s: interrupted by the shutdown; it resumes when the server starts again", job_id)
            return
        status = "done" if report.failed == 0 else "failed"
        self._update(job_id, status=status, inputs=inputs, report=summary, stage=None,
                     finished_at=datetime.now(timezone.utc),
                     error=None if status == "done" else f"{report.failed} of {len(report.inputs)} input(s) failed")
        log.info("job %s: %s (%d ok, %d failed)", job_id, status, report.ok, report.failed)
