"""Progress of a run: a rich display on a terminal, plain log lines otherwise, and the summary table.

The orchestrator calls a :class:`Progress`; item events arrive from a thread
that follows the stage child's progress file, as each item finishes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter

from contracts import ItemResult
from contracts.report import RunPlan, RunReport

log = logging.getLogger(__name__)


class Progress:
    """Counts what happened; subclasses show it. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.total = self.done = self.failed = 0
        self.chunk = self.chunks = 0
        self.stage = ""
        self.stage_total = self.stage_done = 0
        #: chunk -> [stage, items done, items] of every chunk in flight (several under Ray)
        self.active: dict[int, list] = {}
        self.audio_s = 0.0
        self.started = time.monotonic()

    # -- events ------------------------------------------------------------
    def start(self, total: int, resumed: int, chunks: int) -> None:
        with self._lock:
            self.total, self.chunks = total, chunks
            self.started = time.monotonic()
        self.show_start(resumed)

    def stage_started(self, chunk: int, stage: str, items: int) -> None:
        with self._lock:
            self.chunk, self.stage, self.stage_total, self.stage_done = chunk, stage, items, 0
            self.active[chunk] = [stage, 0, items]
        self.show()

    def item_finished(self, stage: str, result: ItemResult, chunk: int | None = None) -> None:
        with self._lock:
            current = self.active.get(chunk if chunk is not None else self.chunk)
            if current is not None and current[0] == stage:
                current[1] += 1
            if chunk is None or chunk == self.chunk:
                self.stage_done += 1
        self.show()

    def chunk_finished(self, chunk: int) -> None:
        with self._lock:
            self.active.pop(chunk, None)

    def input_finished(self, ok: bool, audio_s: float) -> None:
        with self._lock:
            if ok:
                self.done += 1
                self.audio_s += audio_s
            else:
                self.failed += 1
        self.show()

    def finish(self, report: RunReport) -> None:
        self.show_finish(report)

    # -- derived -----------------------------------------------------------
    def throughput(self) -> float:
        """Hours of audio per hour of wall time so far."""
        elapsed = time.monotonic() - self.started
        return self.audio_s / elapsed if elapsed > 0 else 0.0

    def stages(self) -> str:
        """``chunk 2/4 asr 3/25`` for each chunk in flight."""
        active = sorted(self.active.items()) or [
            (self.chunk, [self.stage, self.stage_done, self.stage_total])
        ]
        return ", ".join(
            f"chunk {c}/{self.chunks} {stage} {done}/{items}" for c, (stage, done, items) in active
        )

    def line(self) -> str:
        return (
            f"Progress: {self.done + self.failed}/{self.total} inputs ({self.failed} failed) | "
            f"{self.stages()} | {self.audio_s / 3600:.2f} h audio, {self.throughput():.1f} h/h"
        )

    # -- display hooks -------------------------------------------------------
    def show_start(self, resumed: int) -> None:
        pass

    def show(self) -> None:
        pass

    def show_finish(self, report: RunReport) -> None:
        pass


class LogProgress(Progress):
    """Plain log lines, for logs and pipes (seed 001 style): one when a stage starts on a chunk, one when an
    input of a multi-input run finishes, and otherwise at most one every ``every_s`` seconds."""

    def __init__(self, every_s: float = 30.0) -> None:
        super().__init__()
        self.every_s = every_s
        self._shown_at = 0.0
        self._shown_stages = ""
        self._shown_done = 0

    def show_start(self, resumed: int) -> None:
        if resumed:
            log.info(
                "resuming: %d of %d input(s) were already complete in this output directory",
                resumed,
                self.total,
            )
        log.info("%d input(s) in %d chunk(s)", self.total, self.chunks)

    def show(self) -> None:
        with self._lock:
            stages = " ".join(f"{c}:{s[0]}" for c, s in sorted(self.active.items()))
            done = self.done + self.failed
            due = (
                stages != self._shown_stages
                or (done != self._shown_done and self.total > 1)
                or time.monotonic() - self._shown_at >= self.every_s
            )
            if not due:
                return
            self._shown_at, self._shown_stages, self._shown_done = time.monotonic(), stages, done
            line = self.line()
        log.info("%s", line)


class RichProgress(Progress):
    """A live rich display for terminals."""

    def __init__(self, console=None) -> None:
        super().__init__()
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
        from rich.progress import Progress as Bar

        self.console = console or Console(stderr=True)
        self.bar = Bar(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            console=self.console,
            transient=False,
        )
        self.inputs_bar = self.bar.add_task("inputs", total=None, info="")
        self.current = self.bar.add_task("stage", total=None, info="")

    def show_start(self, resumed: int) -> None:
        self.bar.start()
        self.bar.update(self.inputs_bar, total=self.total, completed=0)
        if resumed:
            self.console.log(f"resuming: {resumed} of {self.total} input(s) already complete")

    def show(self) -> None:
        with self._lock:
            self.bar.update(
                self.inputs_bar,
                completed=self.done + self.failed,
                info=f"{self.failed} failed | {self.audio_s / 3600:.2f} h audio | {self.throughput():.1f} h/h",
            )
            if len(self.active) > 1:  # chunks in parallel: one line naming each
                self.bar.update(self.current, description=self.stages(), total=None, completed=0, info="")
            else:
                self.bar.update(
                    self.current,
                    description=f"{self.stage} (chunk {self.chunk}/{self.chunks})",
                    total=self.stage_total,
                    completed=self.stage_done,
                    info="",
                )

    def show_finish(self, report: RunReport) -> None:
        self.bar.stop()


#: the summary table's rows at most: the inputs that did not end ok first, then the others in order
SUMMARY_ROWS = 50


def summary_table(report: RunReport, plain: bool = False, rows: int = SUMMARY_ROWS):
    """A rich Table of the run's inputs: status, stages, audio length, error (``plain``: few lines, for pipes).
    At most ``rows`` of them, those that did not end ok first; a last row counts the others (every input is
    in the run report)."""
    from rich import box
    from rich.table import Table

    title = (
        None
        if plain
        else f"run {report.run_id}: {report.ok} ok, {report.failed} failed, {report.interrupted} interrupted"
    )
    table = Table(
        title=title,
        title_justify="left",
        box=box.SIMPLE_HEAD if plain else box.HEAVY_HEAD,
        show_edge=not plain,
    )
    for column in ("input", "status", "audio", "asr", "embeddings", "error"):
        table.add_column(column, overflow="fold")
    shown = [i for i in report.inputs if i.status != "ok"][:rows]
    shown += [i for i in report.inputs if i.status == "ok"][: rows - len(shown)]
    order = {id(item): n for n, item in enumerate(report.inputs)}
    shown.sort(key=lambda item: order[id(item)])
    for item in shown:
        stages = {
            name: f"{s.status} {s.seconds:.1f}s" + (f" x{s.retries + 1}" if s.retries else "")
            for name, s in item.stages.items()
        }
        audio = f"{item.duration_s:.1f}s" if item.duration_s else "-"
        style = {"ok": "green", "partial": "yellow", "failed": "red", "interrupted": "yellow"}[item.status]
        table.add_row(
            item.id,
            f"[{style}]{item.status}[/]",
            audio,
            stages.get("asr", "-"),
            stages.get("embeddings", "-"),
            item.error or "",
        )
    if len(report.inputs) > len(shown):
        hidden = Counter(i.status for i in report.inputs) - Counter(i.status for i in shown)
        what = ", ".join(f"{count:,} {status}" for status, count in sorted(hidden.items()))
        table.add_row(
            f"... {len(report.inputs) - len(shown):,} more ({what}): see the run report", "", "", "", "", ""
        )
    table.caption = (
        f"{report.audio_s / 3600:.2f} h audio in {report.wall_s:.0f} s"
        + (f", {report.throughput:.1f} h audio per hour" if report.throughput else "")
        + (
            f"\nexposed {report.exposed_s:.1f} s of {report.wall_s:.1f} s (start-up and waits)"
            if report.exposed_s is not None and report.computing_s
            else ""
        )
    )
    return table


def plan_lines(plan: RunPlan) -> list[str]:
    """``--dry-run``'s answer as plain lines: the inputs, then per stage what is reused and redone, and why."""
    dup = f" ({plan.duplicates} given more than once)" if plan.duplicates else ""
    lines = [
        f"{plan.inputs:,} input(s){dup}: {plan.complete:,} complete, {plan.inputs - plan.complete:,} with work "
        f"to do; planned in {plan.seconds:.1f} s; output {plan.output_dir}"
    ]
    lines += [f"skipped {name}: the pipeline's output, not an input" for name in plan.skipped]
    for stage in plan.stages:
        model = f" [{stage.model}]" if stage.model else ""
        lines.append(f"{stage.stage}{model}: {stage.reuse:,} to reuse, {stage.redo:,} to redo")
        for reason, count in sorted(stage.reasons.items(), key=lambda kv: -kv[1]):
            lines.append(f"  {stage.stage}: {count:,} to redo: {reason}")
    return lines
