"""One input's run state: what a run learns and does about a planned input (fingerprints, each stage's
outcome, the outputs, what the report says). The plan (:class:`~orchestrator.planning.inputs.Input`) stays as it
was planned; the chunk loop reads and writes this."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from contracts.artifacts import LanguageId
from contracts.report import ItemStage
from orchestrator.planning.inputs import Input


@dataclass(slots=True)
class InputState:
    #: the input as planned (id, source, folder)
    plan: Input
    #: expected fingerprint of each stage's artifact, chained from the source's identity
    fingerprints: dict[str, str] = field(default_factory=dict)
    error: str | None = None
    failed_stage: str | None = None
    interrupted: bool = False
    complete: bool = False
    #: True when a stage child did real work for this input in this run
    worked: bool = False
    stages: dict[str, ItemStage] = field(default_factory=dict)
    outputs: dict[str, str] = field(default_factory=dict)
    duration_s: float | None = None
    #: artifacts (by key) the fast path went on without, and what the report says about it
    skipped: set[str] = field(default_factory=set)
    #: the plan's notes (a source given twice), then the run's
    notes: list[str] = field(default_factory=list)
    #: models asked for but not used (see ``orchestrator.run.report.model_substitutions``)
    substitutions: list[str] = field(default_factory=list)
    #: the source was damaged part-way: how much decoded (the input is complete but ``partial``)
    damage: str | None = None
    #: the local source as its fingerprint saw it, (size, mtime_ns) (a tuple: 100,000 of them are held): the
    #: audio stage refuses it if it changed since
    planned: tuple[int, int] | None = None
    #: language identification (the transcript's)
    language: LanguageId | None = None
    #: seconds of two or more voices at once (the diarization's; None: no diarization)
    overlap_s: float | None = None
    #: stage -> the model that ran, where it was not the one the run resolved (a fallback), or that runs for
    #: this input (the alignment's aligner, chosen by the transcript's language)
    models: dict[str, str] = field(default_factory=dict)
    #: the transcript's language the aligner was chosen for (kept in the journal for the fast resume)
    text_language: str | None = None
    #: the join group whose inputs may share a Whisper window with it (``orchestrator.planning.groups``)
    group: str | None = None
    #: the outputs fingerprint with the settings and stage fingerprints it was made from
    #: (``Resume.outputs_fingerprint``: asked three times an input by a resumed run of 100,000)
    outputs_memo: tuple[tuple, str] | None = None

    def __post_init__(self) -> None:
        self.notes = [*self.plan.notes, *self.notes]
        if self.plan.error and self.error is None:  # failed in planning: no stage runs for it
            self.error, self.failed_stage = self.plan.error, "vocabulary"

    @property
    def alive(self) -> bool:
        return self.error is None and not self.interrupted

    @property
    def status(self) -> str:
        if self.interrupted:
            return "interrupted"
        if not self.complete:
            return "failed"
        return "partial" if self.damage else "ok"

    # -- the plan's, for a loop that reads well ----------------------------------------------------------

    @property
    def id(self) -> str:
        return self.plan.id

    @property
    def source(self) -> Path:
        return self.plan.source

    @property
    def directory(self) -> Path:
        return self.plan.directory

    @property
    def url(self) -> str | None:
        return self.plan.url

    @property
    def shown_source(self) -> str | None:
        return self.plan.shown_source

    @property
    def shown(self) -> str:
        return self.plan.shown

    def artifact(self, kind: str) -> Path:
        return self.plan.artifact(kind)

    def artifact_file(self, kind: str) -> str:
        return self.plan.artifact_file(kind)
