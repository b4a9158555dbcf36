"""A real run (real models, real children) writes performance_logs/<run>.jsonl that `pipeline report` reads."""

from __future__ import annotations

import pytest

from contracts.perf import read_events
from orchestrator import Orchestrator, Settings
from orchestrator.process.pidfiles import ChildRegistry
from orchestrator.telemetry.perf_log import child_env, perf_log_path
from orchestrator.telemetry.perf_report import build
from tests.conftest import MEDIA


def test_perf_log_path_reaches_children_as_an_absolute_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    env = child_env("out", "run1")
    assert env == {"PIPELINE_PERF_LOG": str(tmp_path / "out" / "performance_logs" / "run1.jsonl")}


@pytest.mark.slow
def test_real_run_logs_checkpoints_of_every_stage_and_reports_them(tmp_path):
    settings = Settings(output_dir=tmp_path / "out", embedding_profile="embedded", pid_dir=tmp_path / "pids")
    with Orchestrator(settings) as orch:
        report = orch.process([MEDIA / "speech.wav"])
    assert report.ok == 1, report.inputs[0].error
    events = read_events(perf_log_path(settings.output_dir, report.run_id))
    for stage in ("audio", "asr", "diarization", "alignment", "embeddings"):
        mine = [e for e in events if e.stage == stage]
        assert [e.point for e in mine if e.event == "checkpoint"] == [
            "before model load",
            "model loaded",
            "before exit",
        ]
        assert all(e.kind == "cpu" and e.rss_mb > 0 for e in mine if e.event == "checkpoint")  # no GPU here
        assert [e.event for e in mine][0] == "stage_start" and mine[-1].event == "stage_end"
        end = mine[-1].record
        assert end.outcome == "ok" and end.ok == 1 and end.items_per_s > 0
        # and what the kernel counted for the child over its compute
        assert end.compute_cpu is not None and end.compute_cpu.cpu_s > 0
        # the performance log's record is the run report's record of the same child
        [in_report] = [a for run in report.stages if run.stage == stage for a in run.attempts]
        assert in_report == end
    asr_rss = max(e.rss_mb for e in events if e.stage == "asr" and e.event == "checkpoint")
    audio_rss = max(e.rss_mb for e in events if e.stage == "audio" and e.event == "checkpoint")
    # (a child forked from the fork server counts the server's imported libraries in its RSS, pages it
    # shares with every other stage child: the model and its buffers are what ASR holds on top)
    assert asr_rss > audio_rss + 100, (
        "the asr child (torch + whisperx + model) is far bigger than the audio one"
    )
    assert all(a.peak_vram_mb is None for s in report.stages for a in s.attempts)
    assert ChildRegistry(tmp_path / "pids").records() == []
    built = build(settings.output_dir)
    assert [s.stage for s in built.summaries] == ["audio", "asr", "diarization", "alignment", "embeddings"]
    assert built.png.stat().st_size > 10_000
