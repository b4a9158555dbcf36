"""Job records over their whole life on a real server: a transcription nobody collected expires, a cancel
outlives a kill -9 of the server, and links added to a submitted folder after submission stay unnamed."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from contracts import save_model
from contracts.api import JobInput, JobRecord
from orchestrator.api.client import Client
from orchestrator.api.server import start_in_thread
from orchestrator.settings import Settings
from tests.conftest import MEDIA, ROOT, wait_for

FAST = {"speakers": False, "asr_model": "embedded", "embedding_profile": "embedded", "device": "cpu"}


def test_a_finished_transcription_nobody_collected_expires(tmp_path):
    # Given a transcription that finished an hour ago whose answer was never sent (the server stopped first)
    state = tmp_path / "state"
    job_id = "20260101T000000-0123abcd"
    folder = state / "jobs" / job_id
    finished = datetime.now(UTC) - timedelta(hours=1)
    save_model(
        JobRecord(
            id=job_id,
            kind="transcription",
            status="done",
            paths=[str(folder / "upload" / "audio.wav")],
            output_dir=str(folder / "out"),
            created_at=finished,
            finished_at=finished,
            inputs=[JobInput(id="audio", source="audio.wav", status="ok")],
        ),
        folder / "job.json",
    )
    # When a server with a retention of 10 minutes starts on that folder
    running = start_in_thread(Settings(server_dir=state, port=0, transcription_retention_s=600, **FAST))
    try:
        # Then the record and its folder are gone
        assert httpx.get(f"{running.url}/v1/jobs/{job_id}", timeout=30).status_code == 404
        assert not folder.exists()
    finally:
        running.stop()


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(state, root, port) -> subprocess.Popen:
    env = {**os.environ, "PIPELINE_SPEAKERS": "false", "PIPELINE_DEVICE": "cpu", "ASR_MODEL": "embedded"}
    env.pop("PIPELINE_API_TOKEN", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", "serve", "--port", str(port), "--server-dir", str(state)]
        + ["--input-root", str(root), "--embedding-profile", "embedded"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )

    def up():
        try:
            return httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200
        except httpx.TransportError:
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            return False

    wait_for(up, timeout=180, what="the server")
    return proc


@pytest.mark.slow
def test_a_cancelled_job_does_not_run_again_after_a_kill_9_of_the_server(tmp_path):
    root, state = tmp_path / "root", tmp_path / "state"
    (root / "talks").mkdir(parents=True)
    for n in range(6):
        shutil.copy(MEDIA / "speech.wav", root / "talks" / f"talk{n}.wav")
    port = _port()
    url = f"http://127.0.0.1:{port}"
    proc = _serve(state, root, port)
    try:
        # Given a running job whose cancel was asked (its children finish their current item first)
        with Client(url) as api:
            job = api.submit_job("talks")
            wait_for(lambda: api.job(job.id).status == "running", timeout=120, what="the job to run")
            assert httpx.delete(f"{url}/v1/jobs/{job.id}", timeout=30).status_code == 202
        # When the server is killed before the job has stopped
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
        record = JobRecord.model_validate_json((state / "jobs" / job.id / "job.json").read_bytes())
        assert record.status == "running", "the kill came before the job stopped"
        proc = _serve(state, root, port)
        # Then the next server does not run it again: it is cancelled
        with Client(url) as api:
            time.sleep(2)
            again = api.job(job.id)
            assert again.status == "cancelled" and again.runs == 1, again
    finally:
        proc.kill()
        proc.wait(30)


@pytest.mark.slow
def test_links_added_to_a_submitted_folder_after_submission_are_not_named(tmp_path):
    base = tmp_path / "files"
    root, outside = base / "root", base / "outside"
    (root / "first").mkdir(parents=True)
    (root / "later").mkdir()
    (outside / "hidden-folder").mkdir(parents=True)
    for n in range(4):
        shutil.copy(MEDIA / "speech.wav", root / "first" / f"talk{n}.wav")
    shutil.copy(MEDIA / "speech.wav", root / "later" / "talk.wav")
    shutil.copy(MEDIA / "speech.wav", outside / "hidden-folder" / "secret-meeting.wav")
    running = start_in_thread(Settings(server_dir=tmp_path / "state", port=0, input_roots=[root], **FAST))
    try:
        with Client(running.url) as api:
            # Given a folder submitted while another job runs
            first = api.submit_job("first")
            later = api.submit_job("later")
            # When links to the outside are added to it before its run walks it
            os.symlink(outside / "hidden-folder", root / "later" / "linked-folder")
            os.symlink(outside / "hidden-folder" / "secret-meeting.wav", root / "later" / "secret-link.wav")
            assert api.job(later.id).status == "queued", "the links came before the run"
            done = api.wait(later.id, timeout=600, poll_s=0.5)
            api.wait(first.id, timeout=600, poll_s=0.5)
        # Then its report names the talk that was there, and neither the links nor what is behind them
        shown = json.dumps(done.model_dump(mode="json"))
        for name in ("secret-meeting", "secret-link", "linked-folder", "hidden-folder"):
            assert name not in shown, shown
        assert [i.status for i in done.inputs if i.source.endswith("talk.wav")] == ["ok"]
        assert any("outside the allowed input roots" in (i.error or "") for i in done.inputs), done.inputs
    finally:
        running.stop()
