"""Run one stage over many items: spawn, wait, validate, and apply the retry policy."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from contracts import Artifact, ItemResult, StageRequest, WorkItem
from contracts.errors import DiskFullError
from contracts.jsonl import read_lines
from contracts.report import Attempt, StageRun
from contracts.stage_settings import MemorySettings
from orchestrator.planning.fingerprints import artifact_state
from orchestrator.process.executor import Executor, WarmChild
from orchestrator.process.outcome import Outcome
from orchestrator.registry import StageSpec
from orchestrator.run.outcome import blame, isolated, next_step

log = logging.getLogger(__name__)


@dataclass
class ItemOutcome:
    ok: bool
    reused: bool = False
    #: not done because the run was stopped (Ctrl-C); a rerun resumes it
    interrupted: bool = False
    #: not done, and the input goes on without it (fast path); ``error`` says why
    skipped: bool = False
    error: str | None = None
    seconds: float = 0.0
    batch_size: int | None = None
    retries: int = 0


def current_artifact(item: WorkItem, output: type[Artifact]) -> Artifact | None:
    """The item's artifact if it is on disk, valid, and made from the same inputs and settings."""
    artifact, state = artifact_state(item.output, item.id, item.fingerprint, output)
    return artifact if state == "current" else None


class StageRunner:
    """Runs a stage's items in as many children as the retry policy allows."""

    def __init__(
        self,
        executor: Executor,
        run_dir: Path,
        env: dict[str, str],
        device: str,
        max_signal_retries: int,
        stop_path: Path | None = None,
        memory: MemorySettings | None = None,
        max_item_crashes: int = 2,
        refused_wait_s: float = 0.0,
    ) -> None:
        self.executor = executor
        #: memory checkpoint options for every child (None: the contract's defaults)
        self.memory = memory or MemorySettings()
        self.stop_path = stop_path
        self.run_dir = run_dir
        self.env = env
        self.device = device
        self.max_signal_retries = max_signal_retries
        #: deaths of a child an input may be in flight at before it fails alone (culprit isolation)
        self.max_item_crashes = max_item_crashes
        #: how long a stage whose start is refused (a temporary condition) keeps trying, in all
        self.refused_wait_s = refused_wait_s

    @staticmethod
    def _name(spec: StageSpec, chunk: int, attempt: int) -> str:
        return f"chunk{chunk:03d}-{spec.name}-{attempt}"

    def warm_up(self, spec: StageSpec, chunk: int) -> WarmChild | None:
        """Start the first child of ``spec`` for ``chunk`` now, to import while the previous stage runs."""
        name = self._name(spec, chunk, 1)
        return self.executor.warm_up(
            spec.name,
            spec.module,
            self.run_dir / f"{name}.request.json",
            self.run_dir / f"{name}.log",
            env=self.env,
        )

    def run(
        self,
        spec: StageSpec,
        items: list[WorkItem],
        *,
        reuse: bool = True,
        chunk: int = 1,
        on_item: Callable[[str, ItemResult], None] | None = None,
        warm: WarmChild | None = None,
    ) -> tuple[dict[str, ItemOutcome], StageRun]:
        """Run ``items`` through ``spec`` until each is done or failed.

        ``reuse=False`` (``--force``) redoes items even when their artifact is current;
        ``on_item(stage, item_result)`` hears of each item a child finishes, as it finishes;
        ``warm``, from :meth:`warm_up`, becomes the first child (it is stopped if there is nothing to do).
        """
        outcomes: dict[str, ItemOutcome] = {}
        todo: list[WorkItem] = []
        for item in items:
            if reuse and current_artifact(item, spec.output) is not None:
                outcomes[item.id] = ItemOutcome(ok=True, reused=True)
            else:
                todo.append(item)
        report = StageRun(stage=spec.name, chunk=chunk, reused=len(outcomes))
        attempts: list[Attempt] = []
        batch_size = spec.batch_size
        signal_retries = 0
        error_retries = 0
        refusals = 0
        waited_s = 0.0
        retries = 0
        #: item -> deaths of a child while it was in flight; the largest batch size that finished an item
        crashes: dict[str, int] = {}
        causes: dict[str, list[str]] = {}  # how each of those deaths came, for the reason
        worked: int | None = None
        while todo:
            attempt = len(attempts) + 1
            name = self._name(spec, chunk, attempt)
            request = StageRequest(
                request_id=name,
                stage=spec.name,
                module=spec.module,
                items=todo,
                batch_size=batch_size,
                device=self.device,
                settings=spec.settings.model_dump(mode="json"),
                memory=self.memory,
                env=self.env,
                result_path=str(self.run_dir / f"{name}.result.json"),
                progress_path=str(self.run_dir / f"{name}.items.jsonl"),
                stop_path=str(self.stop_path) if self.stop_path else None,
                inflight_path=str(self.run_dir / f"{name}.inflight.json"),
                attempt=attempt,
                isolate=isolated(crashes, self.max_item_crashes, [item.id for item in todo]),
            )
            log.info(
                "%s: starting child %d for %d item(s), batch size %d",
                spec.name,
                attempt,
                len(todo),
                batch_size,
            )
            follow = None
            if on_item is not None:
                follow = (
                    Path(request.progress_path),
                    lambda line, stage=spec.name: on_item(stage, _item_line(line)),
                )
            done, result = self.executor.run(
                request,
                self.run_dir / f"{name}.request.json",
                self.run_dir / f"{name}.log",
                progress=follow,
                warm=warm if attempt == 1 else None,
                gpu=spec.gpu,
            )
            warm = None
            attempts.append(done.record)

            # what the child reported, from its result or, if it died first, from its progress lines
            reported = {r.id: r for r in (result.items if result else _progress_items(request))}
            left: list[WorkItem] = []
            finished_before = len(outcomes)
            for item in todo:
                item_result = reported.get(item.id)
                if item_result is not None and not item_result.ok:
                    outcomes[item.id] = ItemOutcome(
                        ok=False,
                        error=item_result.error,
                        seconds=item_result.seconds,
                        batch_size=batch_size,
                        retries=retries,
                    )
                elif current_artifact(item, spec.output) is not None:
                    seconds = item_result.seconds if item_result else 0.0
                    outcomes[item.id] = ItemOutcome(
                        ok=True, seconds=seconds, batch_size=batch_size, retries=retries
                    )
                    worked = max(worked or 0, batch_size)
                else:
                    left.append(item)
            todo = left
            progressed = len(outcomes) > finished_before
            if not todo:
                break
            if done.outcome is Outcome.DISK_FULL:  # the run stops; what is done stays done, a rerun resumes
                raise DiskFullError(done.last_error or f"{spec.name}: a disk the child writes to is full")
            if done.outcome is Outcome.INTERRUPTED:
                log.warning("%s: stopped; %d item(s) left for the next run", spec.name, len(todo))
                for item in todo:
                    outcomes[item.id] = ItemOutcome(
                        ok=False,
                        interrupted=True,
                        error="interrupted",
                        batch_size=batch_size,
                        retries=retries,
                    )
                break
            suspects = [i for i in (done.in_flight or []) if i in {item.id for item in todo}]
            blamed = blame(
                done.outcome,
                suspects,
                crashes,
                self.max_item_crashes,
                batch_size,
                worked,
                signal=done.signal,
                stage=spec.name,
                hung=done.hung,
                skippable=spec.skippable,
                error=_short(done.last_error),
                causes=causes,
            )
            if blamed is not None:
                for item in todo:
                    if item.id in blamed.culprits:
                        log.error(
                            "%s: %s %s: %s",
                            spec.name,
                            item.id,
                            "goes on without it" if blamed.skip else "failed alone",
                            blamed.reason,
                        )
                        outcomes[item.id] = ItemOutcome(
                            ok=False,
                            skipped=blamed.skip,
                            error=blamed.reason,
                            batch_size=batch_size,
                            retries=retries,
                        )
                todo = [item for item in todo if item.id not in blamed.culprits]
                if todo:
                    log.warning(
                        "%s: %s (%s); %d other item(s) go on at batch size %d",
                        spec.name,
                        blamed.reason,
                        ", ".join(suspects),
                        len(todo),
                        blamed.batch_size,
                    )
                batch_size = blamed.batch_size
                retries += 1
                continue
            decision = next_step(
                done.outcome,
                batch_size,
                signal_retries,
                self.max_signal_retries,
                signal=done.signal,
                stage=spec.name,
                skippable=spec.skippable,
                refusals=refusals,
                waited_s=waited_s,
                max_wait_s=self.refused_wait_s,
                progressed=progressed,
                error_retries=error_retries,
            )
            if decision.retry:
                log.warning("%s%s", decision.reason, f": {done.last_error}" if done.last_error else "")
                if done.outcome is Outcome.KILLED:
                    signal_retries += 1
                elif done.outcome is Outcome.ERROR:
                    error_retries += 1
                elif done.outcome is Outcome.REFUSED:  # the time a refusal took counts too (Ray: placement)
                    refusals += 1
                    waited_s += done.wall_s + self._pause(decision.wait_s)
                batch_size = decision.batch_size
                retries += 1
                continue
            reason = decision.reason
            if done.last_error and done.outcome is not Outcome.OOM:
                reason = f"{reason}: {done.last_error}"
            if decision.skip:
                log.warning("%s: %d item(s) go on without it: %s", spec.name, len(todo), reason)
            else:
                log.error("%s: %d item(s) failed: %s", spec.name, len(todo), reason)
            for item in todo:
                outcomes[item.id] = ItemOutcome(
                    ok=False, skipped=decision.skip, error=reason, batch_size=batch_size, retries=retries
                )
            todo = []
        if warm is not None:  # every item was reused: the warm child has no request coming
            self.executor.cancel(warm)
        ok = sum(o.ok and not o.reused for o in outcomes.values())
        failed = sum(not o.ok and not o.interrupted and not o.skipped for o in outcomes.values())
        report = report.model_copy(
            update={
                "attempts": attempts,
                "ok": ok,
                "failed": failed,
                "wall_s": sum(a.wall_s for a in attempts),
            }
        )
        return outcomes, report

    def _pause(self, seconds: float) -> float:
        """Wait ``seconds`` (a refused start's backoff), or less if the run is asked to stop; the seconds waited."""
        started = time.monotonic()
        while time.monotonic() - started < seconds:
            if self.stop_path is not None and self.stop_path.exists():
                break
            time.sleep(min(0.5, seconds - (time.monotonic() - started)) if seconds > 0 else 0)
        return time.monotonic() - started


def _short(error: str | None, limit: int = 200) -> str | None:
    """A child's last error line, cut for a one-line reason."""
    if not error:
        return None
    error = " ".join(error.split())
    return error if len(error) <= limit else error[: limit - 3] + "..."


def _item_line(line: str) -> ItemResult:
    return ItemResult.model_validate_json(line)


def _progress_items(request: StageRequest) -> list[ItemResult]:
    """Items a dead child reported before dying (its last line may be cut short)."""
    return read_lines(request.progress_path, ItemResult) if request.progress_path else []
