"""The Python API: plan inputs, run each stage in isolated children, write outputs and the report.

from orchestrator import Orchestrator, Settings

with Orchestrator(Settings(output_dir="out")) as orch:
    report = orch.process(["talk.mp4", "interview.wav"])

The class keeps what a run shares: the settings, the output lock, the chunks (one after another, or several
at a time), Ctrl-C. One chunk's stage-major steps are ``orchestrator.run.chunk``; what each input needs,
``orchestrator.planning.needs``; finishing inputs, ``orchestrator.run.finish``; the report,
``orchestrator.run.report``. The plan (``orchestrator.planning.inputs.Input``) is apart from each input's run
state (``orchestrator.planning.state.InputState``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import threading
import time
import uuid
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from contracts.errors import DiskFullError, SettingsError
from contracts.io import is_disk_full
from contracts.report import RunPlan, RunReport
from orchestrator import layout
from orchestrator.books.journal import Journal
from orchestrator.books.lock import OutputLock
from orchestrator.catalogue.sync import Indexer
from orchestrator.gpu.nvml import NvmlReader, device_problem
from orchestrator.gpu.sizing import resolve_auto
from orchestrator.models.choice import english_only, planned, resolve_models
from orchestrator.models.hub import cached_repos, downloads, resolve_hub
from orchestrator.planning.groups import GROUP_SIZE, plan_groups, whole_group_chunks
from orchestrator.planning.inputs import plan_inputs
from orchestrator.planning.needs import OUTPUTS_VERSION, Resume, dry_run
from orchestrator.planning.state import InputState
from orchestrator.planning.vocabulary import TermStore
from orchestrator.process.executor import Executor, LocalExecutor, Watchdog
from orchestrator.process.hooks import default_hooks
from orchestrator.registry import BY_NAME, StageSpec, process_specs
from orchestrator.remote import check_writable, staging_dir
from orchestrator.remote import configure as configure_remote
from orchestrator.run.chunk import Ahead, RunContext, head_length, run_chunk
from orchestrator.run.finish import deliver_books, export_speakers, write_index
from orchestrator.run.progress import LogProgress, Progress
from orchestrator.run.report import REPORT_NAME, build_report, disk_line, save_report
from orchestrator.run.runner import StageRunner
from orchestrator.settings import Settings
from orchestrator.telemetry.perf_log import child_env as perf_log_env

log = logging.getLogger(__name__)

#: kept for callers of earlier versions
ID_INDEX = layout.IDS


class Orchestrator:
    """Runs the pipeline; leaving the ``with`` block stops every child it started."""

    def __init__(self, settings: Settings | None = None, executor: Executor | None = None) -> None:
        self.settings = settings or Settings()
        configure_remote(self.settings)  # the output URL's identity leaves out the secret parameters set here
        if self.settings.output_url:  # build locally (shared storage), upload each finished input
            local = staging_dir(self.settings.output_url, self.settings.staging_dir)
            self.settings = self.settings.replace(output_dir=local)
        self.executor = executor or make_executor(self.settings)
        self._stopping = False
        self._stop_file: Path | None = None
        #: the signal that stopped the last run (SIGINT, SIGTERM), if one did
        self.stopped_by: int | None = None
        #: the last run stopped because a disk was full: where, how much (one line)
        self.disk_full: str | None = None
        #: the last run's report could not be written: why
        self.report_error: str | None = None

    def __enter__(self) -> Orchestrator:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        self.executor.close()

    def stage_specs(self) -> list[StageSpec]:
        """The stages this run needs, from the registry (``auto`` settings resolved for the GPU at hand), each
        with the model it will run (``orchestrator.models.choice``)."""
        unknown = sorted(set(self.settings.ray_stage_resources) - set(BY_NAME))
        if unknown:  # a misspelt stage would silently keep the default resources
            raise SettingsError(
                f"PIPELINE_RAY_STAGE_RESOURCES names no stage {', '.join(map(repr, unknown))}: the stages are "
                + ", ".join(BY_NAME)
            )
        specs = process_specs(resolve_auto(self.settings))
        for spec in specs:  # refused before anything runs: an English-only Whisper cannot translate
            if getattr(spec.settings, "translate", False) and english_only(spec.settings.model):
                raise SettingsError(
                    f"--translate needs a multilingual Whisper, and ASR model {spec.settings.model!r} is "
                    "English-only: use ASR_MODEL=whisper-base (or another multilingual model), or leave "
                    "--translate off"
                )
        models = resolve_models(specs, bool(self.settings.hub))
        return [planned(dataclasses.replace(spec, model=models.get(spec.name))) for spec in specs]

    def _check_output_and_device(self) -> None:
        """Refused before anything runs (the dry run too), as a usage error: an output folder that is a file,
        an output URL that cannot be written, a ``cuda`` device this machine does not have (NVML)."""
        out = Path(self.settings.output_dir)
        if out.exists() and not out.is_dir():
            raise SettingsError(f"output directory {out} is a file, not a folder: choose another --output")
        if self.settings.output_url:
            check_writable(self.settings.output_url)
        if self.settings.device.startswith("cuda"):
            snapshot = NvmlReader().read()
            visible = self.settings.cuda_visible_devices or os.environ.get("CUDA_VISIBLE_DEVICES")
            problem = device_problem(self.settings.device, visible, snapshot)
            if problem:
                raise SettingsError(problem)

    def stop(self) -> None:
        """Ask for a graceful stop: each child finishes its current item, then the run ends."""
        self._stopping = True
        if self._stop_file is not None:
            self._stop_file.touch()

    def process(self, paths: list[str | Path], progress: Progress | None = None) -> RunReport:
        """Process every input in chunks; a bad input fails alone. Writes and returns the run report.

        Rerunning with the same output directory resumes: valid, current artifacts
        are reused, missing/corrupt/stale ones are redone (``force`` redoes all). One run
        at a time per output directory (:class:`~orchestrator.books.lock.OutputLock`).
        """
        self._check_output_and_device()
        with OutputLock(Path(self.settings.output_dir), wait=self.settings.wait_for_output):
            return self._process(paths, progress)

    # -- corpus speakers (``orchestrator.corpus.speakers``): the output folder's voices, no model runs ----------

    def speakers(self):
        """Each corpus speaker of the output folder (``pipeline speakers list``), longest speaking time first."""
        from orchestrator.corpus.speakers import summaries

        return summaries(Path(self.settings.output_dir))

    def cluster_speakers(self):
        """Place every input's speakers not placed yet (``pipeline speakers cluster``); their files are
        written again."""
        from orchestrator.corpus.speakers import cluster

        return cluster(self.settings, Path(self.settings.output_dir))

    def name_speaker(self, speaker: str, name: str, force: bool = False):
        """Name corpus speaker ``speaker`` in every file, and write its voice profile into ``profiles_dir``
        (another profile of that name is replaced only with ``force``)."""
        from orchestrator.corpus.speakers import name as run_name

        return run_name(self.settings, Path(self.settings.output_dir), speaker, name, force=force)

    def merge_speakers(self, keep: str, other: str):
        """``other``'s inputs become ``keep``'s (``pipeline speakers merge``)."""
        from orchestrator.corpus.speakers import merge

        return merge(self.settings, Path(self.settings.output_dir), keep, other)

    def split_speaker(self, speaker: str, inputs: list[str] | None = None, distance: float | None = None):
        """The speakers of ``inputs`` leave ``speaker`` for a new corpus speaker; without ``inputs`` its voices
        are grouped again at ``distance`` (``pipeline speakers split``). Returns the new corpus speakers."""
        from orchestrator.corpus.speakers import split

        return split(self.settings, Path(self.settings.output_dir), speaker, inputs, distance)

    def plan(self, paths: list[str | Path]) -> RunPlan:
        """What :meth:`process` would do, stage by stage, with the reasons: starts no child, writes nothing,
        takes no lock (``pipeline process --dry-run``)."""
        clock = time.monotonic()
        self._check_output_and_device()
        self.settings = resolve_hub(self.settings)
        return dry_run(self.settings, self.stage_specs(), paths, clock)

    def _process(self, paths: list[str | Path], progress: Progress | None) -> RunReport:
        progress = progress or LogProgress()
        self.stopped_by = None
        self.settings = resolve_hub(self.settings)  # allow_hub=auto: ask the hub endpoint once per run
        cache_before = cached_repos() if self.settings.hub else None  # to name what the children download
        started = datetime.now(UTC)
        clock = time.monotonic()
        out = Path(self.settings.output_dir)
        run_id = f"{started:%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:6]}"
        run_dir = layout.path(out, layout.RUNS) / run_id
        self._stopping, self._stop_file = False, run_dir / "STOP"
        self.disk_full = None
        specs = self.stage_specs()
        # the catalogue's writer starts now: its start and its one read of what the catalogue holds (a
        # second and more at 100,000 inputs) go on beside the planning, not at the first chunk
        catalogue = Indexer(out, self.settings.output_url) if self.settings.catalogue else None
        try:
            try:  # nothing has run yet: a full disk here is a usage error (exit 2), with the reason
                run_dir.mkdir(parents=True, exist_ok=True)
                configure_remote(self.settings)  # planning's calls to URLs use this run's timeouts
                inputs = [InputState(inp) for inp in plan_inputs(paths, out)]
                if self.settings.asr_join_inputs:  # join groups, fixed and recorded before anything runs
                    size = min(GROUP_SIZE, self.settings.chunk_size)
                    groups = plan_groups(out, [inp.id for inp in inputs], size)
                    for inp in inputs:
                        inp.group = groups[inp.id]
            except (OSError, DiskFullError) as exc:
                if is_disk_full(exc):
                    raise SettingsError(
                        f"output directory {out} is full before the run: {disk_line(exc, out)}"
                    ) from None
                raise
            journal = Journal(layout.path(out, layout.JOURNAL), run_id)
            resume = Resume(self.settings, {} if self.settings.force else journal.completed())
            resumed = sum(resume.resumed(inp, specs) for inp in inputs)  # fingerprints chained
            size = self.settings.chunk_size
            chunks = whole_group_chunks(
                inputs, lambda inp: (inp.group, None) if inp.group else (None, inp.id), size
            )
            log.info(
                "run %s: %d input(s) in %d chunk(s) of up to %d -> %s",
                run_id,
                len(inputs),
                len(chunks),
                size,
                out,
            )
            # a fresh context each run: the corpus speakers are read again (`pipeline speakers` may have
            # changed them since the last run)
            ctx = RunContext(
                settings=self.settings,
                specs=specs,
                runner=self._runner(out, run_id, run_dir),
                journal=journal,
                progress=progress,
                resume=resume,
                stopping=lambda: self._stopping,
                terms=TermStore(run_dir / "vocabulary"),
                catalogue=catalogue,
            )
        except BaseException:  # no run: the writer is stopped, nothing handed to it
            if catalogue is not None:
                catalogue.close(drain=False)
            raise
        progress.start(len(inputs), resumed, len(chunks))
        hard_stop = False
        parallel = min(len(chunks), self.settings.parallel_chunks or self.executor.slots()) or 1
        if parallel > 1:
            log.info("%d chunk(s) at a time", parallel)
        try:
            with self._ctrl_c():
                if parallel == 1:
                    self._run_chunks(ctx, chunks)
                else:
                    self._run_chunks_parallel(ctx, parallel, chunks)
        except KeyboardInterrupt:
            hard_stop = True
            self.executor.stop_all(grace_s=1.0)
        except DiskFullError as exc:  # anywhere: a child's artifact or progress, outputs, the journal
            self.disk_full = disk_line(exc, out)
            log.error("stopping the run: %s", self.disk_full)
            self._stopping = True
            self.executor.stop_all(grace_s=5.0)
        finally:  # the catalogue's writer done with what the chunks handed it (a hard stop: the chunk it writes)
            indexed = ctx.catalogue.close(drain=not hard_stop) if ctx.catalogue is not None else None
        exported = export_speakers(self.settings, ctx.corpus)
        if self.settings.output_url:  # the corpus speakers' books and the catalogue, beside the outputs
            deliver_books(self.settings, out, exported)
        for inp in inputs:
            if inp.alive and not inp.complete:
                inp.interrupted = True
        fetched = downloads(cache_before, cached_repos()) if cache_before is not None else []
        report = build_report(
            self.settings, run_id, started, time.monotonic() - clock, out, inputs, ctx.stage_runs, fetched
        )
        if indexed is not None:
            report = report.model_copy(update={"catalogue": indexed})
        if self.disk_full:
            report = report.model_copy(update={"stopped": f"disk full: {self.disk_full}"})
        # a run that only found everything done leaves the index as it was
        index = "html" in self.settings.export_formats and (
            ctx.resume.fast_resumed < len(inputs) or not layout.path(out, layout.INDEX).exists()
        )
        self.report_error = None  # not the last run's, should writing the report raise
        self.report_error = save_report(self.settings, report, out, run_dir, write_index if index else None)
        progress.finish(report)
        log.info(
            "run %s: %d ok, %d failed, %d interrupted; report %s",
            run_id,
            report.ok,
            report.failed,
            report.interrupted,
            out / REPORT_NAME,
        )
        if hard_stop:
            raise KeyboardInterrupt
        return report

    def _runner(self, out: Path, run_id: str, run_dir: Path) -> StageRunner:
        """The run's stage runner: its children's environment and device, its retry and wait bounds."""
        env = self.settings.child_env() | perf_log_env(out, run_id)
        device = self.settings.device
        if self.settings.executor == "ray":  # Ray assigns each task its GPU(s) through CUDA_VISIBLE_DEVICES
            env.pop("CUDA_VISIBLE_DEVICES", None)
            if device.startswith("cuda:"):
                log.warning(
                    "device %s: under Ray each task sees only the GPU Ray gives it; using cuda", device
                )
                device = "cuda"
        return StageRunner(
            self.executor,
            run_dir,
            env,
            device,
            self.settings.max_signal_retries,
            stop_path=self._stop_file,
            memory=self.settings.memory(),
            max_item_crashes=self.settings.max_item_crashes,
            refused_wait_s=self.settings.refused_start_wait_s,
        )

    def _run_chunks(self, ctx: RunContext, chunks: list[list[InputState]]) -> None:
        """One chunk after another; with ``overlap_chunks``, the next chunk's first stages that use no GPU
        (decoding) run beside this chunk's GPU stages (:class:`~orchestrator.run.chunk.Ahead`)."""
        upto = head_length(ctx.specs) if len(chunks) > 1 and self._overlap() else 0
        ahead = Ahead(ctx, chunks, upto) if upto else None
        try:
            for number, chunk in enumerate(chunks, start=1):
                if self._stopping:
                    break
                start = ahead.take(number) if ahead else None
                run_chunk(ctx, number, chunk, start, (lambda n=number: ahead.start(n + 1)) if ahead else None)
        except BaseException:
            if ahead:
                ahead.close(kill=True)
            raise
        if ahead:
            ahead.close()

    def _overlap(self) -> bool:
        """Whether chunks overlap: ``on``; ``auto`` where the stages compute on a GPU (NVML sees one and the
        device is not the CPU): on a CPU, decoding would take the cores the models compute on."""
        mode = self.settings.overlap_chunks
        if mode != "auto":
            return mode == "on"
        if self.settings.device == "cpu":
            return False
        return bool(NvmlReader().read().devices)

    def _run_chunks_parallel(self, ctx: RunContext, parallel: int, chunks: list[list[InputState]]) -> None:
        """Up to ``parallel`` chunks in flight, each stage-major in its own children (Ray: on other GPUs)."""

        def one(number: int, chunk: list[InputState]) -> None:
            if not self._stopping:
                run_chunk(ctx, number, chunk)

        pool = ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="chunk")
        try:
            futures = [pool.submit(one, number, chunk) for number, chunk in enumerate(chunks, start=1)]
            pending = set(futures)
            while pending:  # short waits: Ctrl-C reaches this (main) thread between them
                done, pending = wait(pending, timeout=0.5, return_when=FIRST_EXCEPTION)
                for future in done:
                    future.result()  # a bug in a chunk's thread stops the run, as it would sequentially
        except BaseException:  # second Ctrl-C, or a bug in a chunk's thread: stop the others, then report
            self._stopping = True
            self.executor.stop_all(grace_s=1.0)
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    @contextmanager
    def _ctrl_c(self):
        """First Ctrl-C or SIGTERM: finish the current item, then stop (after SIGTERM, at most
        ``stop_grace_s`` later the children are stopped anyway). Second: stop the children now."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        presses = 0
        timer: threading.Timer | None = None

        def handler(signum, frame):
            nonlocal presses, timer
            presses += 1
            name = "SIGTERM" if signum == signal.SIGTERM else "Ctrl-C"
            if presses == 1:
                self.stopped_by = signum
                log.warning("%s: finishing the current item, then stopping (Ctrl-C again to stop now)", name)
                self.stop()
                if signum == signal.SIGTERM:  # a service manager waits a bounded time: so do we
                    timer = threading.Timer(self.settings.stop_grace_s, os.kill, (os.getpid(), signal.SIGINT))
                    timer.daemon = True
                    timer.start()
            else:
                log.warning("%s again: stopping the stage children now", name)
                raise KeyboardInterrupt

        previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            if timer is not None:
                timer.cancel()
            for sig, before in previous.items():
                signal.signal(sig, before)


def make_executor(settings: Settings) -> Executor:
    """The executor the settings name (the Ray one is imported only when asked for)."""
    if settings.executor == "ray":
        from orchestrator.scale.ray_executor import RayExecutor

        return RayExecutor(settings)
    return LocalExecutor(
        default_hooks(settings), watchdog=Watchdog.from_settings(settings), start_method=settings.start_method
    )


__all__ = ["ID_INDEX", "OUTPUTS_VERSION", "REPORT_NAME", "Orchestrator", "make_executor"]
