"""The Ray executor on a real local Ray cluster (``ray start --head`` on 127.0.0.1, 2 CPUs).

The same test stages and the same embedded models as the local executor's
tests: OOM halving, a killed Ray worker, the whole pipeline giving the local
executor's outputs, and a resume after the driver is killed with SIGKILL.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest

# token authentication, as on a real cluster: set by this package's conftest.py before Ray is imported

ray = pytest.importorskip(
    "ray", reason="the ray group is not installed (uv sync --group ray); CI installs it"
)

import psutil  # noqa: E402 - after the importorskip of ray

from contracts import StageRequest, WorkItem, load_model  # noqa: E402 - after the importorskip of ray
from orchestrator import Settings  # noqa: E402 - after the importorskip of ray
from orchestrator.process.toolkit import stop_trees  # noqa: E402 - after the importorskip of ray
from orchestrator.registry import StageSpec  # noqa: E402 - after the importorskip of ray
from orchestrator.run.runner import StageRunner  # noqa: E402 - after the importorskip of ray
from orchestrator.scale.ray_executor import RayExecutor, unplaced_reason  # noqa: E402 - after the importorskip of ray
from tests.conftest import MEDIA, ROOT, process_args, wait_for  # noqa: E402 - after the importorskip of ray
from tests.fixtures.generate import clips  # noqa: E402 - after the importorskip of ray
from tests.fixtures.stages import FixtureSettings, NoteArtifact  # noqa: E402 - after the importorskip of ray
from tests.orchestrator.process.test_children import gone  # noqa: E402 - after the importorskip of ray

RAY = Path(sys.executable).parent / "ray"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def cluster():
    """A head node for this module; workers import the project and the test stages (PYTHONPATH)."""
    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # Ray's socket paths must stay short
    port = _free_port()
    env = os.environ | {"PYTHONPATH": str(ROOT), "RAY_USAGE_STATS_ENABLED": "0"}
    subprocess.run(
        [
            str(RAY),
            "start",
            "--head",
            "--node-ip-address=127.0.0.1",
            f"--port={port}",
            "--num-cpus=2",
            "--num-gpus=0",
            "--include-dashboard=false",
            f"--temp-dir={temp}",
            "--disable-usage-stats",
        ],
        check=True,
        env=env,
        capture_output=True,
        timeout=180,
    )
    try:
        yield f"127.0.0.1:{port}"
    finally:
        if ray.is_initialized():
            ray.shutdown()
        # only this cluster's processes (their command lines name its temp dir): `ray stop` would stop
        # every Ray process of the user on this machine
        stop_trees(_processes_naming(temp), grace_s=5)  # all at once: one at a time took ~40 s
        shutil.rmtree(temp, ignore_errors=True)


def _processes_naming(text: str) -> list[int]:
    pids = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if any(text in part for part in proc.info["cmdline"] or ()):
            pids.append(proc.info["pid"])
    return pids


@pytest.fixture(scope="module")
def executor(cluster, tmp_path_factory):
    settings = Settings(
        executor="ray",
        ray_address=cluster,
        device="cpu",
        gpu_monitor=False,
        pid_dir=tmp_path_factory.mktemp("pids"),
    )
    executor = RayExecutor(settings)
    yield executor
    executor.close()
    ray.shutdown()


def _items(tmp_path, sources: dict[str, str]) -> list[WorkItem]:
    return [
        WorkItem(id=k, inputs={"source": v}, output=str(tmp_path / k / "note.json"), fingerprint=f"fp-{k}")
        for k, v in sources.items()
    ]


def _request(tmp_path, name, attempt) -> StageRequest:
    return load_model(tmp_path / "run" / f"chunk001-{name}-{attempt}.request.json", StageRequest)


def test_the_cluster_places_stage_tasks_on_cpus_without_gpus(executor):
    assert executor.cluster_cpus == 2 and executor.cluster_gpus == 0
    assert executor.slots() == 2
    options = executor.task_options("chunk001-asr-1", gpu=True)
    assert options["num_gpus"] == 0 and options["max_retries"] == 0 and options["name"] == "chunk001-asr-1"


def test_task_oom_is_resubmitted_with_half_the_batch(executor, tmp_path):
    # Given 3 items needing batch x (10, 10, 100) MiB, 600 MiB of headroom, and batch 8 (item c: 800 MiB)
    runner = StageRunner(executor, tmp_path / "run", env={}, device="cpu", max_signal_retries=2)
    spec = StageSpec(
        "memhog",
        "tests.fixtures.stages_memhog",
        NoteArtifact,
        batch_size=8,
        settings=FixtureSettings(**{"headroom_mib": 600}),
    )
    outcomes, report = runner.run(spec, _items(tmp_path, {"a": "10", "b": "10", "c": "100"}))
    # Then the task's child dies of a real allocator OOM and the next task gets batch 4 and only item c
    assert [(a.batch_size, a.outcome) for a in report.attempts] == [(8, "oom"), (4, "ok")]
    assert [i.id for i in _request(tmp_path, "memhog", 2).items] == ["c"]
    assert all(o.ok for o in outcomes.values())
    notes = {k: load_model(tmp_path / k / "note.json", NoteArtifact) for k in "abc"}
    assert notes["a"].batch_size == 8 and notes["c"].batch_size == 4 and notes["c"].pid != notes["a"].pid
    # the child's own log lines, written on the node, were followed by the driver
    assert "DefaultCPUAllocator" in (tmp_path / "run" / "chunk001-memhog-1.log").read_text()
    assert "ray task on" in (tmp_path / "run" / "chunk001-memhog-1.log").read_text()


def test_a_killed_ray_worker_is_retried_for_the_unfinished_items(executor, tmp_path):
    started, release = tmp_path / "started", tmp_path / "release"
    runner = StageRunner(executor, tmp_path / "run", env={}, device="cpu", max_signal_retries=2)
    spec = StageSpec(
        "sleeper",
        "tests.fixtures.stages_sleeper",
        NoteArtifact,
        batch_size=2,
        settings=FixtureSettings(**{"started": str(started), "release": str(release), "sleep_s": 120}),
    )
    killed: dict[str, int] = {}

    def kill_the_worker():
        deadline = time.monotonic() + 180
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        child = psutil.Process(int(started.read_text()))
        worker = child.parent()  # the Ray worker running the task (max_calls=1)
        killed.update(child=child.pid, worker=worker.pid)
        killed["title"] = " ".join(worker.cmdline())
        started.unlink()
        worker.kill()
        # the child dies with its worker (PR_SET_PDEATHSIG), a moment later: released before that, it could
        # still finish both items, and there would be nothing left to retry
        deadline = time.monotonic() + 30
        while not gone(child.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        release.touch()  # the next attempt's sleeper finishes at once

    killer = threading.Thread(target=kill_the_worker)
    killer.start()
    outcomes, report = runner.run(spec, _items(tmp_path, {"a": "1", "b": "2"}))
    killer.join()
    assert "ray::" in killed["title"]  # it really was a Ray worker process
    assert [(a.outcome, a.signal) for a in report.attempts] == [("killed", 9), ("ok", None)]
    assert [i.id for i in _request(tmp_path, "sleeper", 2).items] == ["a", "b"]
    assert all(o.ok for o in outcomes.values()) and outcomes["a"].retries == 1
    # the stage child died with its worker (PR_SET_PDEATHSIG), and the retry ran in a new one
    assert not psutil.pid_exists(killed["child"]) or psutil.Process(killed["child"]).status() == "zombie"
    assert load_model(tmp_path / "a" / "note.json", NoteArtifact).pid != killed["child"]


def test_a_task_the_cluster_can_never_place_fails_within_the_placement_timeout(executor, tmp_path):
    # Given the 2-CPU cluster, stage tasks that ask for 4 CPUs each, and 3 s to place one
    greedy = RayExecutor(executor.settings.replace(ray_cpus_per_task=4, ray_placement_timeout_s=3))
    runner = StageRunner(greedy, tmp_path / "run", env={}, device="cpu", max_signal_retries=2)
    spec = StageSpec(
        "sleeper",
        "tests.fixtures.stages_sleeper",
        NoteArtifact,
        batch_size=2,
        settings=FixtureSettings(**{"started": str(tmp_path / "started"), "sleep_s": 0}),
    )
    began = time.monotonic()
    try:
        outcomes, report = runner.run(spec, _items(tmp_path, {"a": "1", "b": "2"}))
    finally:
        greedy.close()
    took = time.monotonic() - began
    # Then the task is refused within seconds instead of waiting forever, and its items fail with the reason
    assert [a.outcome for a in report.attempts] == ["refused"]
    assert took < 30, took
    for item in "ab":
        assert not outcomes[item].ok and outcomes[item].error == (
            "sleeper was not started: not placed within 3 s: needs 4 CPU, the cluster has 0 GPU, 2 CPU; no node "
            "of the cluster has that much (PIPELINE_RAY_PLACEMENT_TIMEOUT_S; PIPELINE_RAY_GPUS_PER_TASK / "
            "_CPUS_PER_TASK / _STAGE_RESOURCES)"
        )
    assert not (tmp_path / "started").exists() and not (tmp_path / "a" / "note.json").exists()
    # and the cluster is not left holding it: a task it can place still runs
    outcomes, _ = StageRunner(executor, tmp_path / "run2", env={}, device="cpu", max_signal_retries=2).run(
        spec, _items(tmp_path, {"c": "3"})
    )
    assert outcomes["c"].ok


def test_an_unplaced_task_says_whether_it_can_ever_be_placed():
    needs = {"name": "chunk001-asr-1", "num_cpus": 1.0, "num_gpus": 1.0, "max_retries": 0}
    # no node has a GPU: it never will be placed
    assert unplaced_reason(600, needs, {"CPU": 8.0}, [{"CPU": 4.0}, {"CPU": 4.0}]).startswith(
        "not placed within 600 s: needs 1 CPU, 1 GPU, the cluster has 0 GPU, 8 CPU; no node of the cluster has"
    )
    # 2 GPUs on 2 nodes, but no node has 2: still never
    assert "no node" in unplaced_reason(
        60,
        needs | {"num_gpus": 2.0},
        {"CPU": 8.0, "GPU": 2.0},
        [{"CPU": 4.0, "GPU": 1.0}, {"CPU": 4.0, "GPU": 1.0}],
    )
    # a node has what it needs: other work holds it
    assert "but they stayed busy" in unplaced_reason(
        60, needs, {"CPU": 8.0, "GPU": 1.0}, [{"CPU": 4.0}, {"CPU": 4.0, "GPU": 1.0}]
    )


# -- the whole pipeline through the CLI --------------------------------------------------------------


def _cli(out: Path, inputs: Path, *extra: str) -> list[str]:
    return process_args(
        inputs, out, "--chunk-size", "2", "--embedding-profile", "embedded", "--device", "cpu", *extra
    )


def _outputs(out: Path) -> dict[str, tuple[list[tuple[str, str | None]], np.ndarray]]:
    result = {}
    # ids mirror the input folder: OUT/<folder>/<stem>/
    for transcript in sorted(out.rglob("transcript.json")):
        segments = [(s["text"], s.get("speaker")) for s in json.loads(transcript.read_text())["segments"]]
        result[transcript.parent.name] = (segments, np.load(transcript.parent / "embeddings.npy"))
    return result


def _child_pid(log: Path) -> int | None:
    if not log.exists():
        return None
    for line in log.read_text().splitlines():
        if ": pid " in line and "attempt" in line:
            return int(line.split(": pid ")[1].split(",")[0])
    return None


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    """Three short clips and a two-speaker dialogue: every stage runs, diarization included."""
    directory = tmp_path_factory.mktemp("in")
    clips(directory, 3, seconds=2.5)
    shutil.copy(MEDIA / "speakers" / "host_guest.mp4", directory / "host_guest.mp4")
    return directory


@pytest.fixture(scope="module")
def local_outputs(tmp_path_factory, inputs) -> Path:
    out = tmp_path_factory.mktemp("local")
    done = subprocess.run(_cli(out, inputs), cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def ray_resumed(tmp_path_factory, cluster, inputs) -> dict:
    """A Ray run killed with SIGKILL once chunk 2's ASR child works, then the same command again."""
    out = tmp_path_factory.mktemp("ray")
    args = _cli(out, inputs, "--executor", "ray", "--ray-address", cluster, "--parallel-chunks", "1")
    first_log = out.parent / "ray-first.log"
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=open(first_log, "w"))
    try:
        directory = wait_for(
            lambda: next(iter(sorted((out / ".runs").glob("*"))), None) if (out / ".runs").exists() else None,
            timeout=500,
            what="run directory",
        )
        child = wait_for(
            lambda: _child_pid(directory / "chunk002-asr-1.log"), timeout=500, what="chunk 2's ASR child"
        )
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    journal = [json.loads(line) for line in (out / "journal.jsonl").read_text().splitlines()]
    # ids mirror the input folder (in/clip000): the clips are told apart by their last part
    complete = {
        e["item"].rsplit("/", 1)[-1] for e in journal if e["stage"] == "outputs" and e["status"] == "ok"
    }
    # Ray ends a dead driver's tasks; the stage child dies with its worker
    wait_for(
        lambda: not psutil.pid_exists(child) or psutil.Process(child).status() == "zombie",
        timeout=60,
        what="the killed driver's stage child to die",
    )
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    runs = sorted((out / ".runs").glob("*"))
    return {
        "out": out,
        "complete": complete,
        "first": directory,
        "second": runs[-1],
        "stderr": done.stderr,
        "report": json.loads((out / "run-report.json").read_text()),
    }


@pytest.mark.slow
def test_ray_executor_gives_the_local_executors_outputs(local_outputs, ray_resumed):
    ours, theirs = _outputs(ray_resumed["out"]), _outputs(local_outputs)
    assert sorted(ours) == sorted(theirs) == ["clip000", "clip001", "clip002", "host_guest"]
    for name in ours:
        assert ours[name][0] == theirs[name][0], name  # same text, same speaker labels
        np.testing.assert_allclose(ours[name][1], theirs[name][1], atol=1e-4)
    speakers = {speaker for _, speaker in ours["host_guest"][0]}
    assert len(speakers) == 2, speakers  # diarization ran as a Ray task too
    srt = next(ray_resumed["out"].rglob("host_guest/transcript.srt")).read_text()
    assert "[S0" in srt  # corpus speakers (orchestrator.corpus.speakers), placed as in a local run


@pytest.mark.slow
def test_rerun_after_the_driver_is_killed_resumes_without_redoing_complete_inputs(ray_resumed):
    complete, report = ray_resumed["complete"], ray_resumed["report"]
    assert complete == {"clip000", "clip001"}  # chunk 1 was done when the driver died
    assert report["ok"] == 4 and "resuming: 2 of 4 input(s)" in ray_resumed["stderr"]
    second = ray_resumed["second"]
    assert second != ray_resumed["first"]
    for request in second.glob("*.request.json"):
        ids = {item["id"].rsplit("/", 1)[-1] for item in json.loads(request.read_text())["items"]}
        assert not ids & complete, request.name
    for item in report["inputs"]:
        if item["id"].rsplit("/", 1)[-1] in complete:
            assert {s["status"] for s in item["stages"].values()} == {"reused"}
    assert report["settings"]["executor"] == "ray"


@pytest.mark.slow
def test_chunks_run_at_the_same_time_on_the_cluster(cluster, tmp_path):
    clips(tmp_path / "in", 4, seconds=2.0)
    out = tmp_path / "out"
    # Given a 2-CPU cluster and 2 chunks, with no --parallel-chunks: the cluster's slots decide
    done = subprocess.run(
        _cli(out, tmp_path / "in", "--executor", "ray", "--ray-address", cluster, "--no-speakers", "-v"),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "2 chunk(s) at a time" in done.stderr
    report = json.loads((out / "run-report.json").read_text())
    assert report["ok"] == 4 and report["chunks"] == 2
    # Then chunk 2 was under way before chunk 1 was finished (one would wait for the other otherwise)
    events = [json.loads(line) for line in (out / "journal.jsonl").read_text().splitlines()]
    first_of_chunk2 = min(e["time"] for e in events if e["item"] in ("in/clip002", "in/clip003"))
    last_of_chunk1 = max(e["time"] for e in events if e["item"] in ("in/clip000", "in/clip001"))
    assert first_of_chunk2 < last_of_chunk1
    # each chunk's stages still ran in order, in one task per stage
    for chunk in (1, 2):
        stages = [s["stage"] for s in report["stages"] if s["chunk"] == chunk]
        assert stages == ["audio", "asr", "alignment", "embeddings"], stages
    assert "[chunk002-asr-1]" in done.stderr  # each task's lines are told apart in the driver's log
