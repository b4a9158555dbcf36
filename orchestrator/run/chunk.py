"""One chunk of a run, stage-major: each stage runs in one child over all of the chunk's inputs that need it.

:func:`run_chunk` is the list of its steps, each a function over the run's :class:`RunContext` (what every
chunk shares) and the chunk's inputs' run states (:class:`~orchestrator.planning.state.InputState`)::

    run_head         the chunk's start (:class:`ChunkStart`):
      plan_chunk     which stages each input needs (none: complete by the journal)
      fetch_sources  URL inputs fetched just before their first stage
      (its first stages that use no GPU, when it runs ahead: :class:`Ahead`, ``PIPELINE_OVERLAP_CHUNKS``)
    per stage (``_stage_step``):
      select         the inputs that run it (the others reuse its artifact, or went without it)
      partners       audio: the join group partners of an input whose ASR runs, decoded again if their
                     scratch audio is gone (a finished input's), so the group is decoded as it was planned
      warm_next      warm children: the next stage's (or, with ``prefetch="all"``, every later stage's,
                     at the chunk's first stage) import their libraries meanwhile
      run_stage      one child over them (retries, halved batches, the fast path: the runner's)
      record         each outcome into its input's run state and the journal
    place_speakers   the survivors' voices among the output folder's corpus speakers
    finish_inputs    their outputs written (``orchestrator.run.finish``), recorded in the journal
    drop_partners    (before them) the finished partners' scratch audio removed again

With overlapped chunks, as a chunk's first GPU stage starts, the next chunk's head runs in a thread beside
it (:class:`Ahead`): decoding on the CPU while the models compute on the GPU, one chunk ahead at most.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from contracts import load_artifact, save_model
from contracts.errors import DiskFullError, PipelineError
from contracts.report import ItemStage, StageRun
from orchestrator.books.journal import Journal
from orchestrator.catalogue.sync import Indexer
from orchestrator.models.choice import actual_model, aligner_ran
from orchestrator.planning.fingerprints import artifact_state, chain_fingerprints, input_keys, plan_aligner
from orchestrator.planning.groups import with_groups
from orchestrator.planning.needs import REUSED, Resume, completion, stages_needed, work_item
from orchestrator.planning.state import InputState
from orchestrator.planning.vocabulary import TermStore
from orchestrator.registry import StageSpec
from orchestrator.remote import FetchLimits, fetch
from orchestrator.run.finish import Corpus, finish, place_speakers, remove_scratch
from orchestrator.run.progress import Progress
from orchestrator.run.runner import ItemOutcome, StageRunner
from orchestrator.settings import Settings
from orchestrator.telemetry.timings import last_exit, waited

log = logging.getLogger(__name__)

#: stage -> whether it must run, per input id
Needs = dict[str, dict[str, bool]]


@dataclass
class RunContext:
    """What every chunk of one run shares (chunks run in parallel share it too)."""

    settings: Settings
    specs: list[StageSpec]
    runner: StageRunner
    journal: Journal
    progress: Progress
    #: the journal's completed inputs, the outputs fingerprint
    resume: Resume
    #: whether a stop was asked for (Ctrl-C, SIGTERM, :meth:`Orchestrator.stop`, a failed chunk)
    stopping: Callable[[], bool]
    corpus: Corpus = field(default_factory=Corpus)
    #: every stage run of every chunk, for the report
    stage_runs: list[StageRun] = field(default_factory=list)
    #: where work items find their vocabulary files' terms (None: in the work items)
    terms: TermStore | None = None
    #: the output folder's catalogue, updated as each chunk ends (None: PIPELINE_CATALOGUE off)
    catalogue: Indexer | None = None


@dataclass
class ChunkStart:
    """Where a chunk stands once its first stages have run (:func:`run_head`)."""

    #: the inputs complete by the journal, and the stages each input needs
    done: set[str]
    needed: Needs
    #: when the next stage could start (the chunk's start, then each stage's last exit)
    ready: float
    #: the index of the next stage to run
    next_index: int = 0
    #: a stop was asked for meanwhile
    stopped: bool = False
    #: warm children started so far, by stage index
    warm: dict[int, object] = field(default_factory=dict)


def head_length(specs: list[StageSpec]) -> int:
    """How many of the first stages use no GPU (decoding): what a chunk runs ahead, while the chunk before it
    runs its GPU stages (:func:`run_head`)."""
    count = 0
    while count < len(specs) - 1 and not specs[count].gpu:
        count += 1
    return count


def run_head(ctx: RunContext, number: int, chunk: list[InputState], upto: int = 0) -> ChunkStart:
    """A chunk's start: its plan, its URL inputs fetched, then its first ``upto`` stages run (the stages that
    use no GPU, when the chunk runs ahead of the one before it: ``PIPELINE_OVERLAP_CHUNKS``)."""
    start = ChunkStart(*plan_chunk(ctx, chunk), ready=time.time())
    # URL inputs: fetched just before their first stage needs them
    if not fetch_sources(ctx, chunk, start.needed):
        start.stopped = True  # what is left is interrupted, for the next run
        return start
    for index in range(upto):
        if ctx.stopping():
            start.stopped = True
            return start
        _stage_step(ctx, number, chunk, index, start)
        start.next_index = index + 1
    return start


def run_chunk(
    ctx: RunContext,
    number: int,
    chunk: list[InputState],
    start: ChunkStart | None = None,
    ahead: Callable[[], None] | None = None,
) -> None:
    """Stage-major: each stage runs in one child over all of the chunk's inputs that need it. ``start``: the
    chunk's first stages already run (:func:`run_head`); ``ahead``: called as the chunk's first GPU stage
    starts (the next chunk's head then runs beside it)."""
    start = start or run_head(ctx, number, chunk)
    try:
        if start.stopped:
            return
        for index in range(start.next_index, len(ctx.specs)):
            if ctx.stopping():
                return
            if ahead is not None and ctx.specs[index].gpu:
                ahead()
                ahead = None
            _stage_step(ctx, number, chunk, index, start)
        if ahead is not None:
            ahead()
    finally:
        cancel_warm(ctx, start)
        # the finished partners' decoded audio removed again (one that finishes now loses it in ``finish``)
        drop_partners(ctx, chunk, start.done)
    done = start.done
    # the survivors' voices placed among the output folder's corpus speakers
    labels = place_speakers(
        ctx.settings, ctx.corpus, [inp for inp in chunk if inp.alive and inp.id not in done]
    )
    # their outputs written and recorded
    finish_inputs(ctx, number, chunk, done, labels)
    # and the chunk's rows in the catalogue: its inputs' segments, appended (or replaced), nothing rewritten
    if ctx.catalogue is not None:
        ctx.catalogue.chunk_done(
            {
                inp.id: ctx.resume.outputs_fingerprint(inp) if inp.complete else None
                for inp in chunk
                if not inp.interrupted
            },
            labels,
        )


def cancel_warm(ctx: RunContext, start: ChunkStart) -> None:
    """The chunk's warm children not used, stopped."""
    for child in start.warm.values():
        ctx.runner.executor.cancel(child)
    start.warm.clear()


def _stage_step(ctx: RunContext, number: int, chunk: list[InputState], index: int, start: ChunkStart) -> None:
    """Stage ``index`` over the chunk's inputs that need it."""
    spec, warm = ctx.specs[index], start.warm
    # the inputs that run this stage; the others reuse its artifact, or a fast path went without it
    todo = select(ctx, chunk, index, start.needed)
    # join groups: the audio of every partner of an input whose ASR runs, as when it was planned
    extra = partners(ctx, chunk, index, start.needed, todo)
    if not todo and not extra:
        if index in warm:
            ctx.runner.executor.cancel(warm.pop(index))
        return
    # later stages' children start importing while this one computes
    warm |= warm_next(ctx, number, index, chunk, start.needed, warm)
    # one child over all of them
    outcomes, start.ready = run_stage(
        ctx, number, spec, index, todo + extra, warm.pop(index, None), chunk, start.ready
    )
    # each outcome into its input's run state and the journal (a partner's: only told)
    record(ctx, spec, todo, outcomes)
    for inp in extra:
        if not outcomes[inp.id].ok:
            log.warning(
                "%s: no audio as a join group partner (%s); its group goes on without it",
                inp.id,
                outcomes[inp.id].error,
            )


def plan_chunk(ctx: RunContext, chunk: list[InputState]) -> tuple[set[str], Needs]:
    """The inputs the journal saw completed (reused from it alone), and the stages each input needs."""
    needed = {inp.id: stages_needed(ctx.resume, inp, ctx.specs, ctx.settings.force) for inp in chunk}
    # nothing of a chunk is finished before its stages run: a complete input is one the journal completed
    done = {inp.id for inp in chunk if inp.complete}
    return done, needed


def fetch_sources(ctx: RunContext, chunk: list[InputState], needed: Needs) -> bool:
    """Fetch the URL inputs whose first stage runs (one that cannot be fetched fails alone). False: a stop
    was asked for meanwhile."""
    limits = FetchLimits.from_settings(ctx.settings)
    first = ctx.specs[0].name
    for inp in chunk:
        if ctx.stopping():
            return False
        if inp.url and needed[inp.id][first]:
            try:
                fetch(inp.url, inp.source, limits, cancelled=ctx.stopping)
            except DiskFullError:
                raise  # the run stops (see Orchestrator._process); this input resumes next run
            except PipelineError as exc:
                if ctx.stopping():  # cut short by the stop, not the input's fault
                    return False
                inp.error, inp.failed_stage = str(exc), "fetch"
                log.error("%s: %s", inp.id, exc)
    return True


def select(ctx: RunContext, chunk: list[InputState], index: int, needed: Needs) -> list[InputState]:
    """The chunk's live inputs that run stage ``index``; the others are marked as reusing its artifact, and
    one whose input a fast path went without is skipped."""
    spec = ctx.specs[index]
    previous = ctx.specs[index - 1] if index else None
    alive = [inp for inp in chunk if inp.alive]
    todo = [
        inp
        for inp in alive
        if needed[inp.id][spec.name] and not _skipped_with_input(inp, spec, previous, ctx.specs)
    ]
    for inp in alive:
        if not needed[inp.id][spec.name]:
            inp.stages[spec.name] = REUSED
    return todo


def partners(
    ctx: RunContext, chunk: list[InputState], index: int, needed: Needs, todo: list[InputState]
) -> list[InputState]:
    """When stage ``index`` decodes the audio the joining ASR stage reads: the join group members of an
    input whose ASR runs that do not run this stage themselves, and those of them whose decoded audio is
    not current (a finished input's scratch is removed, unless ``keep_audio``). The ASR child decodes a
    group whole, the members not asked for as partners (``orchestrator.planning.groups``): without their
    audio a redone input would share its windows with fewer neighbours than when it was planned, and get
    other words. Only their audio is decoded (nothing recorded, no other artifact or output of theirs
    touched); a member whose audio never decoded (a bad input) runs the stage anyway, and is absent again
    as it was."""
    found: list[InputState] = []
    spec = ctx.specs[index]
    asr = next((i for i, s in enumerate(ctx.specs) if s.name == "asr"), None)
    if not ctx.settings.asr_join_inputs or ctx.settings.langid_only or asr is None or asr <= index:
        return found
    if spec.kind not in input_keys(ctx.specs[asr], ctx.specs[asr - 1]):
        return found
    asking = {inp.group for inp in chunk if inp.group is not None and inp.alive and needed[inp.id]["asr"]}
    running = {inp.id for inp in todo}
    for inp in chunk:
        if inp.group not in asking or inp.id in running or not inp.alive:
            continue
        _, state = artifact_state(
            inp.artifact_file(spec.kind), inp.id, inp.fingerprints[spec.name], spec.output, quiet=True
        )
        if state == "current":
            continue
        if inp.url and not inp.source.exists():  # a URL input's download went with its scratch
            try:
                fetch(inp.url, inp.source, FetchLimits.from_settings(ctx.settings), cancelled=ctx.stopping)
            except DiskFullError:
                raise
            except PipelineError as exc:
                log.warning("%s: not fetched as a join group partner: %s", inp.id, exc)
                continue
        found.append(inp)
    if found:
        log.info(
            "%s: %d join group partner(s) decoded again for the inputs redone beside them: %s",
            spec.name,
            len(found),
            ", ".join(inp.id for inp in found[:10]),
        )
    return found


def drop_partners(ctx: RunContext, chunk: list[InputState], done: set[str]) -> None:
    """The scratch of the inputs complete before this run (``done``) whose join group had inputs left to do
    removed again, as ``finish`` removed it (unless ``keep_audio``): :func:`partners` decoded it for them,
    this run or a run killed before it got here. An input that ``finish`` finishes now loses it there."""
    if not ctx.settings.asr_join_inputs:
        return
    unfinished = {inp.group for inp in chunk if inp.id not in done and inp.group is not None}
    for inp in chunk:
        if inp.id in done and inp.group in unfinished:
            remove_scratch(ctx.settings, inp)


def warm_next(
    ctx: RunContext,
    number: int,
    index: int,
    chunk: list[InputState],
    needed: Needs,
    warm: dict[int, object] | None = None,
) -> dict[int, object]:
    """The warm children to start as stage ``index`` starts (each imports, then waits for its request), by
    stage index: with ``prefetch="next"`` the next stage's, with ``"all"`` every later stage's (those not
    ``warm`` yet), each only when a live input needs that stage; none with ``"off"``."""
    mode = ctx.settings.prefetch
    if mode == "off":
        return {}
    later = range(index + 1, len(ctx.specs) if mode == "all" else min(index + 2, len(ctx.specs)))
    started = {}
    for i in later:
        spec = ctx.specs[i]
        if i in (warm or {}) or not any(needed[inp.id][spec.name] for inp in chunk if inp.alive):
            continue
        child = ctx.runner.warm_up(spec, number)
        if child is not None:
            started[i] = child
    return started


def run_stage(
    ctx: RunContext,
    number: int,
    spec: StageSpec,
    index: int,
    todo: list[InputState],
    warm,
    chunk: list[InputState] | None = None,
    ready: float | None = None,
) -> tuple[dict[str, ItemOutcome], float | None]:
    """Stage ``spec`` over ``todo`` in one child (``warm``, if one was started for it): each input's
    outcome by id, and when its last child ended (else ``ready``); the stage run is kept for the report,
    with the seconds it waited since ``ready`` (the moment the run could start it)."""
    previous = ctx.specs[index - 1] if index else None
    ctx.progress.stage_started(number, spec.name, len(todo))
    items = [work_item(spec, inp, previous) for inp in todo]
    if spec.vocabulary and ctx.terms is not None:  # vocabulary terms by reference, written once a run
        items = [
            item.model_copy(update={"vocabulary": ctx.terms.references(item.vocabulary)})
            if item.vocabulary
            else item
            for item in items
        ]
    if spec.name == "asr" and ctx.settings.asr_join_inputs:  # each input's join group, decoded whole
        items = with_groups(items, todo, chunk or todo, ctx.terms)
    outcomes, stage_run = ctx.runner.run(
        spec,
        items,
        reuse=not ctx.settings.force,
        chunk=number,
        on_item=lambda stage, result, n=number: ctx.progress.item_finished(stage, result, chunk=n),
        warm=warm,
    )
    if ready is not None:
        stage_run = stage_run.model_copy(update={"waited_s": waited(ready, stage_run.attempts)})
    ctx.stage_runs.append(stage_run)
    return outcomes, last_exit(stage_run.attempts) or ready


def record(
    ctx: RunContext, spec: StageSpec, todo: list[InputState], outcomes: dict[str, ItemOutcome]
) -> None:
    """Each input's outcome of ``spec`` into its run state (interrupted, skipped by the fast path, failed,
    or done with the model that ran) and into the journal."""
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
            status=status, seconds=o.seconds, batch_size=o.batch_size, retries=o.retries, error=o.error
        )
        inp.worked |= status == "ok"
        if o.interrupted:
            inp.interrupted = True
        elif o.skipped:
            _skip(inp, spec, ctx.specs, o.error)
        elif not o.ok:
            inp.error, inp.failed_stage = o.error, spec.name
        elif not o.reused:
            _stamp_model(inp, spec, ctx.specs)
        ctx.journal.record(inp.id, spec.name, status, fingerprint=inp.fingerprints[spec.name], error=o.error)


def finish_inputs(
    ctx: RunContext,
    number: int,
    chunk: list[InputState],
    done: set[str],
    labels: dict[str, dict[str, tuple[str, str]]],
) -> None:
    """The chunk's live inputs not complete by the journal finished (outputs written), each recorded in
    the journal with what a rerun needs to reuse it; the progress told of every input not interrupted."""
    for inp in chunk:
        if inp.alive and inp.id not in done:
            finish(ctx.settings, inp, labels.get(inp.id))
            ctx.journal.record(
                inp.id,
                "outputs",
                "ok" if inp.complete else "failed",
                fingerprint=ctx.resume.outputs_fingerprint(inp),
                error=inp.error,
                **(completion(inp, ctx.specs) if inp.complete else {}),
            )
        if not inp.interrupted:
            ctx.progress.input_finished(inp.complete, inp.duration_s or 0.0)
    ctx.progress.chunk_finished(number)


def _skip(inp: InputState, spec: StageSpec, specs: list[StageSpec], reason: str | None) -> None:
    """Fast path: ``inp`` goes on without ``spec``'s artifact; later fingerprints say so, so a rerun redoes them."""
    inp.skipped.add(spec.kind)
    inp.notes.append(f"no speakers from {spec.name}: {reason}")
    chain_fingerprints(inp, specs)


def _skipped_with_input(
    inp: InputState, spec: StageSpec, previous: StageSpec | None, specs: list[StageSpec]
) -> bool:
    """A stage that needs an artifact the fast path went without (enrollment without diarization) is skipped too."""
    missing = [k for k in input_keys(spec, previous) if k in inp.skipped and k not in spec.optional_inputs]
    if missing:
        inp.stages[spec.name] = ItemStage(status="skipped", error=f"no {missing[0]} artifact (fast path)")
        inp.skipped.add(spec.kind)
        chain_fingerprints(inp, specs)
    return bool(missing)


def _stamp_model(inp: InputState, spec: StageSpec, specs: list[StageSpec]) -> None:
    """A stage that ran another model than resolved (it fell back): its artifact's fingerprint and the
    ones after it are made from the model that ran, so a later run that can have the asked-for model
    redoes this stage and what depends on it, and one that cannot keeps them."""
    if spec.name in ("asr", "alignment"):
        _stamp_aligner(inp, spec, specs)
        return
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


def _stamp_aligner(inp: InputState, spec: StageSpec, specs: list[StageSpec]) -> None:
    """After ASR: the aligner the input's transcript will get is chosen by its language. After alignment: the
    transcript's fingerprint names the aligner that ran (and the ones after it follow), so a rerun that can
    have no other aligner keeps it."""
    try:
        artifact = load_artifact(inp.artifact(spec.kind), spec.output)
    except PipelineError:
        return
    language = getattr(artifact, "language", None)
    if spec.name == "asr":
        plan_aligner(inp, specs, language)
        return
    if plan_aligner(inp, specs, language, aligner_ran(artifact.aligner)):
        if artifact.fingerprint != inp.fingerprints[spec.name]:
            save_model(
                artifact.model_copy(update={"fingerprint": inp.fingerprints[spec.name]}),
                inp.artifact(spec.kind),
            )


class Ahead:
    """The next chunk's first stages (those that use no GPU: fetching, decoding, the audio copy) run in a
    thread while this chunk runs its GPU stages (``PIPELINE_OVERLAP_CHUNKS``). One chunk ahead at most: the
    decoded audio waiting on disk is one chunk's. Each stage records its outcomes in the journal as it ends,
    so a stop or a crash meanwhile leaves what a rerun reuses, as between any two stages."""

    def __init__(self, ctx: RunContext, chunks: list[list[InputState]], upto: int) -> None:
        self.ctx, self.chunks, self.upto = ctx, chunks, upto
        self._number: int | None = None
        self._thread: threading.Thread | None = None
        self._start: ChunkStart | None = None
        self._error: BaseException | None = None

    def start(self, number: int) -> None:
        """Chunk ``number`` (from 1)'s head, in a thread (none past the last chunk, or once stopping)."""
        if number > len(self.chunks) or self.ctx.stopping():
            return

        def work() -> None:
            try:
                self._start = run_head(self.ctx, number, self.chunks[number - 1], self.upto)
            except BaseException as exc:  # noqa: BLE001 - raised in the run's thread by take()
                self._error = exc

        self._number, self._start, self._error = number, None, None
        self._thread = threading.Thread(target=work, name=f"chunk-{number}-ahead", daemon=True)
        self._thread.start()

    def take(self, number: int) -> ChunkStart | None:
        """Chunk ``number``'s start, once its head has run (None: it was not run ahead)."""
        if self._number != number or self._thread is None:
            return None
        self._join()
        self._number = None
        if self._error is not None:
            raise self._error
        start, self._start = self._start, None
        return start

    def close(self, kill: bool = False) -> None:
        """Wait for a head still running (``kill``: its children stopped first: the run is ending on an
        error); its warm children not used are stopped."""
        if self._thread is not None and self._thread.is_alive():
            if kill:
                self.ctx.runner.executor.stop_all(grace_s=1.0)
            self._join()
        if self._start is not None:
            cancel_warm(self.ctx, self._start)
        if self._error is not None and self._number is not None:
            log.error("the next chunk's first stages failed: %s", self._error)

    def _join(self) -> None:
        while self._thread is not None and self._thread.is_alive():  # short waits: Ctrl-C reaches the caller
            self._thread.join(0.5)
