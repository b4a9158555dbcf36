"""The Python API: plan inputs, run each stage in isolated children, write outputs and the report.

    from orchestrator import Orchestrator, Settings

    with Orchestrator(Settings(output_dir="out")) as orch:
        report = orch.process(["talk.mp4", "interview.wav"])
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import unicodedata
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from contracts import (
    AudioArtifact,
    EmbeddingsArtifact,
    TranscriptArtifact,
    WorkItem,
    load_artifact,
    load_model,
    save_model,
)
from contracts.errors import PipelineError
from contracts.report import InputReport, ItemStage, RunReport, StageRun
from orchestrator.executor import LocalExecutor
from orchestrator.outputs import write_outputs
from orchestrator.perf_log import child_env as perf_log_env
from orchestrator.runner import StageRunner, StageSpec, fingerprint
from orchestrator.settings import Settings
from orchestrator.vram import resolve_auto
from orchestrator.watch import ChildWatch

log = logging.getLogger(__name__)

MEDIA_SUFFIXES = frozenset(
    ".mp4 .mkv .mov .avi .webm .m4v .flv .ts .mpg .mpeg .wmv .wav .mp3 .m4a .aac .flac .ogg .opus .wma .aiff".split()
)
REPORT_NAME = "run-report.json"


@dataclass
class Input:
    id: str
    source: Path
    directory: Path
    error: str | None = None
    failed_stage: str | None = None
    stages: dict[str, ItemStage] = field(default_factory=dict)
    outputs: dict[str, str] = field(default_factory=dict)
    duration_s: float | None = None

    @property
    def alive(self) -> bool:
        return self.error is None

    def artifact(self, kind: str) -> Path:
        """Where this input's artifact of ``kind`` lives (decoded audio is scratch)."""
        if kind == "audio":
            return self.directory / ".work" / "audio.json"
        return self.directory / f"{kind}.json"


def expand_inputs(paths: list[str | Path]) -> list[Path]:
    """Files stay as given (missing ones too: they fail alone later); directories give their media files."""
    out: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in MEDIA_SUFFIXES)
            if not found:
                log.warning("no media files in directory %s", path)
            out.extend(found)
        else:
            out.append(path)
    return out


def item_ids(paths: list[Path]) -> list[str]:
    """Readable, unique, filesystem-safe ids: the file stem, plus a path hash when stems collide."""
    stems = [_safe_stem(p) for p in paths]
    counts: dict[str, int] = {}
    for stem in stems:
        counts[stem] = counts.get(stem, 0) + 1
    ids = []
    for path, stem in zip(paths, stems):
        if counts[stem] > 1:
            digest = hashlib.sha1(str(path.absolute()).encode()).hexdigest()[:8]
            stem = f"{stem}-{digest}"
        ids.append(stem)
    return ids


def _safe_stem(path: Path) -> str:
    stem = unicodedata.normalize("NFC", path.stem).strip() or "input"
    stem = "".join("_" if ch in '/\\\0' or ord(ch) < 32 else ch for ch in stem)
    return stem.lstrip(".") or "input"


def _source_identity(path: Path) -> str:
    try:
        st = path.stat()
    except OSError:
        return f"unreadable:{path.absolute()}"
    return f"{path.absolute()}:{st.st_size}:{st.st_mtime_ns}"


class Orchestrator:
    """Runs the pipeline; leaving the ``with`` block stops every child it started."""

    def __init__(self, settings: Settings | None = None, executor: LocalExecutor | None = None) -> None:
        self.settings = settings or Settings()
        self.executor = executor or LocalExecutor(ChildWatch.from_settings(self.settings))

    def __enter__(self) -> Orchestrator:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        self.executor.stop_all()

    def stage_specs(self) -> list[StageSpec]:
        s = resolve_auto(self.settings)  # asr_model / batch sizes "auto" -> values for the GPU at hand
        return [
            StageSpec("audio", "stages.audio", AudioArtifact, batch_size=1),
            StageSpec("asr", "stages.asr", TranscriptArtifact, batch_size=s.asr_batch_size, settings={
                "model": s.asr_model, "language": s.asr_language, "compute_type": s.asr_compute_type,
                "allow_hub": s.allow_hub,
            }),
            StageSpec("embeddings", "stages.embeddings", EmbeddingsArtifact, batch_size=s.embedding_batch_size, settings={
                "profile": s.embedding_profile, "fallback": s.embedding_fallback, "allow_hub": s.allow_hub,
            }),
        ]

    def process(self, paths: list[str | Path]) -> RunReport:
        """Process every input; a bad input fails alone. Writes and returns the run report."""
        started = datetime.now(timezone.utc)
        out = Path(self.settings.output_dir)
        run_id = f"{started:%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:6]}"
        run_dir = out / ".runs" / run_id
        run_dir.mkdir(parents=True, exist_ok=True)
        sources = expand_inputs(paths)
        inputs = [Input(id=i, source=p, directory=out / i) for i, p in zip(item_ids(sources), sources)]
        log.info("run %s: %d input(s) -> %s", run_id, len(inputs), out)

        runner = StageRunner(self.executor, run_dir, self.settings.child_env() | perf_log_env(out, run_id),
                             self.settings.device,
                             self.settings.max_signal_retries)
        stage_runs: list[StageRun] = []
        previous: StageSpec | None = None
        for spec in self.stage_specs():
            alive = [inp for inp in inputs if inp.alive]
            if not alive:
                break
            items = [self._work_item(spec, inp, previous) for inp in alive]
            outcomes, stage_run = runner.run(spec, items)
            stage_runs.append(stage_run)
            for inp in alive:
                o = outcomes[inp.id]
                status = "reused" if o.reused else ("ok" if o.ok else "failed")
                inp.stages[spec.name] = ItemStage(status=status, seconds=o.seconds, batch_size=o.batch_size,
                                                  retries=o.retries, error=o.error)
                if not o.ok:
                    inp.error, inp.failed_stage = o.error, spec.name
            previous = spec

        for inp in inputs:
            if inp.alive:
                self._finish(inp)
        report = self._report(run_id, started, out, inputs, stage_runs)
        save_model(report, out / REPORT_NAME)
        save_model(report, run_dir / REPORT_NAME)
        log.info("run %s: %d ok, %d failed; report %s", run_id, report.ok, report.failed, out / REPORT_NAME)
        return report

    def _work_item(self, spec: StageSpec, inp: Input, previous: StageSpec | None) -> WorkItem:
        if previous is None:
            inputs = {"source": str(inp.source)}
            upstream = _source_identity(inp.source)
        else:
            upstream_path = inp.artifact(previous.kind)
            inputs = {previous.kind: str(upstream_path)}
            # chain fingerprints, not file hashes: redoing a cheap upstream stage
            # from the same source and settings keeps downstream artifacts current
            upstream = load_model(upstream_path, previous.output).fingerprint
        return WorkItem(id=inp.id, inputs=inputs, output=str(inp.artifact(spec.kind)),
                        fingerprint=fingerprint(spec, upstream))

    def _finish(self, inp: Input) -> None:
        import numpy as np  # numpy only: no model library in the parent

        try:
            audio = load_artifact(inp.artifact("audio"), AudioArtifact)
            transcript = load_artifact(inp.artifact("transcript"), TranscriptArtifact)
            embeddings = load_artifact(inp.artifact("embeddings"), EmbeddingsArtifact)
            vectors = np.load(inp.directory / embeddings.sidecar, allow_pickle=False)
            inp.outputs = write_outputs(inp.directory, transcript, embeddings, vectors)
            inp.duration_s = audio.duration_s
        except (PipelineError, OSError, ValueError) as exc:
            inp.error, inp.failed_stage = f"writing outputs failed: {exc}", "outputs"
            return
        if not self.settings.keep_audio:
            shutil.rmtree(inp.directory / ".work", ignore_errors=True)

    def _report(self, run_id: str, started: datetime, out: Path, inputs: list[Input],
                stage_runs: list[StageRun]) -> RunReport:
        reports = [
            InputReport(
                id=inp.id, source=str(inp.source), status="ok" if inp.alive else "failed", error=inp.error,
                failed_stage=inp.failed_stage, duration_s=inp.duration_s, outputs=inp.outputs, stages=inp.stages,
            )
            for inp in inputs
        ]
        return RunReport(
            run_id=run_id, started_at=started, finished_at=datetime.now(timezone.utc), output_dir=str(out),
            settings=self.settings.model_dump(mode="json"), ok=sum(r.status == "ok" for r in reports),
            failed=sum(r.status == "failed" for r in reports), inputs=reports, stages=stage_runs,
        )


__all__ = ["Orchestrator", "expand_inputs", "item_ids"]
