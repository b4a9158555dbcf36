"""The Python API: plan inputs, run each stage in isolated children, write outputs and the report.

from orchestrator import Orchestrator, Settings

with Orchestrator(Settings(output_dir="out")) as orch:
    report = orch.process(["talk.mp4", "interview.wav"])
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import signal
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from contracts import (
    DiarizationArtifact,
    EmbeddingsArtifact,
    TranscriptArtifact,
    WorkItem,
    load_artifact,
    save_model,
)
from contracts.artifacts import LISTEN_COPY as LISTEN_SCRATCH
from contracts.artifacts import LanguageId
from contracts.errors import DiskFullError, PipelineError, SettingsError
from contracts.io import atomic_write_text, is_disk_full, save_large
from contracts.report import InputReport, ItemStage, RunPlan, RunReport, StagePlan, StageRun
from orchestrator import layout
from orchestrator.corpus.captions import CaptionRules
from orchestrator.corpus.export import load_sources, write_index
from orchestrator.corpus.labels import overlap_seconds
from orchestrator.corpus.outputs import write_outputs
from orchestrator.gpu.sizing import resolve_auto
from orchestrator.process.executor import Executor, LocalExecutor, Watchdog
from orchestrator.process.hooks import default_hooks
from orchestrator.registry import StageSpec, process_specs
from orchestrator.run.hub import cached_repos, downloads, resolve_hub
from orchestrator.run.journal import Completed, Journal
from orchestrator.run.lock import OutputLock
from orchestrator.run.models import actual_model, model_label, resolve_models, same_model
from orchestrator.run.plan import Input, chain_fingerprints, input_keys, plan_inputs
from orchestrator.run.progress import LogProgress, Progress
from orchestrator.run.remote import FetchLimits, fetch, redact, staging_dir, upload, without_credentials
from orchestrator.run.runner import StageRunner, artifact_state
from orchestrator.settings import Settings
from orchestrator.telemetry.perf_log import child_env as perf_log_env

log = logging.getLogger(__name__)

REPORT_NAME = layout.REPORT
#: runs of more inputs than this write their report without indentation
LARGE_REPORT = 1000
#: the one report entry of a stage an input reused (frozen: shared by every such input of a large run)
REUSED = ItemStage(status="reused")
#: bump when the files written from the artifacts change (captions, TXT, segments.jsonl): every input's
#: outputs are then rewritten on the next run
OUTPUTS_VERSION = 3  # 3: corpus speakers' labels, overlapping voices
#: kept for callers of earlier versions
ID_INDEX = layout.IDS


def _redacted(settings: dict) -> dict:
    if settings.get("output_url"):
        settings["output_url"] = redact(settings["output_url"])
    return settings


def _skip(inp: Input, spec: StageSpec, specs: list[StageSpec], reason: str | None) -> None:
    """Fast path: ``inp`` goes on without ``spec``'s artifact; later fingerprints say so, so a rerun redoes them."""
    inp.skipped.add(spec.kind)
    inp.notes.append(f"no speakers from {spec.name}: {reason}")
    chain_fingerprints(inp, specs)


def _skipped_with_input(
    inp: Input, spec: StageSpec, previous: StageSpec | None, specs: list[StageSpec]
) -> bool:
    """A stage that needs an artifact the fast path went without (enrollment without diarization) is skipped too."""
    missing = [k for k in input_keys(spec, previous) if k in inp.skipped and k not in spec.optional_inputs]
    if missing:
        inp.stages[spec.name] = ItemStage(status="skipped", error=f"no {missing[0]} artifact (fast path)")
        inp.skipped.add(spec.kind)
        chain_fingerprints(inp, specs)
    return bool(missing)


class Orchestrator:
    """Runs the pipeline; leaving the ``with`` block stops every child it started."""

    def __init__(self, settings: Settings | None = None, executor: Executor | None = None) -> None:
        self.settings = settings or Settings()
        if self.settings.output_url:  # build locally (shared storage), upload each finished input
            local = staging_dir(self.settings.output_url, self.settings.staging_dir)
            self.settings = self.settings.replace(output_dir=local)
        self.executor = executor or make_executor(self.settings)
        self._stopping = False
        self._stop_file: Path | None = None
        #: item id -> its last "outputs ok" journal event (read once per run)
        self._completed: dict[str, Completed] = {}
        self._shaping: tuple[Settings, str] | None = None
        #: journal summaries' languages, validated (JSON -> LanguageId)
        self._languages: dict[str, LanguageId] = {}
        #: inputs of the current run reused from the journal alone
        self._fast_resumed = 0
        #: the signal that stopped the last run (SIGINT, SIGTERM), if one did
        self.stopped_by: int | None = None
        #: the last run stopped because a disk was full: where, how much (one line)
        self.disk_full: str | None = None
        #: the last run's report could not be written: why
        self.report_error: str | None = None
        #: chunks run in parallel place their speakers in OUT/speakers.json one at a time; the corpus as the
        #: last chunk saved it (the run holds the output lock: nothing else writes it meanwhile)
        self._corpus_lock = threading.Lock()
        self._corpus = None

    def __enter__(self) -> Orchestrator:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        self.executor.close()

    def stage_specs(self) -> list[StageSpec]:
        """The stages this run needs, from the registry (``auto`` settings resolved for the GPU at hand), each
        with the model it will run (``orchestrator.run.models``)."""
        specs = process_specs(resolve_auto(self.settings))
        models = resolve_models(specs, bool(self.settings.hub))
        return [dataclasses.replace(spec, model=models.get(spec.name)) for spec in specs]

    def stop(self) -> None:
        """Ask for a graceful stop: each child finishes its current item, then the run ends."""
        self._stopping = True
        if self._stop_file is not None:
            self._stop_file.touch()

    def process(self, paths: list[str | Path], progress: Progress | None = None) -> RunReport:
        """Process every input in chunks; a bad input fails alone. Writes and returns the run report.

        Rerunning with the same output directory resumes: valid, current artifacts
        are reused, missing/corrupt/stale ones are redone (``force`` redoes all). One run
        at a time per output directory (:class:`~orchestrator.run.lock.OutputLock`).
        """
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

    def name_speaker(self, speaker: str, name: str):
        """Name corpus speaker ``speaker`` in every file, and write its voice profile into ``profiles_dir``."""
        from orchestrator.corpus.speakers import name as run_name

        return run_name(self.settings, Path(self.settings.output_dir), speaker, name)

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
        self.settings = resolve_hub(self.settings)
        out = Path(self.settings.output_dir)
        specs = self.stage_specs()
        inputs = plan_inputs(paths, out, dry=True)
        journal = layout.path(out, layout.JOURNAL)
        self._completed = (
            {} if self.settings.force or not journal.exists() else Journal(journal, "plan").completed()
        )
        reuse = {spec.name: 0 for spec in specs}
        redo: dict[str, Counter] = {spec.name: Counter() for spec in specs}
        complete = 0
        for inp in inputs:
            chain_fingerprints(inp, specs)
            reasons: dict[str, str] = {}
            needs = (
                dict.fromkeys((s.name for s in specs), False)
                if self._resume_complete(inp, specs)
                else self._needs(inp, specs, reasons)
            )
            complete += not any(needs.values())
            for spec in specs:
                if needs[spec.name]:
                    redo[spec.name][reasons[spec.name]] += 1
                elif spec.keep:
                    reuse[spec.name] += 1
        duplicates = sum(1 for inp in inputs for note in inp.notes if note.startswith("given "))
        stages = [
            StagePlan(
                stage=spec.name,
                model=spec.model,
                reuse=reuse[spec.name],
                redo=sum(redo[spec.name].values()),
                reasons=dict(redo[spec.name]),
            )
            for spec in specs
        ]
        return RunPlan(
            output_dir=str(out),
            inputs=len(inputs),
            duplicates=duplicates,
            complete=complete,
            stages=stages,
            seconds=time.monotonic() - clock,
        )

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
        try:  # nothing has run yet: a full disk here is a usage error (exit 2), with the reason
            run_dir.mkdir(parents=True, exist_ok=True)
            inputs = plan_inputs(paths, out)
        except (OSError, DiskFullError) as exc:
            if is_disk_full(exc):
                raise SettingsError(
                    f"output directory {out} is full before the run: {_disk_line(exc, out)}"
                ) from None
            raise
        for inp in inputs:
            chain_fingerprints(inp, specs)
        journal = Journal(layout.path(out, layout.JOURNAL), run_id)
        self._completed = {} if self.settings.force else journal.completed()
        self._fast_resumed = 0
        self._corpus = None  # read again: `pipeline speakers` may have changed it since the last run
        resumed = sum(
            inp.id in self._completed
            and self._completed[inp.id].fingerprint == self._outputs_fingerprint(inp)
            for inp in inputs
        )
        size = self.settings.chunk_size
        chunks = [inputs[i : i + size] for i in range(0, len(inputs), size)]
        log.info(
            "run %s: %d input(s) in %d chunk(s) of up to %d -> %s",
            run_id,
            len(inputs),
            len(chunks),
            size,
            out,
        )

        env = self.settings.child_env() | perf_log_env(out, run_id)
        device = self.settings.device
        if self.settings.executor == "ray":  # Ray assigns each task its GPU(s) through CUDA_VISIBLE_DEVICES
            env.pop("CUDA_VISIBLE_DEVICES", None)
            if device.startswith("cuda:"):
                log.warning(
                    "device %s: under Ray each task sees only the GPU Ray gives it; using cuda", device
                )
                device = "cuda"
        runner = StageRunner(
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
        stage_runs: list[StageRun] = []
        progress.start(len(inputs), resumed, len(chunks))
        hard_stop = False
        parallel = min(len(chunks), self.settings.parallel_chunks or self.executor.slots()) or 1
        if parallel > 1:
            log.info("%d chunk(s) at a time", parallel)
        try:
            with self._ctrl_c():
                if parallel == 1:
                    for number, chunk in enumerate(chunks, start=1):
                        if self._stopping:
                            break
                        self._run_chunk(number, chunk, specs, runner, journal, progress, stage_runs)
                else:
                    self._run_chunks_parallel(parallel, chunks, specs, runner, journal, progress, stage_runs)
        except KeyboardInterrupt:
            hard_stop = True
            self.executor.stop_all(grace_s=1.0)
        except DiskFullError as exc:  # anywhere: a child's artifact or progress, outputs, the journal
            self.disk_full = _disk_line(exc, out)
            log.error("stopping the run: %s", self.disk_full)
            self._stopping = True
            self.executor.stop_all(grace_s=5.0)
        for inp in inputs:
            if inp.alive and not inp.complete:
                inp.interrupted = True
        fetched = downloads(cache_before, cached_repos()) if cache_before is not None else []
        report = self._report(run_id, started, time.monotonic() - clock, out, inputs, stage_runs, fetched)
        if self.disk_full:
            report = report.model_copy(update={"stopped": f"disk full: {self.disk_full}"})
        self.report_error = None
        try:
            if len(report.inputs) <= LARGE_REPORT:
                save_model(report, out / REPORT_NAME, run_dir / REPORT_NAME)
            else:  # compact, one input at a time (100,000 inputs: 196 MB indented, 0.9 GB more to write it whole)
                save_large(report, "inputs", out / REPORT_NAME, run_dir / REPORT_NAME)
            if self.settings.langid_only:
                write_langid_tables(report, out)
            elif "html" in self.settings.export_formats and (
                self._fast_resumed < len(inputs) or not layout.path(out, layout.INDEX).exists()
            ):
                write_index(out)  # a run that only found everything done leaves the index as it was
        except (OSError, DiskFullError) as exc:
            if not is_disk_full(exc):
                raise
            self.report_error = _disk_line(exc, out)
            log.error("could not write the run report: %s", self.report_error)
        if self.settings.output_url:
            try:
                upload([out / REPORT_NAME], self.settings.output_url)
            except Exception as exc:  # noqa: BLE001 - the outputs are uploaded; the report stays local
                log.error("could not upload %s to %s: %s", REPORT_NAME, redact(self.settings.output_url), exc)
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

    def _run_chunks_parallel(
        self,
        parallel: int,
        chunks: list[list[Input]],
        specs: list[StageSpec],
        runner: StageRunner,
        journal: Journal,
        progress: Progress,
        stage_runs: list[StageRun],
    ) -> None:
        """Up to ``parallel`` chunks in flight, each stage-major in its own children (Ray: on other GPUs)."""

        def one(number: int, chunk: list[Input]) -> None:
            if not self._stopping:
                self._run_chunk(number, chunk, specs, runner, journal, progress, stage_runs)

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

    def _run_chunk(
        self,
        number: int,
        chunk: list[Input],
        specs: list[StageSpec],
        runner: StageRunner,
        journal: Journal,
        progress: Progress,
        stage_runs: list[StageRun],
    ) -> None:
        """Stage-major: each stage runs in one child over all of the chunk's inputs that need it."""
        done = {inp.id for inp in chunk if self._resume_complete(inp, specs)}
        needs = {
            inp.id: dict.fromkeys((s.name for s in specs), False)
            if inp.id in done
            else self._needs(inp, specs)
            for inp in chunk
        }
        limits = FetchLimits.from_settings(self.settings)
        for inp in chunk:  # URL inputs: fetched just before their first stage needs them
            if self._stopping:
                return  # what is left is interrupted, for the next run
            if inp.url and needs[inp.id][specs[0].name]:
                try:
                    fetch(inp.url, inp.source, limits, cancelled=lambda: self._stopping)
                except DiskFullError:
                    raise  # the run stops (see _process); this input resumes next run
                except PipelineError as exc:
                    if self._stopping:  # cut short by the stop, not the input's fault
                        return
                    inp.error, inp.failed_stage = str(exc), "fetch"
                    log.error("%s: %s", inp.id, exc)
        warm = None
        try:
            for index, spec in enumerate(specs):
                if self._stopping:
                    return
                previous = specs[index - 1] if index else None
                alive = [inp for inp in chunk if inp.alive]
                todo = [
                    inp
                    for inp in alive
                    if needs[inp.id][spec.name] and not _skipped_with_input(inp, spec, previous, specs)
                ]
                for inp in alive:
                    if not needs[inp.id][spec.name]:
                        inp.stages[spec.name] = REUSED
                if not todo:
                    if warm is not None:
                        runner.executor.cancel(warm)
                        warm = None
                    continue
                following = specs[index + 1] if index + 1 < len(specs) else None
                next_warm = None
                if self.settings.prefetch and following and any(needs[i.id][following.name] for i in alive):
                    next_warm = runner.warm_up(following, number)
                progress.stage_started(number, spec.name, len(todo))
                items = [self._work_item(spec, inp, previous) for inp in todo]
                outcomes, stage_run = runner.run(
                    spec,
                    items,
                    reuse=not self.settings.force,
                    chunk=number,
                    on_item=lambda stage, result, n=number: progress.item_finished(stage, result, chunk=n),
                    warm=warm,
                )
                warm = next_warm
                stage_runs.append(stage_run)
                for inp in todo:
                    o = outcomes[inp.id]
                    status = (
                        "reused"
                        if o.reused
                        else "interrupted"
                        if o.interrupted
                        else "ok"
                        if o.ok
                        else "skipped"
                        if o.skipped
                        else "failed"
                    )
                    inp.stages[spec.name] = ItemStage(
                        status=status,
                        seconds=o.seconds,
                        batch_size=o.batch_size,
                        retries=o.retries,
                        error=o.error,
                    )
                    inp.worked |= status == "ok"
                    if o.interrupted:
                        inp.interrupted = True
                    elif o.skipped:
                        _skip(inp, spec, specs, o.error)
                    elif not o.ok:
                        inp.error, inp.failed_stage = o.error, spec.name
                    elif not o.reused:
                        self._stamp_model(inp, spec, specs)
                    journal.record(
                        inp.id, spec.name, status, fingerprint=inp.fingerprints[spec.name], error=o.error
                    )
        finally:
            if warm is not None:
                runner.executor.cancel(warm)
        labels = self._place_speakers([inp for inp in chunk if inp.alive and inp.id not in done])
        for inp in chunk:
            if inp.alive and inp.id not in done:
                noted = len(inp.notes)
                self._finish(inp, labels.get(inp.id))
                journal.record(
                    inp.id,
                    "outputs",
                    "ok" if inp.complete else "failed",
                    fingerprint=self._outputs_fingerprint(inp),
                    error=inp.error,
                    **(self._completion(inp, specs, inp.notes[noted:]) if inp.complete else {}),
                )
            if not inp.interrupted:
                progress.input_finished(inp.complete, inp.duration_s or 0.0)
        progress.chunk_finished(number)

    def _place_speakers(self, inputs: list[Input]) -> dict[str, dict[str, tuple[str, str]]]:
        """Corpus speakers: the voices of ``inputs`` placed in OUT/speakers.json (numpy and scipy on the stored
        vectors, no model); the files of other inputs whose labels this changed are written again. Returns
        the labels the files of ``inputs`` show. A failure here costs the labels, never an input."""
        if (
            not (self.settings.corpus_speakers and self.settings.speakers and inputs)
            or self.settings.langid_only
        ):
            return {}
        from orchestrator.corpus.labels import corpus_labels
        from orchestrator.corpus.speakers import place, rewrite

        out = Path(self.settings.output_dir)
        with self._corpus_lock:
            try:
                placed = place(self.settings, out, [inp.id for inp in inputs], self._corpus)
                self._corpus = placed.corpus
                others = placed.changed - {inp.id for inp in inputs}
                if others:
                    rewrite(self.settings, out, others, placed.corpus)
            except (PipelineError, OSError, ValueError) as exc:
                if is_disk_full(exc):
                    raise DiskFullError(str(exc)) from None
                log.error("corpus speakers not updated: %s", exc)
                return {}
        if placed.new_speakers:
            log.info(
                "corpus speakers: %d new (%s), %d in all",
                len(placed.new_speakers),
                ", ".join(placed.new_speakers[:10]),
                len(placed.corpus.speakers),
            )
        return corpus_labels(placed.corpus)

    def _outputs_fingerprint(self, inp: Input) -> str:
        """What an input's outputs are made from: every stage's fingerprint and the settings that shape the
        written files (captions, where outputs go, langid-only), so a change of either rewrites them."""
        if self._shaping is None or self._shaping[0] is not self.settings:
            shaping = {
                k: v
                for k, v in self.settings.model_dump(mode="json").items()
                if k.startswith(("caption_", "export_"))
            }
            self._shaping = (
                self.settings,
                json.dumps(
                    {
                        "outputs": shaping,
                        "version": OUTPUTS_VERSION,
                        "langid_only": self.settings.langid_only,
                        "output_url": without_credentials(self.settings.output_url or ""),
                    },
                    sort_keys=True,
                ),
            )
        blob = json.dumps(inp.fingerprints, sort_keys=True) + self._shaping[1]
        return hashlib.sha256(blob.encode()).hexdigest()[:32]

    def _completion(self, inp: Input, specs: list[StageSpec], notes: list[str]) -> dict:
        """What the journal keeps of a completed input so that a rerun can reuse it without reading its
        artifacts: each kept file's size and modification time, and what the report shows."""
        files = {}
        for path in [*(inp.artifact(s.kind) for s in specs if s.keep), *map(Path, inp.outputs.values())]:
            try:
                st = path.stat()
            except OSError:  # an uploaded output (a URL): nothing local to check
                continue
            files[path.name] = [st.st_size, st.st_mtime_ns]
        summary = {
            "duration_s": inp.duration_s,
            "outputs": inp.outputs,
            "notes": notes,
            "overlap_s": inp.overlap_s,
            "substitutions": inp.substitutions,
            "damage": inp.damage,
            "language": inp.language.model_dump(mode="json") if inp.language else None,
        }
        return {"files": files, "summary": summary}

    def _resume_complete(self, inp: Input, specs: list[StageSpec]) -> bool:
        """An input the journal saw completed with the same outputs fingerprint, whose files are still the
        very ones (size and modification time) validated then: reused without reading them again."""
        # outputs at a URL are uploaded again by every run (a lost upload is redone)
        if self.settings.output_url:
            return False
        done = self._completed.pop(inp.id, None)  # each input is checked once a run; what is checked is freed
        if done is None or not inp.alive or done.fingerprint != self._outputs_fingerprint(inp):
            return False
        event = done.event()
        files, summary = event.get("files"), event.get("summary")
        if not isinstance(files, dict) or not files or not isinstance(summary, dict):
            return False  # a journal of an earlier version: check the artifacts themselves
        for name, (size, mtime_ns) in files.items():
            try:
                st = (inp.directory / name).stat()
            except OSError:
                return False
            if (st.st_size, st.st_mtime_ns) != (size, mtime_ns):
                return False
        try:
            inp.language = self._language(summary.get("language"))
        except ValueError:
            return False
        inp.duration_s, inp.outputs, inp.damage = (
            summary.get("duration_s"),
            summary.get("outputs") or {},
            summary.get("damage"),
        )
        overlap = summary.get("overlap_s")
        inp.overlap_s = float(overlap) if isinstance(overlap, (int, float)) else None
        inp.notes.extend(summary.get("notes") or [])
        inp.substitutions = list(summary.get("substitutions") or [])
        inp.stages = {spec.name: REUSED for spec in specs if spec.keep}
        self._fast_resumed += 1
        inp.complete = True
        return True

    def _language(self, raw: dict | None) -> LanguageId | None:
        """A journal summary's language, validated once per distinct value (a corpus has few)."""
        if not raw:
            return None
        key = json.dumps(raw, sort_keys=True)
        cache = self._languages
        if key not in cache:
            if len(cache) > 10_000:
                cache.clear()
            cache[key] = LanguageId.model_validate(raw)
        return cache[key]

    def _stamp_model(self, inp: Input, spec: StageSpec, specs: list[StageSpec]) -> None:
        """A stage that ran another model than resolved (it fell back): its artifact's fingerprint and the
        ones after it are made from the model that ran, so a later run that can have the asked-for model
        redoes this stage and what depends on it, and one that cannot keeps them."""
        if spec.name not in ("diarization", "embeddings"):
            return
        path = inp.artifact(spec.kind)
        try:
            artifact = load_artifact(path, spec.output)
        except PipelineError:
            return
        ran = actual_model(spec.name, artifact, spec.model)
        if ran == spec.model:
            return
        log.warning("%s: %s ran %s, not %s", inp.id, spec.name, ran, spec.model)
        inp.models[spec.name] = ran
        chain_fingerprints(inp, specs)
        save_model(artifact.model_copy(update={"fingerprint": inp.fingerprints[spec.name]}), path)

    def _needs(
        self, inp: Input, specs: list[StageSpec], reasons: dict[str, str] | None = None
    ) -> dict[str, bool]:
        """Which stages must run for ``inp``: a stage whose artifact is not current, if a kept artifact
        depends on it. A later current artifact spares its upstream stages entirely. ``reasons`` gets
        why, for each stage that must run (the dry run's)."""
        needs: dict[str, bool] = {}
        read: set[str] = set()  # artifacts that a stage which runs reads
        states: dict[str, tuple] = {}
        for index in range(len(specs) - 1, -1, -1):
            spec = specs[index]
            previous = specs[index - 1] if index else None
            item = self._work_item(spec, inp, previous)
            if self.settings.force:
                artifact, state = None, "forced (--force)"
            else:
                artifact, state = artifact_state(item, spec.output, quiet=reasons is not None)
            states[spec.name] = (artifact, state)
            needs[spec.name] = state != "current" and (spec.keep or spec.kind in read)
            if needs[spec.name]:
                read |= set(input_keys(spec, previous))
        if reasons is not None:
            redone: set[str] = set()
            for index, spec in enumerate(specs):
                if not needs[spec.name]:
                    continue
                artifact, state = states[spec.name]
                upstream = [k for k in input_keys(spec, specs[index - 1] if index else None) if k in redone]
                if state == "stale":
                    was = model_label(spec.name, artifact)
                    if was is not None and spec.model is not None and not same_model(was, spec.model):
                        state = f"model {was} -> {spec.model}"
                    elif upstream:
                        state = f"its input ({upstream[0]}) is redone"
                    else:
                        state = "settings, code or source changed"
                elif state == "missing" and not spec.keep:
                    state = "scratch, needed by a stage that runs"
                reasons[spec.name] = state
                redone.add(spec.kind)
        return needs

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

    def _work_item(self, spec: StageSpec, inp: Input, previous: StageSpec | None) -> WorkItem:
        if previous is None:
            inputs = {"source": str(inp.source)}
        else:  # artifacts a fast path went on without are left out (stages treat them as optional)
            inputs = {
                key: str(inp.artifact(key)) for key in input_keys(spec, previous) if key not in inp.skipped
            }
        return WorkItem(
            id=inp.id,
            inputs=inputs,
            output=str(inp.artifact(spec.kind)),
            fingerprint=inp.fingerprints[spec.name],
            source_version=inp.planned if previous is None and not inp.url else None,
        )

    def _finish(self, inp: Input, corpus: dict[str, tuple[str, str]] | None = None) -> None:
        import numpy as np  # numpy only: no model library in the parent

        if self.settings.langid_only:
            try:
                asr = load_artifact(inp.artifact("asr"), TranscriptArtifact)
            except (PipelineError, OSError, ValueError) as exc:
                inp.error, inp.failed_stage = f"reading the language failed: {exc}", "outputs"
                return
            inp.duration_s, inp.language, inp.damage = asr.duration_s, asr.language_id, asr.source_damage
            if inp.language and inp.language.status == "undetermined":  # not_detectable: in `language` only
                inp.notes.append(f"language {inp.language.status}: {inp.language.reason}")
            inp.complete = True
            if not self.settings.keep_audio:
                shutil.rmtree(inp.directory / ".work", ignore_errors=True)
            return
        try:
            transcript = load_artifact(inp.artifact("transcript"), TranscriptArtifact)
            embeddings = load_artifact(inp.artifact("embeddings"), EmbeddingsArtifact)
            vectors = np.load(inp.directory / embeddings.sidecar, allow_pickle=False)
            if transcript.speakers_note and not inp.skipped:  # a fast-path skip already has its note
                inp.notes.append(transcript.speakers_note)
            if transcript.speech_note:  # e.g. silence: no segments, and why
                inp.notes.append(transcript.speech_note)
            diarization = None
            if inp.artifact("diarization").exists():
                diarization = load_artifact(inp.artifact("diarization"), DiarizationArtifact)
            inp.substitutions = model_substitutions(transcript, embeddings, diarization)
            inp.damage = transcript.source_damage
            inp.language = transcript.language_id
            if embeddings.language_note:
                inp.notes.append(embeddings.language_note)
            if inp.language and inp.language.status == "undetermined":  # not_detectable: in `language` only
                inp.notes.append(f"language {inp.language.status}: {inp.language.reason}")
            if transcript.source_track:
                inp.notes.append(transcript.source_track)
            listen = inp.directory / ".work" / LISTEN_SCRATCH
            if listen.exists():  # the audio stage's compressed copy, kept for the transcript page
                os.replace(listen, inp.directory / layout.LISTEN)
            inp.overlap_s = overlap_seconds(diarization.turns) if diarization is not None else None
            src = load_sources(
                inp.directory,
                inp.id,
                CaptionRules.from_settings(self.settings),
                [*inp.notes, *inp.substitutions],
                transcript,
                diarization,
                corpus,
            )
            inp.outputs = write_outputs(inp.directory, src, embeddings, vectors, self.settings.export_formats)
            if self.settings.output_url:
                self._upload(inp)
            inp.duration_s = transcript.duration_s
        except (PipelineError, OSError, ValueError) as exc:
            if is_disk_full(exc):
                raise DiskFullError(str(exc)) from None  # the run stops; this input resumes next run
            inp.error, inp.failed_stage = f"writing outputs failed: {exc}", "outputs"
            return
        inp.complete = True
        if not self.settings.keep_audio:
            shutil.rmtree(inp.directory / ".work", ignore_errors=True)

    def _upload(self, inp: Input) -> None:
        """The input's outputs and artifacts to OUTPUT_URL/<id>/ (a failure fails it; a rerun uploads again)."""
        url = f"{self.settings.output_url.rstrip('/')}/{inp.id}"
        files = sorted(p for p in inp.directory.iterdir() if p.is_file())
        try:
            upload(files, url)
        except Exception as exc:  # noqa: BLE001 - any protocol's failure fails this input; a rerun uploads again
            raise OSError(f"upload to {redact(url)} failed: {type(exc).__name__}: {exc}") from None
        inp.outputs = {name: redact(f"{url}/{Path(path).name}") for name, path in inp.outputs.items()}

    def _report(
        self,
        run_id: str,
        started: datetime,
        wall_s: float,
        out: Path,
        inputs: list[Input],
        stage_runs: list[StageRun],
        fetched: list[str],
    ) -> RunReport:
        reports = [
            InputReport(
                id=inp.id,
                source=inp.shown,
                status=inp.status,
                error=inp.error or (f"damaged source: {inp.damage}" if inp.damage else None),
                failed_stage=inp.failed_stage,
                duration_s=inp.duration_s,
                outputs=inp.outputs,
                stages=inp.stages,
                notes=inp.notes,
                language=inp.language,
                overlap_s=inp.overlap_s,
            )
            for inp in inputs
        ]
        return RunReport(
            run_id=run_id,
            started_at=started,
            finished_at=datetime.now(UTC),
            output_dir=str(out),
            settings=_redacted(self.settings.model_dump(mode="json")),
            ok=sum(r.status == "ok" for r in reports),
            failed=sum(r.status == "failed" for r in reports),
            interrupted=sum(r.status == "interrupted" for r in reports),
            partial=sum(r.status == "partial" for r in reports),
            chunk_size=self.settings.chunk_size,
            chunks=-(-len(inputs) // self.settings.chunk_size),
            audio_s=sum(inp.duration_s or 0.0 for inp in inputs if inp.complete),
            wall_s=wall_s,
            throughput=worked_audio / wall_s
            if (worked_audio := sum(inp.duration_s or 0.0 for inp in inputs if inp.complete and inp.worked))
            and wall_s > 0
            else None,
            inputs=reports,
            stages=stage_runs,
            substitutions=list(dict.fromkeys(line for inp in inputs for line in inp.substitutions)),
            downloads=fetched,
        )


def _short(reason: str | None, limit: int = 100) -> str:
    text = " ".join((reason or "not available").split())
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


def model_substitutions(
    transcript: TranscriptArtifact, embeddings: EmbeddingsArtifact, diarization: DiarizationArtifact | None
) -> list[str]:
    """One line per model this input asked for and did not get: asked for, got, why, how to get it."""
    lines = []
    if embeddings.fallback_reason:
        lines.append(
            f"embeddings: asked for {embeddings.profile!r} ({embeddings.requested_model}), used the embedded "
            f"all-MiniLM-L6-v2: {_short(embeddings.fallback_reason)} To use it: run once with --allow-hub on "
            "a machine that reaches the hub (it is then cached); EMBEDDING_PROFILE=embedded to keep this one"
        )
    if diarization is not None and diarization.fallback_reason:
        lines.append(
            f"diarization: asked for {diarization.requested_model!r}, used {diarization.model}: "
            f"{_short(diarization.fallback_reason)} To use it: accept its conditions on hf.co, set HF_TOKEN "
            "and run once with --allow-hub; DIARIZATION_MODEL=embedded to keep this one"
        )
    if transcript.diarization and not transcript.aligned:
        lines.append(
            f"alignment: no word timing ({_short(transcript.alignment_note)}): speakers were labelled from "
            "segment timing. To align words: run once with --allow-hub (the aligner is then cached), or "
            "--no-speakers"
        )
    return lines


def make_executor(settings: Settings) -> Executor:
    """The executor the settings name (the Ray one is imported only when asked for)."""
    if settings.executor == "ray":
        from orchestrator.scale.ray_executor import RayExecutor

        return RayExecutor(settings)
    return LocalExecutor(default_hooks(settings), watchdog=Watchdog.from_settings(settings))


__all__ = ["Orchestrator", "make_executor"]


LANGID_COLUMNS = ("input", "source", "status", "language", "probability", "speech_s", "top", "reason")


def _disk_line(exc: BaseException, out: Path) -> str:
    """One line for a full disk: what could not be written (and how much, where the writer knew) and the
    free space left on the output directory's filesystem."""
    what = (
        str(exc)
        if isinstance(exc, DiskFullError)
        else f"{exc.strerror or exc}: {getattr(exc, 'filename', '')}"
    )
    try:
        free = shutil.disk_usage(out).free
        where = f"; {free / 2**20:.1f} MiB free on {out}"
    except OSError:
        where = ""
    return f"{' '.join(what.split())}{where}; free some space and run the same command again to resume"


def write_langid_tables(report: RunReport, out: Path) -> tuple[Path, Path]:
    """``pipeline langid``'s table, one row per input: langid.csv and langid.json in ``out`` (atomic writes)."""
    import csv
    import io

    rows = []
    for item in report.inputs:
        found = item.language
        rows.append(
            {
                "input": item.id,
                "source": item.source,
                "status": found.status if found else item.status,
                "language": found.language if found else None,
                "probability": found.probability if found else None,
                "speech_s": found.speech_s if found else None,
                "top": " ".join(f"{s.language}:{s.probability:.3f}" for s in found.top) if found else "",
                "reason": (found.reason if found else item.error) or "",
            }
        )
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=LANGID_COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: "" if v is None else v for k, v in row.items()} for row in rows)
    csv_path, json_path = layout.path(out, layout.LANGID_CSV), layout.path(out, layout.LANGID_JSON)
    atomic_write_text(csv_path, buffer.getvalue())
    atomic_write_text(json_path, json.dumps(rows, indent=2, ensure_ascii=False) + "\n")
    return csv_path, json_path
