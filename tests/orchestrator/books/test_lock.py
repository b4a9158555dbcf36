"""One run per output directory: a kernel-released lock, a clear refusal, waiting on request."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from contracts.errors import OutputBusyError, SettingsError
from orchestrator import layout
from orchestrator.books.lock import OutputLock
from tests.conftest import ROOT, wait_for

HOLD = (
    "import sys, time; from orchestrator.books.lock import OutputLock\n"
    "with OutputLock(__import__('pathlib').Path(sys.argv[1])):\n    print('held', flush=True); time.sleep(600)\n"
)


def _holder(out):
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(out)], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_holder_is_refused_with_the_first_ones_pid(tmp_path):
    with OutputLock(tmp_path):
        with pytest.raises(OutputBusyError, match=rf"in use by pipeline pid {os.getpid()} on .* \(started "):
            with OutputLock(tmp_path):
                pass
    with OutputLock(tmp_path):  # released when the first left
        pass


def test_a_holder_killed_with_sigkill_leaves_no_stale_lock(tmp_path):
    holder = _holder(tmp_path)
    with pytest.raises(OutputBusyError, match=f"pid {holder.pid}"):
        OutputLock(tmp_path).__enter__()
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    with OutputLock(tmp_path):  # the kernel dropped the lock with its holder
        assert (tmp_path / ".lock").read_text().startswith(f'{{"pid": {os.getpid()}')


@pytest.mark.slow
def test_the_cli_refuses_a_busy_output_with_exit_2_or_waits(tmp_path):
    out = tmp_path / "out"
    holder = _holder(out)
    try:
        cmd = [
            sys.executable,
            "-m",
            "orchestrator.cli",
            "process",
            str(tmp_path / "missing.mp4"),
            "--output",
            str(out),
        ]
        busy = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert busy.returncode == 2, busy.stderr
        assert f"is in use by pipeline pid {holder.pid}" in busy.stderr and "--wait" in busy.stderr
        assert not (out / "run-report.json").exists(), "the refused run touched nothing"
        waiting = subprocess.Popen(cmd + ["--wait"], cwd=ROOT, stderr=subprocess.PIPE, text=True)
        time.sleep(3)
        assert waiting.poll() is None, "it waits while the holder runs"
    finally:
        holder.kill()
        holder.wait()
    _, err = waiting.communicate(timeout=300)
    assert waiting.returncode == 1, err[-2000:]  # it ran: the missing input failed alone
    wait_for(lambda: (out / "run-report.json").exists(), timeout=5, what="the report")


def test_an_output_directory_that_cannot_be_written_is_a_usage_error_at_once(tmp_path):
    (tmp_path / "file").write_text("not a directory")
    cmd = [
        sys.executable,
        "-m",
        "orchestrator.cli",
        "process",
        str(tmp_path / "x.mp4"),
        "--output",
        str(tmp_path / "file" / "out"),
    ]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "cannot write to output directory" in done.stderr, done.stderr


def test_a_lock_for_an_existing_output_folder_refuses_any_other_folder_before_writing(tmp_path):
    with pytest.raises(SettingsError, match="not an output folder"):
        with OutputLock(tmp_path, existing=True):
            pass
    assert list(tmp_path.iterdir()) == []
    # a folder a run made (its ids file) is one
    (tmp_path / layout.IDS).write_text("{}")
    with OutputLock(tmp_path, existing=True):
        assert (tmp_path / layout.LOCK).exists()
