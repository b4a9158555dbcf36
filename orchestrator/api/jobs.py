"""Jobs of the API server: confined input paths, job records on disk, and one queue run through the Orchestrator.

A job is a list of files or directories inside the server's allowed input
roots (at most ``job_max_paths`` paths holding ``job_max_files`` media files,
413 beyond, the walk stopping one file past the limit; at most
``job_max_queued`` jobs waiting, 429 beyond). The record keeps the submitted
paths; the run expands directories as ``pipeline process`` does, and whatever
is wrong with one input fails it alone (the job's inputs are the run report's).
Its state lives in ``<server_dir>/jobs/<id>/job.json`` (a validated
:class:`contracts.api.JobRecord`, written atomically when its status changes)
plus ``progress.jsonl`` beside it, where per-stage progress is appended as the
job runs; on load the lines are applied over the record. Its outputs go to
``<server_dir>/jobs/<id>/out/``. Reading a job takes no lock: records are
immutable snapshots replaced whole. One thread runs the jobs one at a time,
each through the same :class:`orchestrator.run.pipeline.Orchestrator` as the
CLI, with the audio stage confined to the roots on the file it opens. On
start, jobs found ``queued`` or ``running`` are queued again (the
Orchestrator's resume reuses what a previous run finished); finished jobs
expire after ``job_retention_s``. One server owns the state folder (its lock).
A transcription (``POST /v1/audio/transcriptions``) is a job of one uploaded
file, read from its own folder only, removed once answered.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
import uuid
from collections import deque
from datetime import UTC, datetime
from pathlib import Path

from contracts import ItemResult, load_model, save_model
from contracts.api import FINISHED, JOB_ID, CancelAsked, JobInput, JobRecord, JobReport
from contracts.errors import ApiError, ArtifactError, PipelineError
from contracts.jsonl import repair_tail
from contracts.report import RunReport
from orchestrator.books.lock import OutputLock
from orchestrator.planning.inputs import iter_media, plan_inputs, shown
from orchestrator.run.pipeline import Orchestrator
from orchestrator.run.progress import LogProgress
from orchestrator.settings import Settings

log = logging.getLogger(__name__)

JOB_FILE = "job.json"
#: written beside the record when a running job's cancel is asked (the cancel outlives a restart)
CANCEL_FILE = "cancel.json"
PROGRESS_FILE = "progress.jsonl"
#: where a transcription's uploaded file is kept (inside its job's folder; the job's only read root)
UPLOAD_DIR = "upload"


def confine(raw: str, roots: list[Path]) -> Path:
    """The path ``raw`` names, normalised (relative paths are relative to the first root) and inside one of
    ``roots``; else an :class:`ApiError`.

    Refused with 403: no roots configured, ``..`` in the path, a path outside the roots, or one that
    resolves (through a symlink anywhere on the way) to a place outside them. Refused with 422: an empty
    path, one with NUL bytes or text that is not valid Unicode. A path that does not exist is accepted: it
    fails alone when the job runs, as on the command line. The audio stage checks again, on the file it
    actually opens (``stages.audio.open_confined``).
    """
    if not roots:
        raise ApiError(
            403,
            "this server accepts no jobs: it was started without input roots (--input-root)",
            type="permission_error",
            param="paths",
            code="no_input_roots",
        )
    if not raw or "\0" in raw:
        raise ApiError(
            422, "a path must be a non-empty string without NUL bytes", param="paths", code="invalid_path"
        )
    try:
        raw.encode("utf-8")
    except UnicodeEncodeError:
        raise ApiError(
            422,
            "a path must be valid Unicode (a lone surrogate was sent)",
            param="paths",
            code="invalid_path",
        ) from None
    path = Path(raw)
    if ".." in path.parts:
        raise ApiError(
            403,
            f"'..' is not allowed in paths: {raw}",
            type="permission_error",
            param="paths",
            code="path_outside_roots",
        )
    real_roots = [Path(os.path.realpath(root)) for root in roots]
    if not path.is_absolute():
        path = real_roots[0] / path
    path = Path(os.path.normpath(path))
    if not any(
        _inside(path, root) or _inside(path, Path(os.path.abspath(r))) for root, r in zip(real_roots, roots)
    ):
        raise ApiError(
            403,
            f"outside the allowed input roots: {raw}",
            type="permission_error",
            param="paths",
            code="path_outside_roots",
        )
    real = Path(os.path.realpath(path))
    if not any(_inside(real, root) for root in real_roots):
        raise ApiError(
            403,
            f"resolves outside the allowed input roots (symlink): {raw}",
            type="permission_error",
            param="paths",
            code="path_outside_roots",
        )
    return path


def count_files(path: Path, roots: list[Path], limit: int) -> int:
    """The media files under ``path`` (1 for a file), walking no further than ``limit`` + 1 of them: 413
    beyond ``limit``, 403 when one of them (or a linked folder) resolves outside the roots."""
    if not path.is_dir():
        return 1
    real_roots = [Path(os.path.realpath(root)) for root in roots]
    count = 0
    for file in iter_media(path):  # as the run will walk it, stopped one file past the limit
        if not any(_inside(Path(os.path.realpath(file)), root) for root in real_roots):
            raise ApiError(
                403,
                f"{shown(file)} resolves outside the allowed input roots (symlink)",
                type="permission_error",
                param="paths",
                code="path_outside_roots",
            )
        count += 1
        if count > limit:
            raise ApiError(
                413,
                f"the paths expand to more than {limit} files (PIPELINE_JOB_MAX_FILES)",
                type="request_too_large",
                param="paths",
                code="too_many_files",
            )
    return count


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def reason(exc: BaseException) -> str:
    """An error as one line for people: the message of the project's errors, without class names or
    HTTP codes; anything else with its kind (details are in the server's log)."""
    if isinstance(exc, ApiError):
        text = exc.message
    elif isinstance(exc, PipelineError):
        text = str(exc)
    else:
        text = f"internal error ({type(exc).__name__}: {exc}); details are in the server's log"
    return " ".join(text.split())[:500]


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


class JobClock:
    """How long jobs take here, learnt from the ones that finished: seconds per input (an exponentially
    weighted mean of wall time / inputs). It is what admission of a transcription estimates its wait
    with; ``prior_s`` stands in until a job has finished."""

    def __init__(self, prior_s: float) -> None:
        self.per_input_s = prior_s
        self.measured = False

    def observe(self, wall_s: float, inputs: int) -> None:
        if inputs <= 0 or wall_s <= 0:
            return
        value = wall_s / inputs
        self.per_input_s = value if not self.measured else 0.7 * self.per_input_s + 0.3 * value
        self.measured = True


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
        self._running_since = 0.0
        #: job id -> delete its outputs and record once it has stopped
        self._cancelled: dict[str, bool] = {}
        self._thread: threading.Thread | None = None
        self._lock: OutputLock | None = None
        self.clock = JobClock(settings.transcription_prior_s)
        #: callbacks per job, called (from the job thread) with the record once it is finished
        self._watchers: dict[str, list] = {}
        #: transcriptions admitted whose upload is still arriving (not queued yet): work ahead all the same
        self.arriving = 0

    # -- the state folder's owner -------------------------------------------------
    def claim(self) -> None:
        """Take the server folder's lock (one server per state folder): :class:`OutputBusyError` (exit 2)
        naming the holder when another server has it. The kernel drops it when this process dies."""
        if self._lock is None:
            lock = OutputLock(
                Path(self.settings.server_dir),
                what="server state folder",
                advice="one server per state folder: give this one its own --server-dir "
                "(PIPELINE_SERVER_DIR), or stop the other",
                role=f"pipeline serve on {self.settings.host}:{self.settings.port}",
            )
            self._lock = lock.__enter__()

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
            item = live.get(line["item"]) or next(
                (i for i in self._records[job_id].inputs if i.id == line["item"]), None
            )
            if item is not None:
                live[item.id] = item.model_copy(
                    update={
                        "stages": {**item.stages, line["stage"]: line["status"]},
                        **({"error": line["error"]} if line.get("error") else {}),
                    }
                )
        else:  # the stage running now, the chunk, the number of chunks: a shallow copy, inputs shared
            self._records[job_id] = self._records[job_id].model_copy(update=line)

    def _item(self, job_id: str, item: str, stage: str, status: str, error: str | None) -> None:
        self._progress(job_id, {"item": item, "stage": stage, "status": status, "error": error})

    def get(self, job_id: str) -> JobRecord:
        """The job's current state, without taking a lock (called from request handlers)."""
        import re

        if not re.fullmatch(JOB_ID, job_id):
            raise ApiError(
                404, f"no such job: {job_id}", type="not_found_error", param="id", code="job_not_found"
            )
        record = self._records.get(job_id)
        if record is None:
            raise ApiError(
                404, f"no such job: {job_id}", type="not_found_error", param="id", code="job_not_found"
            )
        live = self._live.get(job_id)
        if live:
            record = record.model_copy(update={"inputs": [live.get(i.id, i) for i in record.inputs]})
        return record

    def counts(self) -> dict[str, int]:
        with self._cond:
            counts = {status: 0 for status in ("queued", "running", "done", "failed", "cancelled")}
            for record in self._records.values():
                counts[record.status] += 1
            return counts

    @property
    def queued(self) -> int:
        return len(self._queue)

    @property
    def running(self) -> str | None:
        return self._running

    def expected_wait_s(self) -> float:
        """Seconds until a job queued now would start: the inputs of the jobs ahead (and the uploads
        admitted but still arriving, one input each) times the seconds per input measured
        (:class:`JobClock`), less what the running job has done already."""
        with self._cond:
            ahead = sum(len(self._records[j].inputs) or 1 for j in self._queue if j in self._records)
            ahead += self.arriving
            running = self._records.get(self._running) if self._running else None
        per_input = self.clock.per_input_s
        wait = ahead * per_input
        if running is not None:
            wait += max(
                0.0, (len(running.inputs) or 1) * per_input - (time.monotonic() - self._running_since)
            )
        return wait

    # -- lifecycle ------------------------------------------------------------
    def start(self) -> None:
        """Own the state folder, load every job on disk, queue again the unfinished ones (oldest first),
        drop the expired ones, start the runner."""
        self.claim()
        found = []
        for path in sorted(self.directory.glob(f"*/{JOB_FILE}")):
            try:
                found.append(load_model(path, JobRecord))
            except ArtifactError as exc:
                log.error("ignoring an unreadable job: %s", exc)
        with self._cond:
            for record in sorted(found, key=lambda r: r.created_at):
                if record.kind == "transcription" and record.status not in FINISHED:
                    # its client is gone with the previous server: nobody waits for the answer
                    self._records[record.id] = record
                    self._delete(record.id)
                    continue
                self._records[record.id] = record
                self._replay(record.id)
                if record.status in ("queued", "running") and self._cancel_asked(record.id):
                    continue
                if record.status in ("queued", "running"):
                    self._queue.append(record.id)
                    log.info(
                        "job %s: %s before the server stopped; queued again (resume)",
                        record.id,
                        record.status,
                    )
        self.expire()
        self._thread = threading.Thread(target=self._loop, name="jobs", daemon=True)
        self._thread.start()

    def _cancel_asked(self, job_id: str) -> bool:
        """An unfinished job whose cancel was asked before the server stopped: cancelled now (and deleted
        where the cancel asked for it), not run again. False when no cancel was asked."""
        path = self.directory / job_id / CANCEL_FILE
        if not path.exists():
            return False
        try:
            asked = load_model(path, CancelAsked)
        except ArtifactError as exc:
            log.warning("job %s: a cancel was asked (%s); cancelling it", job_id, exc)
            asked = CancelAsked()
        self._update(
            job_id,
            status="cancelled",
            stage=None,
            finished_at=datetime.now(UTC),
            error="cancelled (DELETE) while it ran, before the server stopped",
        )
        log.info("job %s: cancelled before the server stopped; not run again", job_id)
        if asked.delete_outputs:
            self._delete(job_id)
        return True

    def _replay(self, job_id: str) -> None:
        """Apply the progress appended after the record was last written."""
        path = self.directory / job_id / PROGRESS_FILE
        if not path.exists():
            return
        repair_tail(path)  # a line torn by a kill ends here: the job's next line starts a line of its own
        for number, text in enumerate(path.read_text().splitlines(), 1):
            try:
                self._apply(job_id, json.loads(text))
            except (ValueError, KeyError, TypeError):
                log.warning("job %s: ignoring line %d of %s (cut short?)", job_id, number, path)

    def submit(self, paths: list[str], vocabulary: list[str] | None = None) -> JobRecord:
        """Queue the files and directories ``paths`` names (see :func:`confine`); inputs that cannot be read
        fail alone when the job runs."""
        s = self.settings
        if len(paths) > s.job_max_paths:
            raise ApiError(
                413,
                f"too many paths in one job: {len(paths)} > {s.job_max_paths} (PIPELINE_JOB_MAX_PATHS)",
                type="request_too_large",
                param="paths",
                code="too_many_paths",
            )
        self._check_room()
        confined = list(dict.fromkeys(confine(raw, s.input_roots) for raw in paths))
        files = 0
        for path in confined:
            files += count_files(path, s.input_roots, s.job_max_files - files)
        return self._enqueue(confined, kind="job", vocabulary=list(vocabulary or []))

    def submit_upload(
        self, directory: Path, language: str | None, prompt: str | None, channels: str | None = None
    ) -> JobRecord:
        """Queue one uploaded file (``directory`` holds it, inside the job's own folder)."""
        self._check_room()
        files = sorted(directory.iterdir())
        return self._enqueue(
            files,
            kind="transcription",
            job_id=directory.parent.name,
            language=language,
            prompt=prompt,
            channels=channels,
        )

    def upload_arriving(self):
        """Count one admitted upload as work ahead until it is queued (or given up): returns the function
        that stops counting it (idempotent)."""
        with self._cond:
            self.arriving += 1
        counted = True

        def release() -> None:
            nonlocal counted
            with self._cond:
                if counted:
                    counted = False
                    self.arriving -= 1

        return release

    def new_id(self) -> str:
        return f"{datetime.now(UTC):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:8]}"

    def _check_room(self) -> None:
        if len(self._queue) >= self.settings.job_max_queued:
            raise ApiError(
                429,
                f"{len(self._queue)} jobs are waiting already (PIPELINE_JOB_MAX_QUEUED); retry later",
                type="rate_limit_error",
                code="job_queue_full",
            )

    def _enqueue(self, paths: list[Path], kind: str, job_id: str | None = None, **options) -> JobRecord:
        job_id = job_id or self.new_id()
        out = self.directory / job_id / "out"
        # the inputs as the run will plan them (ids mirror the paths; names that are not UTF-8 shown escaped)
        planned = plan_inputs(paths, out, dry=True)
        record = JobRecord(
            id=job_id,
            kind=kind,
            paths=[shown(p) for p in paths],
            output_dir=str(out),
            created_at=datetime.now(UTC),
            inputs=[JobInput(id=i.id, source=i.shown) for i in planned],
            **options,
        )
        with self._cond:
            if self._closing:
                raise ApiError(503, "the server is shutting down", code="shutting_down")
            self._save(record)
            self._queue.append(job_id)
            self._cond.notify()
        log.info("job %s: queued, %d input(s)", job_id, len(record.inputs))
        return record

    def watch(self, job_id: str, callback) -> None:
        """Call ``callback(record)`` from the job thread once the job is finished (at once if it is)."""
        with self._cond:
            record = self._records.get(job_id)
            if record is None or record.status not in FINISHED:
                self._watchers.setdefault(job_id, []).append(callback)
                return
        callback(record)

    def _notify(self, job_id: str) -> None:
        with self._cond:
            callbacks = self._watchers.pop(job_id, [])
            record = self._records.get(job_id)
        for callback in callbacks:
            callback(record)

    def cancel(self, job_id: str, delete_outputs: bool = False) -> JobRecord:
        """Stop a queued or running job (``cancelled``); with ``delete_outputs`` also remove its outputs and
        its record once it has stopped. A running job's children finish their current item first."""
        with self._cond:
            record = self.get(job_id)
            if job_id in self._queue:
                self._queue.remove(job_id)
                record = self._update(
                    job_id,
                    status="cancelled",
                    finished_at=datetime.now(UTC),
                    error="cancelled (DELETE) before it started",
                )
                log.info("job %s: cancelled before it started", job_id)
            elif self._running == job_id:
                self._cancelled[job_id] = delete_outputs
                # on disk too: a server stopped before the job does must not run it again when it starts
                save_model(CancelAsked(delete_outputs=delete_outputs), self.directory / job_id / CANCEL_FILE)
                current = self._current
                log.info("job %s: cancel asked; its children finish their current item", job_id)
                if current is not None:
                    current.stop()
                return record
        if record.status in FINISHED:
            self._notify(job_id)
            if delete_outputs:
                self._delete(job_id)
        return record

    def _delete(self, job_id: str) -> None:
        """Remove a finished job: its folder (record, progress, outputs) and its entry."""
        with self._cond:
            self._records.pop(job_id, None)
            self._live.pop(job_id, None)
        shutil.rmtree(self.directory / job_id, ignore_errors=True)
        log.info("job %s: deleted with its outputs", job_id)

    def delete(self, job_id: str) -> None:
        """Remove a finished job now (what a transcription does once answered); nothing when it is gone
        already (a cancelled queued job is deleted by :meth:`cancel`)."""
        record = self._records.get(job_id)
        if record is not None and record.status in FINISHED:
            self._delete(job_id)

    def _retention(self) -> dict[str, tuple[float, str]]:
        """Per kind of job: seconds a finished one is kept (0: forever) and the setting that says so."""
        s = self.settings
        return {
            "job": (s.job_retention_s, "PIPELINE_JOB_RETENTION_S"),
            "transcription": (s.transcription_retention_s, "PIPELINE_TRANSCRIPTION_RETENTION_S"),
        }

    def expire(self) -> int:
        """Delete the finished jobs older than ``job_retention_s`` and the finished transcriptions nobody
        collected older than ``transcription_retention_s`` (their outputs too); how many."""
        retention = self._retention()
        now = datetime.now(UTC)
        with self._cond:
            old = [
                r
                for r in self._records.values()
                if r.status in FINISHED
                and retention[r.kind][0]
                and (now - (r.finished_at or r.created_at)).total_seconds() > retention[r.kind][0]
            ]
        for record in old:
            seconds, name = retention[record.kind]
            log.info("job %s: finished more than %.0f s ago (%s); deleting it", record.id, seconds, name)
            self._delete(record.id)
        return len(old)

    def close(self) -> None:
        """Stop: the running job's children finish their current item, and the job stays queued for the next
        start. The state folder's lock goes with it."""
        with self._cond:
            self._closing = True
            current = self._current
            self._cond.notify_all()
        if current is not None:
            current.stop()
        if self._thread is not None:
            self._thread.join()
        if self._lock is not None:
            self._lock.__exit__(None, None, None)
            self._lock = None

    def _loop(self) -> None:
        kept = [seconds for seconds, _ in self._retention().values() if seconds]
        sweep = min(60.0, min(kept) / 2) if kept else None
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    if not self._cond.wait(timeout=sweep) and sweep:
                        break
                if self._closing:
                    return
                job_id = self._queue.popleft() if self._queue else None
                if job_id is not None:
                    self._running, self._running_since = job_id, time.monotonic()
            if job_id is None:
                self.expire()
                continue
            try:
                self._run(job_id)
            except Exception as exc:  # one job's failure must not stop the queue
                log.exception("job %s failed", job_id)
                self._update(
                    job_id, status="failed", error=reason(exc), stage=None, finished_at=datetime.now(UTC)
                )
            finally:
                self._running = None
            self._after(job_id)

    def _after(self, job_id: str) -> None:
        self._notify(job_id)
        delete = self._cancelled.pop(job_id, None)
        (self.directory / job_id / CANCEL_FILE).unlink(missing_ok=True)  # the job has stopped
        if delete:
            self._delete(job_id)
        self.expire()

    def _run(self, job_id: str) -> None:
        record = self.get(job_id)
        roots = self.settings.input_roots if record.kind == "job" else [self.directory / job_id / UPLOAD_DIR]
        accepted, refused = [], {}
        for path in record.paths:  # confined at submission; checked again: folders may have changed since
            try:
                accepted.append(confine(path, roots))
            except ApiError as exc:
                refused[path] = exc.message
        record = self._update(
            job_id, status="running", started_at=datetime.now(UTC), runs=record.runs + 1, error=None
        )
        settings = self.settings.replace(
            output_dir=Path(record.output_dir),
            read_roots=roots,
            **({"asr_language": record.language} if record.language else {}),
            **({"asr_prompt": record.prompt} if record.prompt else {}),
            **({"channels": record.channels} if record.channels else {}),
            **({"asr_hotwords": record.vocabulary} if record.vocabulary else {}),
        )
        orchestrator = Orchestrator(settings)
        with self._cond:
            self._current = orchestrator
            stop = self._closing or job_id in self._cancelled
        if stop:
            orchestrator.stop()
        try:
            with orchestrator:
                report = (
                    orchestrator.process(accepted, progress=JobProgress(self, record)) if accepted else None
                )
        finally:
            with self._cond:
                self._current = None
        self._finish(job_id, report, refused)

    def _finish(self, job_id: str, report: RunReport | None, refused: dict[str, str]) -> None:
        """The job's inputs are the run report's (one per input the run planned, its status, stages and
        reason), plus a failed one per submitted path refused when the job started."""
        record = self.get(job_id)
        found = list(report.inputs if report else [])
        if record.kind == "job":
            # a link added to a submitted folder after submission, to a place outside the roots, was never
            # read (the audio stage is confined); neither is its name shown, nor anything below it
            real_roots = [Path(os.path.realpath(root)) for root in self.settings.input_roots]
            kept = [
                i
                for i in found
                if i.source in record.paths
                or any(_inside(Path(os.path.realpath(i.source)), root) for root in real_roots)
            ]
            if len(kept) < len(found):
                refused["(links added after submission)"] = (
                    f"{len(found) - len(kept)} file(s) below the submitted folders resolve outside the allowed "
                    "input roots (linked there after submission); left out unread"
                )
            found = kept
        inputs = [
            JobInput(
                id=i.id,
                source=i.source,
                status=i.status,
                error=i.error,
                stages={name: st.status for name, st in i.stages.items()},
            )
            for i in found
        ]
        for path, why in refused.items():
            inputs.append(
                JobInput(
                    id=f"refused-{len(inputs) + 1}",
                    source=path,
                    status="failed",
                    error=f"refused when the job started: {why}",
                )
            )
        summary = report and JobReport(
            run_id=report.run_id,
            ok=report.ok,
            failed=report.failed + len(refused),
            interrupted=report.interrupted,
            wall_s=report.wall_s,
            audio_s=report.audio_s,
            throughput=report.throughput,
        )
        now = datetime.now(UTC)
        if job_id in self._cancelled:
            self._update(
                job_id,
                status="cancelled",
                inputs=inputs or record.inputs,
                report=summary,
                stage=None,
                finished_at=now,
                error="cancelled (DELETE) while it ran",
            )
            log.info("job %s: cancelled", job_id)
            return
        if report is not None and report.interrupted and not report.stopped:
            # stopped by a server shutdown: queued again, resumed at the next start
            self._update(job_id, status="queued", report=summary, stage=None)
            log.info("job %s: interrupted by the shutdown; it resumes when the server starts again", job_id)
            return
        if report is not None:
            self.clock.observe(report.wall_s, len(report.inputs))
        failed = sum(i.status in ("failed", "interrupted") for i in inputs)
        status = "done" if failed == 0 and inputs else "failed"
        error = None
        if report is not None and report.stopped:
            error = f"the run stopped: {report.stopped}"
        elif status == "failed":
            error = f"{failed} of {len(inputs)} input(s) failed"
        self._update(
            job_id, status=status, inputs=inputs, report=summary, stage=None, finished_at=now, error=error
        )
        log.info("job %s: %s (%d input(s), %d failed)", job_id, status, len(inputs), failed)
