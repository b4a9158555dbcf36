"""`pipeline gpu` and `pipeline report` as a user runs them (real subprocesses, real children)."""

from __future__ import annotations

import json
import os
import signal
import subprocess

from contracts import WorkItem
from contracts.perf import PERF_LOG_ENV
from orchestrator.gpu.nvml import NvmlReader
from orchestrator.process.executor import LocalExecutor
from orchestrator.process.hooks import default_hooks
from orchestrator.process.pidfiles import ChildRegistry
from orchestrator.registry import StageSpec
from orchestrator.run.runner import StageRunner
from tests.conftest import pipeline
from tests.fixtures.stages import NoteArtifact
from tests.orchestrator.process.test_children import gone, start_parent


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return pipeline(*args, env={**os.environ, "COLUMNS": "200", **(env or {})}, timeout=120)


def test_gpu_without_nvml_says_so_and_exits_0(tmp_path):
    nvml = NvmlReader().read().available
    done = cli("gpu", "--json", "--pid-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["available"] is nvml and doc["stage_children"] == []
    if not nvml:
        assert "NVML" in doc["reason"] and doc["devices"] == []
        text = cli("gpu", "--pid-dir", str(tmp_path))
        assert text.returncode == 0 and text.stdout.startswith("GPU: not available: NVML is not available")


def test_gpu_cleanup_stops_the_orphan_of_a_killed_pipeline_and_says_which(tmp_path):
    # Given a pipeline killed while its stage child runs
    parent, child = start_parent(tmp_path)
    parent.send_signal(signal.SIGKILL)
    parent.wait(timeout=10)
    listed = json.loads(cli("gpu", "--json", "--pid-dir", str(tmp_path / "pids")).stdout)
    assert [(c["pid"], c["orphan"], c["alive"]) for c in listed["stage_children"]] == [(child, True, True)]
    # When the user asks for cleanup
    done = cli("gpu", "--cleanup", env={"PIPELINE_PID_DIR": str(tmp_path / "pids")})
    # Then that child is stopped and named
    assert done.returncode == 0, done.stderr
    assert (
        f"stopped orphaned stage child pid {child} (sleeper stage child of pipeline pid {parent.pid}"
        in done.stdout
    )
    assert gone(child)
    again = cli("gpu", "--cleanup", "--json", "--pid-dir", str(tmp_path / "pids"))
    assert json.loads(again.stdout)["cleanup"] == {
        "stopped": [],
        "left_running": [],
        "stale_removed": [],
        "failed": [],
    }


def test_report_prints_a_table_and_writes_a_png_for_a_real_run(tmp_path):
    perf = tmp_path / "out" / "performance_logs" / "20260101T000000Z-abcdef.jsonl"
    runner = StageRunner(
        LocalExecutor(default_hooks(registry=ChildRegistry(tmp_path / "pids"))),
        tmp_path / "run",
        env={PERF_LOG_ENV: str(perf)},
        device="cpu",
        max_signal_retries=0,
    )
    items = [
        WorkItem(id=i, inputs={"source": "good"}, output=str(tmp_path / i / "note.json"), fingerprint="fp")
        for i in ("a", "b")
    ]
    runner.run(StageSpec("picky", "tests.fixtures.stages_picky", NoteArtifact), items)
    done = cli("report", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    row = next(line for line in done.stdout.splitlines() if "picky" in line)
    assert "ok" in row and "2/0" in row
    # where the time went: a row per stage, and the run's exposed time (from the log alone: no run report)
    assert "where the time went" in done.stdout and "exposed " in done.stdout
    png = perf.with_suffix(".png")
    assert f"plot: {png}" in done.stdout.replace("\n", "") or str(png) in done.stdout
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_report_on_a_directory_without_logs_is_a_usage_error(tmp_path):
    done = cli("report", str(tmp_path))
    assert done.returncode == 2 and "no performance log found" in done.stderr
