"""The Ray executor on a multi-node cluster on this machine (``ray.cluster_utils.Cluster``).

Ray's own way to test multi-node behaviour: a head node and worker nodes, each
a raylet of its own with the resources it declares, and a node removed on
demand (a preempted spot instance). Here the head places no tasks (0 CPUs), two
workers declare a custom ``decode`` resource and two declare a ``GPU`` each (the
stages still run on the CPU): stage tasks must land on the nodes that have what
their stage asks for, the run report must name the node of every attempt, and
the items of a node lost mid-task must be retried on another node without
redoing the finished ones.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ray = pytest.importorskip(
    "ray", reason="the ray group is not installed (uv sync --group ray); CI installs it"
)

import numpy as np  # noqa: E402 - after the importorskip of ray
import psutil  # noqa: E402 - after the importorskip of ray
from ray.cluster_utils import Cluster  # noqa: E402 - after the importorskip of ray

from contracts import StageRequest, WorkItem, load_model  # noqa: E402 - after the importorskip of ray
from orchestrator import Settings  # noqa: E402 - after the importorskip of ray
from orchestrator.registry import StageSpec  # noqa: E402 - after the importorskip of ray
from orchestrator.run.runner import StageRunner  # noqa: E402 - after the importorskip of ray
from orchestrator.scale.ray_executor import RayExecutor  # noqa: E402 - after the importorskip of ray
from tests.conftest import ROOT, process_args, wait_for  # noqa: E402 - after the importorskip of ray
from tests.fixtures.generate import clips  # noqa: E402 - after the importorskip of ray
from tests.fixtures.stages import FixtureSettings, NoteArtifact  # noqa: E402 - after the importorskip of ray

#: what a decoding node declares; the stages that decode ask for one
DECODE = {"decode": 1.0}


@pytest.fixture(scope="module")
def cluster():
    """A head node placing no tasks, two decoding nodes and two GPU nodes; started once for the module."""
    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", "RAY_USAGE_STATS_ENABLED")}
    # every raylet and its workers inherit this process's environment: they import the project and the test
    # stages from the worktree
    os.environ["PYTHONPATH"] = str(ROOT)
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 0,
            "include_dashboard": False,
            # a lost node is known within seconds (default: about half a minute)
            "_system_config": {
                "health_check_initial_delay_ms": 0,
                "health_check_period_ms": 500,
                "health_check_failure_threshold": 4,
            },
        },
    )
    try:
        nodes = {
            "decode-1": cluster.add_node(num_cpus=1, resources=DECODE),
            "decode-2": cluster.add_node(num_cpus=1, resources=DECODE),
            "gpu-1": cluster.add_node(num_cpus=1, num_gpus=1),
            "gpu-2": cluster.add_node(num_cpus=1, num_gpus=1),
        }
        cluster.wait_for_nodes()
        yield cluster, nodes
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture(scope="module")
def settings(cluster, tmp_path_factory) -> Settings:
    return Settings(
        executor="ray",
        ray_address=cluster[0].address,
        device="cpu",
        gpu_monitor=False,
        pid_dir=tmp_path_factory.mktemp("pids"),
        ray_placement_timeout_s=120,
    )


def _executor(settings: Settings, resources: dict[str, float], **changes) -> RayExecutor:
    """An executor whose sleeper tasks ask for ``resources`` (as PIPELINE_RAY_STAGE_RESOURCES would)."""
    return RayExecutor(settings.replace(ray_stage_resources={"sleeper": resources}, **changes))


def _items(tmp_path: Path, ids: str) -> list[WorkItem]:
    return [
        WorkItem(id=k, inputs={"source": k}, output=str(tmp_path / k / "note.json"), fingerprint=f"fp-{k}")
        for k in ids
    ]


def _sleeper(started: Path, release: Path, **settings) -> StageSpec:
    return StageSpec(
        "sleeper",
        "tests.fixtures.stages_sleeper",
        NoteArtifact,
        batch_size=2,
        settings=FixtureSettings(started=str(started), release=str(release), sleep_s=120, **settings),
    )


def _node_name(nodes: dict, node_id: str | None) -> str | None:
    return next((name for name, node in nodes.items() if node.node_id == node_id), None)


def test_stage_tasks_in_flight_at_once_each_run_on_a_node_with_what_it_asks(cluster, settings, tmp_path):
    _, nodes = cluster
    release = tmp_path / "release"
    # Given two decoding chunks and one GPU chunk, each held in its task until all three have started
    runs = {
        "decode-a": (_executor(settings, DECODE), "ab"),
        "decode-b": (_executor(settings, DECODE), "cd"),
        "gpu": (_executor(settings, {"GPU": 1.0}), "e"),
    }
    reports: dict = {}

    def run(name: str) -> None:
        executor, ids = runs[name]
        runner = StageRunner(executor, tmp_path / name, env={}, device="cpu", max_signal_retries=0)
        reports[name] = runner.run(_sleeper(tmp_path / f"{name}.started", release), _items(tmp_path, ids))

    threads = [threading.Thread(target=run, args=(name,)) for name in runs]
    for thread in threads:
        thread.start()
    try:
        wait_for(
            lambda: all((tmp_path / f"{name}.started").exists() for name in runs),
            timeout=300,
            what="three tasks in flight",
        )
    finally:
        release.touch()
        for thread in threads:
            thread.join(timeout=300)
    # Then all three ran at once, each on its own node: the decoding ones on the two decoding nodes, the
    # GPU one on the GPU node, and the report names the node of every attempt
    placed = {}
    for name, (outcomes, report) in reports.items():
        assert all(o.ok for o in outcomes.values()), (name, outcomes)
        (attempt,) = report.attempts
        assert attempt.outcome == "ok" and attempt.node is not None
        placed[name] = _node_name(nodes, attempt.node)
    assert {placed["decode-a"], placed["decode-b"]} == {"decode-1", "decode-2"}, placed
    assert placed["gpu"] in ("gpu-1", "gpu-2"), placed
    for executor, _ in runs.values():
        executor.close()


def test_a_stage_no_node_can_ever_place_fails_within_the_placement_timeout(cluster, settings, tmp_path):
    # Given a stage asking for a resource no node declares, and 3 s to place it
    executor = _executor(settings, {"CPU": 1.0, "tpu": 1.0}, ray_placement_timeout_s=3)
    runner = StageRunner(executor, tmp_path / "run", env={}, device="cpu", max_signal_retries=0)
    began = time.monotonic()
    try:
        outcomes, report = runner.run(
            _sleeper(tmp_path / "started", tmp_path / "release"), _items(tmp_path, "ab")
        )
    finally:
        executor.close()
    # Then it is refused within seconds, naming what it asked for and what the cluster has
    assert time.monotonic() - began < 60
    assert [(a.outcome, a.node) for a in report.attempts] == [("refused", None)]
    assert outcomes["a"].error == (
        "sleeper was not started: not placed within 3 s: needs 1 CPU, 1 tpu, the cluster has 2 GPU, 4 CPU, "
        "0 tpu; no node of the cluster has that much (PIPELINE_RAY_PLACEMENT_TIMEOUT_S; "
        "PIPELINE_RAY_GPUS_PER_TASK / _CPUS_PER_TASK / _STAGE_RESOURCES)"
    )
    assert not (tmp_path / "started").exists()


def _remove_the_node_holding_the_task(cluster, run_dir: Path, started: Path, release: Path, seen: dict):
    """Once the task's child sleeps on its held item, remove the node the task runs on (no graceful stop),
    wait for the child to die with it, then release the retry."""
    cluster, nodes = cluster
    wait_for(started.exists, timeout=300, what="the held item to start")
    child = int(started.read_text())
    node_id = (run_dir / "chunk001-sleeper-1.started").read_text().strip()
    name = _node_name(nodes, node_id)
    seen.update(node=node_id, name=name, child=child)
    started.unlink()
    cluster.remove_node(nodes[name], allow_graceful=False)
    wait_for(
        lambda: not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE,
        timeout=60,
        what="the lost node's stage child to die",
    )
    release.touch()


def _replace_the_lost_node(cluster, seen: dict) -> None:
    """A new decoding node joins, so the cluster keeps its shape for the next test (Ray starts a node from the
    main thread only)."""
    cluster, nodes = cluster
    if seen.get("name"):
        nodes[seen["name"]] = cluster.add_node(num_cpus=1, resources=DECODE)
        cluster.wait_for_nodes()


def _lose_the_node_holding_b(cluster, settings, tmp_path: Path, max_signal_retries: int):
    """A decoding chunk of two items, "a" finishing at once and "b" holding its task, whose node is removed
    while it holds b: (the runner's outcomes, its report, what the remover saw), the cluster whole again."""
    executor = _executor(settings, DECODE)
    run_dir, started, release = tmp_path / "run", tmp_path / "started", tmp_path / "release"
    seen: dict = {}
    remover = threading.Thread(
        target=_remove_the_node_holding_the_task, args=(cluster, run_dir, started, release, seen)
    )
    remover.start()
    try:
        runner = StageRunner(executor, run_dir, env={}, device="cpu", max_signal_retries=max_signal_retries)
        outcomes, report = runner.run(_sleeper(started, release, hold=["b"]), _items(tmp_path, "ab"))
    finally:
        release.touch()
        remover.join(timeout=300)
        executor.close()
        _replace_the_lost_node(cluster, seen)
    return outcomes, report, seen


@pytest.mark.slow
def test_a_node_lost_mid_task_has_its_unfinished_items_retried_on_another_node(cluster, settings, tmp_path):
    # Given a decoding chunk of two items: "a" finishes at once, "b" holds its task
    # When the node running the task is removed while it holds item b
    outcomes, report, seen = _lose_the_node_holding_b(cluster, settings, tmp_path, max_signal_retries=2)
    run_dir = tmp_path / "run"
    # Then the attempt on the lost node is reported killed, with that node, and b alone is retried on the other
    # decoding node; a, finished before the loss, is not redone
    assert seen["name"] in ("decode-1", "decode-2")
    first, second = report.attempts
    assert (first.outcome, first.signal, first.node) == ("killed", 9, seen["node"])
    assert second.outcome == "ok" and second.node not in (None, seen["node"])
    assert [i.id for i in load_model(run_dir / "chunk001-sleeper-2.request.json", StageRequest).items] == [
        "b"
    ]
    assert outcomes["a"].ok and outcomes["a"].retries == 0
    assert outcomes["b"].ok and outcomes["b"].retries == 1
    notes = {k: load_model(tmp_path / k / "note.json", NoteArtifact) for k in "ab"}
    assert notes["a"].pid == seen["child"] and notes["b"].pid != seen["child"]


@pytest.mark.slow
def test_a_node_lost_with_no_signal_retries_left_fails_its_unfinished_items_alone(
    cluster, settings, tmp_path
):
    # Given PIPELINE_MAX_SIGNAL_RETRIES=0, when the node holding item b is lost
    outcomes, report, seen = _lose_the_node_holding_b(cluster, settings, tmp_path, max_signal_retries=0)
    # Then b fails alone, a stays done, and nothing was retried
    assert [(a.outcome, a.node) for a in report.attempts] == [("killed", seen["node"])]
    assert outcomes["a"].ok
    assert not outcomes["b"].ok and "killed" in outcomes["b"].error, outcomes["b"].error


# -- the whole pipeline through the CLI, outputs in a bucket --------------------------------------------------

#: decoding on the decoding nodes, the model stages on the GPU node (they still compute on the CPU here)
STAGE_RESOURCES = {
    "audio": {"CPU": 1.0, "decode": 1.0},
    "asr": {"CPU": 1.0, "GPU": 1.0},
    "alignment": {"CPU": 1.0, "GPU": 1.0},
    "embeddings": {"CPU": 1.0, "GPU": 1.0},
}


def _process(inputs: Path, output: str, *extra: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    args = process_args(
        inputs, output, "--no-speakers", "--embedding-profile", "embedded", "--device", "cpu", *extra
    )
    # each input's words must not depend on its neighbours in a joined window: chunks differ between the runs
    env = os.environ | {"ASR_JOIN_INPUTS": "false"} | env
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=900, env=env)


@pytest.mark.slow
def test_the_pipeline_across_nodes_gives_the_local_outputs_in_a_bucket(cluster, s3, tmp_path):
    """Outputs in a bucket (tests/conftest.py's moto S3 server): no node keeps them on its own disk."""
    cluster, nodes = cluster
    fs, _ = s3
    clips(tmp_path / "in", 24, seconds=2.0)
    # Given 24 inputs in 5 chunks (whole join groups of 5), 3 at a time, on the cluster: decoding asks for a
    # decoding node, the model stages for a GPU, and the outputs go to a bucket
    done = _process(
        tmp_path / "in",
        "s3://media/out",
        *("--executor", "ray", "--ray-address", cluster.address),
        *("--chunk-size", "5", "--parallel-chunks", "3"),
        env={
            "PIPELINE_RAY_STAGE_RESOURCES": json.dumps(STAGE_RESOURCES),
            "PIPELINE_STAGING_DIR": str(tmp_path / "staging"),
        },
    )
    assert done.returncode == 0, done.stderr[-3000:]
    fs.invalidate_cache()
    report = json.loads(fs.cat("media/out/run-report.json"))
    assert report["ok"] == 24 and report["chunks"] == 5
    # Then the report names the node of every attempt, and each stage ran only where its resources are
    where: dict[str, set] = {}
    for run in report["stages"]:
        for attempt in run["attempts"]:
            assert attempt["outcome"] == "ok" and attempt["node"], attempt
            where.setdefault(run["stage"], set()).add(_node_name(nodes, attempt["node"]))
    assert where["audio"] == {"decode-1", "decode-2"}, where  # chunks decoded at once, on both nodes
    for stage in ("asr", "alignment", "embeddings"):
        assert where[stage] and where[stage] <= {"gpu-1", "gpu-2"}, where
    # and the outputs are the local executor's, in one chunk on this machine
    local = tmp_path / "local"
    done = _process(tmp_path / "in", str(local), "--chunk-size", "24", env={})
    assert done.returncode == 0, done.stderr[-3000:]
    transcripts = sorted(local.rglob("transcript.json"))
    assert len(transcripts) == 24
    for transcript in transcripts:
        item = transcript.parent.relative_to(local)
        ours = json.loads(fs.cat(f"media/out/{item}/transcript.json"))
        theirs = json.loads(transcript.read_text())
        assert [s["text"] for s in ours["segments"]] == [s["text"] for s in theirs["segments"]], item
        with fs.open(f"media/out/{item}/embeddings.npy", "rb") as fh:
            np.testing.assert_allclose(np.load(fh), np.load(transcript.parent / "embeddings.npy"), atol=1e-4)


def _child_pid(log: Path) -> int | None:
    """The stage child's pid, from the task's log line "... attempt N: pid P, ..." (None: not started yet)."""
    lines = log.read_text().splitlines() if log.exists() else []
    for line in lines:
        if ": pid " in line and "attempt" in line:
            return int(line.split(": pid ")[1].split(",")[0])
    return None


@pytest.mark.slow
def test_the_driver_killed_on_a_multi_node_cluster_resumes_with_nothing_redone(cluster, tmp_path):
    cluster, _ = cluster
    clips(tmp_path / "in", 4, seconds=2.0)
    out = tmp_path / "out"
    args = [sys.executable, "-m", "orchestrator.cli", "process", str(tmp_path / "in"), "--output", str(out)]
    args += ["--no-speakers", "--embedding-profile", "embedded", "--device", "cpu", "--chunk-size", "2"]
    args += ["--executor", "ray", "--ray-address", cluster.address, "--parallel-chunks", "1"]
    env = os.environ | {"PIPELINE_RAY_STAGE_RESOURCES": json.dumps(STAGE_RESOURCES)}
    # Given a run killed with SIGKILL once chunk 2's ASR child works on the GPU node
    with open(tmp_path / "first.log", "w") as log:
        proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log, env=env)
    try:
        runs = out / ".runs"
        directory = wait_for(
            lambda: next(iter(sorted(runs.glob("*"))), None) if runs.exists() else None,
            timeout=500,
            what="run directory",
        )
        child = wait_for(
            lambda: _child_pid(directory / "chunk002-asr-1.log"), timeout=500, what="chunk 2's ASR"
        )
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    wait_for(
        lambda: not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE,
        timeout=60,
        what="the killed driver's stage child to die",
    )
    journal = [json.loads(line) for line in (out / "journal.jsonl").read_text().splitlines()]
    complete = {e["item"] for e in journal if e["stage"] == "outputs" and e["status"] == "ok"}
    assert complete == {"in/clip000", "in/clip001"}
    # When the same command runs again
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=900, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    # Then it resumes: chunk 1's inputs are in no request of the second run, and all four are done
    second = sorted((out / ".runs").glob("*"))[-1]
    assert second != directory
    for request in second.glob("*.request.json"):
        ids = {item["id"] for item in json.loads(request.read_text())["items"]}
        assert not ids & complete, request.name
    report = json.loads((out / "run-report.json").read_text())
    assert report["ok"] == 4 and "resuming: 2 of 4 input(s)" in done.stderr
    nodes = {a["node"] for run in report["stages"] for a in run["attempts"]}
    assert all(nodes)
    # and `pipeline report` names the node of every stage child it lists
    shown = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "report", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert "node" in shown.stdout and all(node[:12] in shown.stdout for node in nodes), shown.stdout


def _lose_the_first_asr_node(cluster, tmp_path: Path, env: dict[str, str]) -> tuple[int, dict, dict]:
    """4 inputs in 2 chunks through the CLI; the GPU node that the first ASR task is placed on is removed (no
    graceful stop) as soon as the task says where it runs. The exit code, the report and the lost node."""
    cluster, nodes = cluster
    clips(tmp_path / "in", 4, seconds=2.0)
    out = tmp_path / "out"
    args = [sys.executable, "-m", "orchestrator.cli", "process", str(tmp_path / "in"), "--output", str(out)]
    args += ["--no-speakers", "--embedding-profile", "embedded", "--device", "cpu", "--chunk-size", "2"]
    args += ["--executor", "ray", "--ray-address", cluster.address, "--parallel-chunks", "2"]
    env = os.environ | {"PIPELINE_RAY_STAGE_RESOURCES": json.dumps(STAGE_RESOURCES)} | env
    with open(tmp_path / "driver.log", "w") as log:
        proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log, env=env)
    lost: dict = {}
    try:
        runs = out / ".runs"
        directory = wait_for(
            lambda: next(iter(sorted(runs.glob("*"))), None) if runs.exists() else None,
            timeout=500,
            what="run directory",
        )

        def first_asr_placed():
            for marker in sorted(directory.glob("chunk*-asr-1.started")):
                node = marker.read_text().strip()
                if node:
                    return marker.name.split("-")[0], node

        chunk, node = wait_for(first_asr_placed, timeout=500, what="an ASR task placed")
        lost.update(chunk=int(chunk.removeprefix("chunk")), node=node, name=_node_name(nodes, node))
        cluster.remove_node(nodes[lost["name"]], allow_graceful=False)
        returncode = proc.wait(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        if lost.get("name"):  # a new GPU node joins: the cluster keeps its shape for the next test
            nodes[lost["name"]] = cluster.add_node(num_cpus=1, num_gpus=1)
            cluster.wait_for_nodes()
    assert (out / "run-report.json").exists(), (tmp_path / "driver.log").read_text()[-3000:]
    return returncode, json.loads((out / "run-report.json").read_text()), lost


@pytest.mark.slow
def test_a_gpu_node_lost_mid_run_through_the_cli_has_its_chunk_retried_on_the_other(cluster, tmp_path):
    # When the GPU node running the first chunk's ASR goes away
    returncode, report, lost = _lose_the_first_asr_node(cluster, tmp_path, {})
    # Then the run completes: that chunk's ASR attempt is reported killed on the lost node, and the next one
    # ran on the other GPU node; every input is done
    assert returncode == 0
    assert report["ok"] == 4
    (asr,) = [r for r in report["stages"] if r["stage"] == "asr" and r["chunk"] == lost["chunk"]]
    first, second = asr["attempts"]
    assert (first["outcome"], first["node"]) == ("killed", lost["node"])
    assert second["outcome"] == "ok" and _node_name(cluster[1], second["node"]) in ("gpu-1", "gpu-2")
    assert second["node"] != lost["node"]
    retried = [i for i in report["inputs"] if i["stages"]["asr"]["retries"] == 1]
    assert len(retried) == 2, report["inputs"]  # the lost chunk's two inputs, once each


@pytest.mark.slow
def test_a_gpu_node_lost_with_no_signal_retries_fails_its_chunk_alone_and_reports(cluster, tmp_path):
    # Given PIPELINE_MAX_SIGNAL_RETRIES=0, when the GPU node running the first chunk's ASR goes away
    returncode, report, lost = _lose_the_first_asr_node(
        cluster, tmp_path, {"PIPELINE_MAX_SIGNAL_RETRIES": "0"}
    )
    # Then that chunk's two inputs fail, the other chunk's finish, and the run writes its report (exit 1)
    assert returncode == 1
    assert (report["ok"], report["failed"]) == (2, 2)
    (asr,) = [r for r in report["stages"] if r["stage"] == "asr" and r["chunk"] == lost["chunk"]]
    assert [(a["outcome"], a["node"]) for a in asr["attempts"]] == [("killed", lost["node"])]
    failed = [i for i in report["inputs"] if i["status"] == "failed"]
    assert {i["failed_stage"] for i in failed} == {"asr"}, failed
