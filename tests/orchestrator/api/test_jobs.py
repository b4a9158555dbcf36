"""Jobs: input paths confined to the allowed roots, and real jobs through the Orchestrator, across a restart."""

from __future__ import annotations

import os
import shutil
import time

import httpx
import pytest

from contracts import load_model
from contracts.api import JobRecord
from contracts.errors import ApiError
from orchestrator.api.client import Client
from orchestrator.api.jobs import confine, count_files
from orchestrator.api.server import start_in_thread
from orchestrator.settings import Settings
from tests.conftest import MAX_WER, MEDIA, SPEECH_TEXT, wer


@pytest.fixture()
def roots(tmp_path):
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (root / "a.wav").write_bytes(b"x")
    (root / "sub" / "b.mp4").write_bytes(b"x")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.wav").write_bytes(b"x")
    return root, outside


def _refused(raw: str, roots: list, status: int) -> str:
    with pytest.raises(ApiError) as caught:
        confine(raw, roots)
    assert caught.value.status == status, caught.value
    return caught.value.message


def test_paths_inside_the_root_are_accepted_and_counted(roots):
    root, _ = roots
    assert confine(str(root / "a.wav"), [root]) == root.resolve() / "a.wav"
    assert confine("sub/b.mp4", [root]) == root.resolve() / "sub" / "b.mp4", "relative to the first root"
    assert confine(str(root), [root]) == root.resolve() and count_files(root.resolve(), [root], 10) == 2
    os.symlink(root / "a.wav", root / "link-inside.wav")
    assert confine(str(root / "link-inside.wav"), [root]) == root.resolve() / "link-inside.wav"


def test_outside_dotdot_and_symlinks_out_are_refused_with_a_reason(roots):
    root, outside = roots
    assert "outside the allowed input roots" in _refused(str(outside / "secret.wav"), [root], 403)
    assert "'..'" in _refused(f"{root}/../outside/secret.wav", [root], 403)
    assert "'..'" in _refused("sub/../../outside/secret.wav", [root], 403)
    os.symlink(outside / "secret.wav", root / "escape.wav")
    assert "symlink" in _refused(str(root / "escape.wav"), [root], 403)
    os.symlink(outside, root / "escape-dir")
    assert "symlink" in _refused(str(root / "escape-dir" / "secret.wav"), [root], 403)
    (root / "mixed").mkdir()
    (root / "mixed" / "ok.wav").write_bytes(b"x")
    os.symlink(outside / "secret.wav", root / "mixed" / "sneaky.wav")
    with pytest.raises(ApiError) as caught:
        count_files(root / "mixed", [root], 10)
    assert caught.value.status == 403 and "sneaky.wav" in caught.value.message, "a symlink inside a directory"
    assert "accepts no jobs" in _refused(str(root / "a.wav"), [], 403)


def test_malformed_paths_are_422_and_missing_ones_fail_alone_later(roots):
    root, _ = roots
    assert confine(str(root / "missing.wav"), [root]) == root.resolve() / "missing.wav", (
        "like the command line"
    )
    assert _refused("", [root], 422)
    assert "Unicode" in _refused("bad-\udcff.wav", [root], 422)


def test_the_walk_stops_one_file_past_the_limit(tmp_path):
    # Given 50 folders of one media file each
    root = tmp_path / "root"
    for i in range(50):
        (root / f"d{i:02d}").mkdir(parents=True)
        (root / f"d{i:02d}" / "talk.wav").write_bytes(b"x")
    seen = []
    real_scandir = os.scandir

    def counting_scandir(path):
        seen.append(path)
        return real_scandir(path)

    os.scandir = counting_scandir
    try:
        with pytest.raises(ApiError) as caught:
            count_files(root, [root], 3)
    finally:
        os.scandir = real_scandir
    # Then the walk stopped at the fourth file (limit + 1): 413, and 45 folders were never listed
    assert caught.value.status == 413 and caught.value.code == "too_many_files"
    assert len(seen) == 5, seen  # the root and four folders were listed


def test_the_http_answer_says_why(tmp_path, roots):
    root, outside = roots
    server = start_in_thread(Settings(server_dir=tmp_path / "server", port=0, input_roots=[root]))
    try:
        refused = httpx.post(f"{server.url}/v1/jobs", json={"paths": [str(outside / "secret.wav")]})
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "path_outside_roots"
        assert httpx.post(f"{server.url}/v1/jobs", json={"paths": []}).status_code == 400
        assert httpx.post(f"{server.url}/v1/jobs", json={"paths": [""]}).status_code == 422
        assert httpx.get(f"{server.url}/v1/jobs/..%2F..%2Fetc").status_code == 404
        assert not list((tmp_path / "server" / "jobs").iterdir()), "no job was created"
    finally:
        server.stop()


@pytest.mark.slow
def test_a_job_survives_a_server_restart_and_its_result_has_the_transcript(tmp_path):
    root = tmp_path / "videos"
    root.mkdir()
    shutil.copy(MEDIA / "speech.wav", root / "speech.wav")
    settings = Settings(
        server_dir=tmp_path / "server", port=0, input_roots=[root], embedding_profile="embedded", device="cpu"
    )
    # Given a job submitted to a server that stops while the job runs
    first = start_in_thread(settings)
    try:
        with Client(first.url) as api:
            job = api.submit_job("speech.wav", vocabulary=["Stella"])
            assert job.status == "queued" and job.paths == [str((root / "speech.wav").resolve())]
            assert job.vocabulary == ["Stella"]
            deadline = time.monotonic() + 300
            while api.job(job.id).stage != "asr" and time.monotonic() < deadline:
                time.sleep(0.1)
            running = api.job(job.id)
            assert running.status == "running" and running.inputs[0].stages["audio"] == "ok", (
                "per-input progress"
            )
    finally:
        first.stop()
    on_disk = load_model(tmp_path / "server" / "jobs" / job.id / "job.json", JobRecord)
    assert on_disk.status == "queued", "a stopped server leaves its job to resume"

    # When a new server starts on the same directory
    second = start_in_thread(settings)
    try:
        with Client(second.url) as api:
            done = api.wait(job.id, timeout=600)
            # Then the job completes, with per-input progress, a report and the transcript
            assert done.status == "done", done.error
            assert done.inputs[0].status == "ok" and done.inputs[0].stages.get("embeddings") in (
                "ok",
                "reused",
            )
            assert done.report is not None and done.report.ok == 1
            assert done.runs == 2
            assert done.inputs[0].stages["audio"] == "reused", (
                "the restarted job resumed instead of starting over"
            )
            result = api.result(job.id, embeddings=True)
            item = result.inputs[0]
            assert item.status == "ok" and item.transcript is not None
            # the job's vocabulary took the run's hotwords' path: decoded before every window, recorded
            use = item.transcript.vocabulary
            assert use is not None and use.hotwords == ["Stella"] and use.applied == "Stella"
            assert wer(SPEECH_TEXT, item.text) <= MAX_WER, item.text
            assert item.embeddings.count == len(item.transcript.segments) == len(item.vectors)
            assert len(item.vectors[0]) == item.embeddings.dimension == 384
            assert (tmp_path / "server" / "jobs" / job.id / "out" / "speech" / "transcript.srt").exists()
    finally:
        second.stop()


@pytest.mark.slow
def test_result_of_an_unfinished_job_is_409(tmp_path):
    root = tmp_path / "videos"
    root.mkdir()
    shutil.copy(MEDIA / "speech.wav", root / "speech.wav")
    server = start_in_thread(
        Settings(
            server_dir=tmp_path / "server",
            port=0,
            input_roots=[root],
            embedding_profile="embedded",
            device="cpu",
        )
    )
    try:
        with Client(server.url) as api:
            job = api.submit_job(str(root))
            with pytest.raises(ApiError) as caught:
                api.result(job.id)
            assert caught.value.status == 409
    finally:
        server.stop()


def test_submissions_are_bounded_in_paths_and_files_413(tmp_path):
    root = tmp_path / "root"
    (root / "many").mkdir(parents=True)
    for i in range(4):
        (root / "many" / f"{i}.wav").write_bytes(b"x")
    server = start_in_thread(
        Settings(server_dir=tmp_path / "server", port=0, input_roots=[root], job_max_paths=2, job_max_files=3)
    )
    try:
        paths = httpx.post(f"{server.url}/v1/jobs", json={"paths": [f"many/{i}.wav" for i in range(3)]})
        assert paths.status_code == 413 and paths.json()["error"]["code"] == "too_many_paths"
        files = httpx.post(f"{server.url}/v1/jobs", json={"paths": ["many"]})
        assert files.status_code == 413 and files.json()["error"]["code"] == "too_many_files"
        assert not list((tmp_path / "server" / "jobs").iterdir()), "no job was created"
        accepted = httpx.post(f"{server.url}/v1/jobs", json={"paths": ["many/0.wav", "many/1.wav"]})
        assert accepted.status_code == 202, accepted.text
    finally:
        server.stop()


def test_progress_is_appended_not_rewritten_and_reading_a_job_takes_no_lock(tmp_path):
    from orchestrator.api.jobs import PROGRESS_FILE, JobQueue

    root = tmp_path / "root"
    root.mkdir()
    for i in range(50):
        (root / f"{i:02d}.wav").write_bytes(b"x")
    settings = Settings(server_dir=tmp_path / "server", input_roots=[root])
    queue = JobQueue(settings)  # not started: nothing runs the job, the test plays the job thread
    job = queue.submit([str(root)])
    record_file = tmp_path / "server" / "jobs" / job.id / "job.json"
    written = (record_file.stat().st_ino, record_file.read_bytes())
    # When every input finishes two stages
    for item in job.inputs:
        for stage in ("audio", "asr"):
            queue._item(job.id, item.id, stage, "ok", None)
    queue._progress(job.id, {"stage": "asr", "chunk": 1})
    # Then the record file was not rewritten: one line per event was appended beside it
    assert (record_file.stat().st_ino, record_file.read_bytes()) == written
    lines = (tmp_path / "server" / "jobs" / job.id / PROGRESS_FILE).read_text().splitlines()
    assert len(lines) == 50 * 2 + 1
    # And a reader sees the progress without the lock, even while another thread holds it
    with queue._cond:
        seen = queue.get(job.id)
    assert seen.stage == "asr" and all(i.stages == {"audio": "ok", "asr": "ok"} for i in seen.inputs)
    # And a restarted server finds the same progress (the lines applied over the record)
    again = JobQueue(settings)
    try:
        # the runner thread waits for the lock: what start() recovered, before the job runs again
        with again._cond:
            again.start()
            recovered = again.get(job.id)
        assert recovered.inputs == seen.inputs and recovered.stage == "asr"
    finally:
        again.close()


def test_a_progress_line_torn_by_a_kill_does_not_swallow_the_next_one(tmp_path):
    from orchestrator.api.jobs import PROGRESS_FILE, JobQueue

    root = tmp_path / "root"
    root.mkdir()
    (root / "a.wav").write_bytes(b"x")
    settings = Settings(server_dir=tmp_path / "server", input_roots=[root])
    queue = JobQueue(settings)
    job = queue.submit([str(root / "a.wav")])
    progress = tmp_path / "server" / "jobs" / job.id / PROGRESS_FILE
    # Given a server killed mid-line
    queue._item(job.id, job.inputs[0].id, "audio", "ok", None)
    with open(progress, "a") as fh:
        fh.write('{"item": "a", "stage": "as')
    # When the next server starts and the job appends again
    again = JobQueue(settings)
    try:
        with again._cond:  # the runner thread waits: the test plays the job thread
            again.start()
            again._item(job.id, job.inputs[0].id, "asr", "ok", None)
            # Then the torn line stands alone and the new one reads back whole
            lines = progress.read_text().splitlines()
            assert lines[-1].startswith('{"item"') and '"stage": "asr"' in lines[-1]
            assert lines[-2].endswith('"as')
            assert again.get(job.id).inputs[0].stages == {"audio": "ok", "asr": "ok"}
    finally:
        again.close()


def test_get_job_answers_while_the_job_lock_is_held(tmp_path, roots):
    root, _ = roots
    server = start_in_thread(Settings(server_dir=tmp_path / "server", port=0, input_roots=[root]))
    try:
        jobs = server.app.state.jobs
        with jobs._cond:  # what the job thread does while it writes a record
            job_id = next(iter(jobs._records), None)
            missing = httpx.get(f"{server.url}/v1/jobs/nope-123", timeout=30)
            health = httpx.get(f"{server.url}/health", timeout=30)
        assert job_id is None and missing.status_code == 404 and health.status_code == 200
    finally:
        server.stop()
