"""Children forked from the fork server (``PIPELINE_START_METHOD=forkserver``) keep every guarantee of a
spawned child: a fresh process with no CUDA state, Ctrl-C ignored, death with the process that asked for it,
their log; a killed fork server or warm child is recovered and the stage completes.

Each test runs its parent in a fresh interpreter (the fork server is one per process), with a fork server
that preloads torch alone (the real one preloads every stage's libraries: one test imports it as the server
does)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from contracts import WorkItem
from orchestrator.process.executor import LocalExecutor
from orchestrator.registry import StageSpec
from orchestrator.run.runner import StageRunner
from tests.conftest import ROOT
from tests.fixtures.stages import FixtureSettings, NoteArtifact

pytestmark = pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="Linux: pidfd and PR_SET_PDEATHSIG")

#: the parent: a child forked from a fork server that preloaded torch; it prints the child's and the
#: server's pids, then does what argv[2] says
PARENT = """
import json, os, signal, sys, time
from orchestrator.process import toolkit
toolkit.FORK_SERVER.preload = ["torch"]
tmp, then = sys.argv[1], sys.argv[2]
proc = toolkit.spawn("tests.orchestrator.process.test_forkserver:child", [tmp], name="forked",
                     method="forkserver", env={"FORKED_PROBE": "1"})
while not os.path.exists(tmp + "/child.json"):
    time.sleep(0.02)
print(json.dumps({"child": proc.pid, "server": toolkit.FORK_SERVER.pid, "parent": os.getpid(),
                  "parent_torch": "torch" in sys.modules}), flush=True)
if then == "kill-server":
    os.kill(toolkit.FORK_SERVER.pid, signal.SIGKILL)
    proc.join(30)
    again = toolkit.spawn("os:getpid", [], name="again", method="forkserver", env={"FORKED_PROBE": "1"})
    again.join(60)
    print(json.dumps({"status": toolkit.exit_status(proc), "again": again.exitcode,
                      "new_server": toolkit.FORK_SERVER.pid}), flush=True)
else:
    time.sleep(120)  # killed by the test
"""


def child(tmp: str) -> None:
    """The forked child: what it sees of itself, then it waits to be killed."""
    torch = sys.modules.get("torch")
    state = {
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "torch_preloaded": torch is not None,
        "cuda_initialized": bool(torch is not None and torch.cuda.is_initialized()),
        "sigint_ignored": signal.getsignal(signal.SIGINT) is signal.SIG_IGN,
        "probe": os.environ.get("FORKED_PROBE"),
    }
    Path(tmp, "child.json.tmp").write_text(json.dumps(state))
    os.replace(Path(tmp, "child.json.tmp"), Path(tmp, "child.json"))
    time.sleep(120)


def start_parent(tmp_path: Path, then: str) -> tuple[subprocess.Popen, dict, dict]:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(tmp_path), then],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = parent.stdout.readline()
    if not line:
        parent.kill()
        pytest.fail(f"no forked child: {parent.communicate()[1][-3000:]}")
    return parent, json.loads(line), json.loads((tmp_path / "child.json").read_text())


def gone(pid: int, within_s: float = 15.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def test_a_forked_child_is_a_fresh_process_with_its_libraries_imported_and_no_cuda(tmp_path):
    # Given a parent that forks a child from a fork server that preloaded torch
    parent, pids, state = start_parent(tmp_path, "wait")
    try:
        # Then the child is a process of its own, the server's child, with torch imported and no CUDA state
        assert state["pid"] not in (pids["parent"], pids["server"])
        assert state["ppid"] == pids["server"]
        assert state["torch_preloaded"] and not state["cuda_initialized"]
        # and it ignores Ctrl-C, sees the parent's environment, and the parent imported no torch
        assert state["sigint_ignored"]
        assert state["probe"] == "1"
        assert not pids["parent_torch"]
    finally:
        parent.kill()
        parent.wait(10)


def test_a_forked_child_and_the_fork_server_die_with_the_parent(tmp_path):
    # Given a forked child running
    parent, pids, _ = start_parent(tmp_path, "wait")
    # When its parent is killed (no cleanup of any kind runs)
    parent.kill()
    parent.wait(10)
    # Then the child dies (it is not the parent's child: it watches it), and the server after it
    assert gone(pids["child"]), "the forked child outlived its parent"
    assert gone(pids["server"]), "the fork server outlived its parent"


def test_a_killed_fork_server_takes_its_child_down_as_killed_and_is_started_again(tmp_path):
    # Given a forked child running; When its fork server is killed
    parent, pids, _ = start_parent(tmp_path, "kill-server")
    out, err = parent.communicate(timeout=120)
    after = json.loads(out.splitlines()[-1])
    # Then the child died with it and reads as killed by SIGKILL (the runner retries that), not as 255
    assert gone(pids["child"])
    assert after["status"] == -signal.SIGKILL, err[-2000:]
    # and the next child is forked from a new server
    assert after["again"] == 0 and after["new_server"] not in (None, pids["server"]), err[-2000:]


def test_the_real_preload_imports_every_stage_library_without_touching_cuda(tmp_path):
    # Given a process that imports what the fork server imports (its output goes nowhere, as the server's)
    code = (
        "import sys, json\n"
        "import stages.runtime.preload as preload\n"
        "import torch\n"
        "open(sys.argv[1], 'w').write(json.dumps({'cuda': torch.cuda.is_initialized(), 'failed': preload.failed,\n"
        "    'whisperx': 'whisperx' in sys.modules, 'st': 'sentence_transformers' in sys.modules}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "state.json")], cwd=ROOT, capture_output=True, timeout=300
    )
    # Then every stage's libraries are imported, none failed, and no CUDA context exists
    state = json.loads((tmp_path / "state.json").read_text())
    assert state == {"cuda": False, "failed": {}, "whisperx": True, "st": True}, done.returncode


#: a stage run through the real executor and runner with the fork server: its first child is killed with the
#: server mid-item (the test kills the server), the retry completes
STAGE_PARENT = """
import sys
from pathlib import Path
from contracts import WorkItem
from orchestrator.process import toolkit
from orchestrator.process.executor import LocalExecutor
from orchestrator.registry import StageSpec
from orchestrator.run.runner import StageRunner
from tests.fixtures.stages import FixtureSettings, NoteArtifact

toolkit.FORK_SERVER.preload = ["torch"]
tmp = Path(sys.argv[1])
runner = StageRunner(LocalExecutor([], start_method="forkserver"), tmp / "run", env={}, device="cpu",
                     max_signal_retries=1)
item = WorkItem(id="a", inputs={"source": "x"}, output=str(tmp / "a" / "note.json"), fingerprint="fp")
settings = FixtureSettings(started=str(tmp / "started"), release=str(tmp / "release"), sleep_s=120)
outcomes, run = runner.run(StageSpec("sleeper", "tests.fixtures.stages_sleeper", NoteArtifact, settings=settings),
                           [item])
print(outcomes["a"].ok, [a.outcome for a in run.attempts], [a.pid for a in run.attempts])
"""


def test_a_stage_whose_fork_server_is_killed_is_retried_and_completes(tmp_path):
    # Given a stage child forked from the fork server, working on its item
    parent = subprocess.Popen(
        [sys.executable, "-c", STAGE_PARENT, str(tmp_path)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    started = tmp_path / "started"
    deadline = time.monotonic() + 120
    while not started.exists():
        if parent.poll() is not None or time.monotonic() > deadline:
            parent.kill()
            pytest.fail(f"the stage child did not start: {parent.communicate()[1][-3000:]}")
        time.sleep(0.05)
    first = int(started.read_text())
    started.unlink()
    # When the fork server is killed
    os.kill(psutil.Process(first).ppid(), signal.SIGKILL)
    # Then the child dies with it
    assert gone(first)
    (tmp_path / "release").write_text("go")  # the retry finishes at once
    out, err = parent.communicate(timeout=180)
    # and the stage was retried in a new child and completed
    assert out.split()[:3] == ["True", "['killed',", "'ok']"], err[-3000:]
    # and each child wrote its log, as a spawned one does
    logs = sorted((tmp_path / "run").glob("*.log"))
    assert len(logs) == 2 and all("sleeper: pid" in p.read_text() for p in logs), [
        p.read_text() for p in logs
    ]


def test_a_killed_warm_child_is_replaced_and_the_stage_completes(tmp_path):
    # Given a warm child started for a stage's request
    runner = StageRunner(LocalExecutor([]), tmp_path / "run", env={}, device="cpu", max_signal_retries=1)
    spec = StageSpec(
        "sleeper",
        "tests.fixtures.stages_sleeper",
        NoteArtifact,
        settings=FixtureSettings(started=str(tmp_path / "started"), sleep_s=0),
    )
    warm = runner.warm_up(spec, 1)
    # When it is killed before its request comes
    os.kill(warm.proc.pid, signal.SIGKILL)
    warm.proc.join(10)
    item = WorkItem(
        id="a", inputs={"source": "x"}, output=str(tmp_path / "a" / "note.json"), fingerprint="fp"
    )
    outcomes, run = runner.run(spec, [item], warm=warm)
    # Then the stage is retried in a new child and completes
    assert outcomes["a"].ok
    assert [a.outcome for a in run.attempts] == ["killed", "ok"]
