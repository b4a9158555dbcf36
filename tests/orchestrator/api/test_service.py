"""The service under real use: jobs whose inputs fail alone, confinement where the file is
opened, one server per state folder, bounded walks and streamed results, cancel and retention, and
admission by expected wait. Real servers on 127.0.0.1; one shared server where the cases allow it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from contracts.api import JobRecord, JobResult
from orchestrator.api.client import Client
from orchestrator.api.server import start_in_thread
from orchestrator.settings import Settings
from tests.conftest import MEDIA

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    base = tmp_path_factory.mktemp("service")
    root, outside = base / "root", base / "outside"
    root.mkdir()
    outside.mkdir()
    return root, outside


@pytest.fixture(scope="module")
def server(tmp_path_factory, roots):
    root, _ = roots
    running = start_in_thread(
        Settings(
            server_dir=tmp_path_factory.mktemp("state"),
            port=0,
            input_roots=[root],
            device="cpu",
            speakers=False,
            asr_model="embedded",
            embedding_profile="embedded",
        )
    )
    yield running
    running.stop()


def _wait(url: str, job_id: str, timeout: float = 120) -> JobRecord:
    with Client(url) as api:
        return api.wait(job_id, timeout=timeout, poll_s=0.2)


def test_inputs_fail_alone_whatever_is_wrong_with_them(server, roots):
    root, _ = roots
    # Given a folder with a name that is not UTF-8, a FIFO, a file that is not media, and one that goes missing
    folder = root / "odd"
    folder.mkdir()
    (Path(os.fsdecode(bytes(folder) + b"/caf\xe9.wav"))).write_bytes(b"not audio at all" * 10)
    os.mkfifo(root / "pipe.wav")
    (folder / "notes.mp3").write_text("just text")
    (root / "gone.wav").write_bytes(b"x" * 100)
    # When it is submitted as a job (the folder and the files)
    submitted = httpx.post(
        f"{server.url}/v1/jobs", json={"paths": ["odd", "gone.wav", "pipe.wav"]}, timeout=30
    )
    # Then it is accepted (not a 500 from a name that is not UTF-8), with an escaped, readable source
    assert submitted.status_code == 202, submitted.text
    job = JobRecord.model_validate_json(submitted.content)
    assert any("caf\\xe9" in i.source for i in job.inputs), job.inputs
    (root / "gone.wav").unlink()  # missing when the job starts
    done = _wait(server.url, job.id)
    # And the job finishes with one failed input each, with a one-line reason for people
    assert done.status == "failed" and done.error == "4 of 4 input(s) failed", done.error
    errors = {i.source.rsplit("/", 1)[-1]: i.error for i in done.inputs}
    assert all(i.status == "failed" for i in done.inputs) and len(errors) == 4, done.inputs
    assert errors["gone.wav"].startswith("file not found"), errors
    assert "FIFO" in errors["pipe.wav"]
    assert errors["notes.mp3"].startswith("not a readable media file")
    assert errors["caf\\xe9.wav"].startswith("not a readable media file")
    for error in errors.values():
        assert "\n" not in error and "ApiError" not in error and "HTTP 4" not in error, error
    # And its result streams (chunked) and says the same
    with httpx.stream("GET", f"{server.url}/v1/jobs/{job.id}/result?embeddings=true", timeout=30) as response:
        assert (
            response.headers.get("transfer-encoding") == "chunked"
            and "content-length" not in response.headers
        )
        result = JobResult.model_validate_json(response.read())
    assert [i.status for i in result.inputs] == ["failed"] * 4


def test_a_folder_swapped_for_a_link_after_submission_reads_nothing_outside(server, roots):
    root, outside = roots
    # Given a talk inside the root, and a secret outside it at the same relative place
    (root / "talks").mkdir()
    shutil.copy(MEDIA / "speech.wav", root / "talks" / "talk.wav")
    shutil.copy(MEDIA / "speech.wav", outside / "talk.wav")
    submitted = httpx.post(f"{server.url}/v1/jobs", json={"paths": ["talks/talk.wav"]}, timeout=30)
    assert submitted.status_code == 202, submitted.text
    # When the folder is replaced by a link to the outside between submission and decoding
    shutil.rmtree(root / "talks")
    os.symlink(outside, root / "talks")
    done = _wait(server.url, submitted.json()["id"])
    # Then the input fails, saying why, and nothing was transcribed
    assert done.status == "failed" and done.inputs[0].status == "failed", done
    assert "outside the allowed input roots" in done.inputs[0].error, done.inputs[0].error
    with Client(server.url) as api:
        assert api.result(done.id).inputs[0].transcript is None


def test_a_second_server_on_the_same_state_folder_exits_2_naming_the_holder(server):
    state = server.app.state.settings.server_dir
    second = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "serve", "--server-dir", str(state), "--port", "0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert second.returncode == 2, second.stderr
    assert "server state folder" in second.stderr and f"pid {os.getpid()}" in second.stderr, second.stderr
    assert "pipeline serve on 127.0.0.1" in second.stderr


def test_delete_cancels_a_running_job_and_deletes_its_outputs_and_a_queued_one(server, roots):
    root, _ = roots
    shutil.copy(MEDIA / "speech.wav", root / "long.wav")
    with Client(server.url) as api:
        running = api.submit_job("long.wav")
        queued = api.submit_job("long.wav")
        deadline = time.monotonic() + 60
        while api.job(running.id).status != "running" and time.monotonic() < deadline:
            time.sleep(0.05)
        # When the queued one is deleted: it is cancelled at once and never runs
        answer = httpx.delete(f"{server.url}/v1/jobs/{queued.id}", timeout=30)
        assert answer.status_code == 200 and answer.json()["status"] == "cancelled", answer.text
        # And the running one is deleted with its outputs: it stops, then its folder goes
        answer = httpx.delete(
            f"{server.url}/v1/jobs/{running.id}", params={"delete_outputs": "true"}, timeout=30
        )
        assert answer.status_code == 202, answer.text
        folder = Path(running.output_dir).parent
        deadline = time.monotonic() + 90
        while folder.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not folder.exists(), "the cancelled job's outputs were deleted"
        assert httpx.get(f"{server.url}/v1/jobs/{running.id}", timeout=30).status_code == 404
        assert api.job(queued.id).status == "cancelled" and api.job(queued.id).runs == 0


def test_finished_jobs_expire_after_the_retention(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    (root / "bad.wav").write_text("not audio")
    running = start_in_thread(
        Settings(server_dir=tmp_path / "state", port=0, input_roots=[root], device="cpu", job_retention_s=1)
    )
    try:
        with Client(running.url) as api:
            job = api.submit_job("bad.wav")
            assert api.wait(job.id, timeout=120, poll_s=0.1).status == "failed"
            deadline = time.monotonic() + 30
            while (
                httpx.get(f"{running.url}/v1/jobs/{job.id}").status_code != 404
                and time.monotonic() < deadline
            ):
                time.sleep(0.1)
        assert httpx.get(f"{running.url}/v1/jobs/{job.id}").status_code == 404
        assert not (tmp_path / "state" / "jobs" / job.id).exists()
    finally:
        running.stop()
