"""Inputs and outputs at fsspec URLs: fetched before the first stage, uploaded when an input finishes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import fsspec
import pytest

from contracts import TranscriptArtifact
from contracts.errors import InputError
from orchestrator import Orchestrator, Settings
from orchestrator.run.plan import MEDIA_SUFFIXES, expand_inputs, item_ids
from orchestrator.run.progress import Progress
from orchestrator.run.remote import expand_url, fetch, is_url, redact, url_identity, url_suffix
from tests.conftest import ROOT
from tests.fixtures.generate import clips


@pytest.fixture
def memfs():
    fs = fsspec.filesystem("memory")
    fs.store.clear()
    fs.pseudo_dirs[:] = [""]
    yield fs
    fs.store.clear()


def test_urls_are_told_from_paths():
    assert is_url("s3://bucket/a.mp4") and is_url("sftp://host/dir") and is_url("file:///tmp/a.wav")
    assert not is_url("/tmp/a.wav") and not is_url("talk: part 1.mp4") and not is_url(Path("s3://x"))
    assert url_suffix("s3://b/talks/Day 1.MP4?versionId=3") == ".mp4"


def test_a_url_directory_gives_its_media_files_and_ids_come_from_their_names(memfs):
    memfs.pipe({"/in/b.wav": b"x", "/in/sub/a.mp4": b"y", "/in/notes.txt": b"z"})
    found = expand_url("memory://in", MEDIA_SUFFIXES)
    assert found == ["memory://in/b.wav", "memory://in/sub/a.mp4"]
    assert item_ids(found) == ["b", "a"]
    assert expand_inputs(["memory://in/missing.wav"]) == ["memory://in/missing.wav"]


def test_fetch_is_atomic_and_a_missing_url_is_a_one_line_input_error(memfs, tmp_path):
    memfs.pipe("/in/a.wav", b"RIFF....")
    assert fetch("memory://in/a.wav", tmp_path / "w" / "source.wav").read_bytes() == b"RIFF...."
    with pytest.raises(InputError, match=r"could not fetch memory://in/gone.wav: FileNotFoundError") as err:
        fetch("memory://in/gone.wav", tmp_path / "w" / "gone.wav")
    assert "\n" not in str(err.value)
    assert sorted(p.name for p in (tmp_path / "w").iterdir()) == ["source.wav"]  # no partial file left


def test_passwords_in_urls_are_redacted():
    assert redact("sftp://me:pa:ss@host:22/x/a.mp4") == "sftp://me:***@host:22/x/a.mp4"
    assert redact("s3://bucket/key.mp4") == "s3://bucket/key.mp4"
    assert redact("sftp://me@host/x") == "sftp://me@host/x"


def test_url_identity_changes_when_the_object_changes(memfs):
    memfs.pipe("/in/a.wav", b"one")
    before = url_identity("memory://in/a.wav")
    memfs.pipe("/in/a.wav", b"longer")
    assert url_identity("memory://in/a.wav") != before
    assert url_identity("memory://in/none.wav").startswith("unreadable:")


@pytest.mark.slow
def test_url_inputs_and_outputs_end_to_end_with_a_bad_url_failing_alone(memfs, tmp_path):
    local = clips(tmp_path / "clips", 2, seconds=2.5)
    memfs.pipe("/in/clip000.wav", local[0].read_bytes())
    sources = ["memory://in/clip000.wav", f"file://{local[1]}", "memory://in/missing.wav"]
    settings = Settings(output_url="memory://out", staging_dir=tmp_path / "staging", speakers=False,
                        embedding_profile="embedded", device="cpu")
    with Orchestrator(settings) as orch:
        report = orch.process(sources, progress=Progress())
    # the two readable inputs are done, the missing one failed alone with a one-line reason
    assert (report.ok, report.failed) == (2, 1)
    bad = next(i for i in report.inputs if i.id == "missing")
    assert bad.failed_stage == "fetch" and bad.error.startswith("could not fetch memory://in/missing.wav")
    assert {i.source for i in report.inputs} == set(sources)
    # outputs and artifacts were uploaded per input, plus the report
    for item in ("clip000", "clip001"):
        names = {Path(p).name for p in memfs.ls(f"/out/{item}", detail=False)}
        assert {"transcript.json", "transcript.srt", "embeddings.npy", "segments.jsonl"} <= names
        transcript = TranscriptArtifact.model_validate_json(memfs.cat(f"/out/{item}/transcript.json"))
        assert " ".join(s.text for s in transcript.segments).strip()
    uploaded = json.loads(memfs.cat("/out/run-report.json"))
    assert uploaded["run_id"] == report.run_id
    assert next(i for i in report.inputs if i.id == "clip000").outputs["transcript.srt"] == "memory://out/clip000/transcript.srt"
    # the fetched copy was scratch: gone after success
    assert not list((tmp_path / "staging").rglob("source.wav"))

    # a rerun resumes from the staging directory: no stage runs again, and a lost upload is redone
    memfs.rm("/out/clip000/transcript.srt")
    with Orchestrator(settings) as orch:
        again = orch.process(sources[:2], progress=Progress())
    assert again.ok == 2 and not again.stages
    assert memfs.exists("/out/clip000/transcript.srt")


@pytest.fixture
def s3(monkeypatch):
    """A real S3 endpoint (moto's server) on 127.0.0.1, reached through s3fs like any bucket."""
    pytest.importorskip("s3fs", reason="the remote group is not installed (uv sync --group remote)")
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": f"http://{host}:{port}"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    fs = fsspec.filesystem("s3", skip_instance_cache=True)
    fs.mkdir("media")
    yield fs, env
    server.stop()


@pytest.mark.slow
def test_s3_inputs_and_outputs_through_the_cli(s3, tmp_path):
    fs, env = s3
    for clip in clips(tmp_path / "clips", 2, seconds=2.5):
        fs.put_file(str(clip), f"media/in/{clip.name}")
    fs.pipe("media/in/notes.wav", b"this is text, not audio")
    staging = tmp_path / "staging"
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "process", "s3://media/in/", "--output", "s3://media/out",
         "--no-speakers", "--embedding-profile", "embedded", "--device", "cpu"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={**os.environ, **env, "PIPELINE_STAGING_DIR": str(staging)})
    # exit 1: one input failed, alone, with a one-line reason; the others are in the bucket
    assert done.returncode == 1, done.stderr[-3000:]
    assert "FAILED s3://media/in/notes.wav: [audio]" in done.stderr
    fs.invalidate_cache()
    for item in ("clip000", "clip001"):
        assert fs.exists(f"media/out/{item}/transcript.srt") and fs.exists(f"media/out/{item}/embeddings.npy")
        assert "-->" in fs.cat(f"media/out/{item}/transcript.srt").decode()
    report = json.loads(fs.cat("media/out/run-report.json"))
    assert (report["ok"], report["failed"]) == (2, 1)
    assert {i["source"] for i in report["inputs"]} == {f"s3://media/in/{n}" for n in
                                                        ("clip000.wav", "clip001.wav", "notes.wav")}


class _PasswordServer:
    """asyncssh server callbacks: one user, one password."""

    def __new__(cls):
        import asyncssh

        class Server(asyncssh.SSHServer):
            def begin_auth(self, username):
                return True

            def password_auth_supported(self):
                return True

            def validate_password(self, username, password):
                return username == "pipeline" and password in ("s3cret", "n3w-s3cret")

        return Server()


@pytest.fixture
def sftp_root(tmp_path):
    """A real SFTP server (asyncssh) on 127.0.0.1 serving this machine's files; the URL prefix to reach tmp_path."""
    asyncssh = pytest.importorskip("asyncssh", reason="the remote group is not installed (uv sync --group remote)")
    import asyncio
    import threading

    loop = asyncio.new_event_loop()
    started = threading.Event()
    holder = {}

    async def serve():
        key = asyncssh.generate_private_key("ssh-ed25519")
        holder["server"] = await asyncssh.listen("127.0.0.1", 0, server_host_keys=[key], sftp_factory=True,
                                                 server_factory=_PasswordServer)
        holder["port"] = holder["server"].sockets[0].getsockname()[1]
        started.set()

    thread = threading.Thread(target=lambda: (loop.run_until_complete(serve()), loop.run_forever()), daemon=True)
    thread.start()
    assert started.wait(30)
    yield f"sftp://pipeline:s3cret@127.0.0.1:{holder['port']}{tmp_path}"
    loop.call_soon_threadsafe(holder["server"].close)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


@pytest.mark.slow
def test_sftp_inputs_and_outputs_through_the_cli(sftp_root, tmp_path):
    clips(tmp_path / "remote" / "in", 1, seconds=2.5)
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "process", f"{sftp_root}/remote/in/", "--output",
         f"{sftp_root}/remote/out", "--no-speakers", "--embedding-profile", "embedded", "--device", "cpu",
         "-v"],  # every log line on the console: the password must be in none of them
        cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PIPELINE_STAGING_DIR": str(tmp_path / "staging")})
    assert done.returncode == 0, done.stderr[-3000:]
    out = tmp_path / "remote" / "out"
    assert "-->" in (out / "in" / "clip000" / "transcript.srt").read_text()
    report = json.loads((out / "run-report.json").read_text())
    assert report["ok"] == 1 and report["inputs"][0]["source"].startswith("sftp://pipeline:***@127.0.0.1:")
    assert "s3cret" not in json.dumps(report) and "s3cret" not in done.stderr  # nor in the log
    # issue 23, case 7: nothing the run keeps holds the password (index, journal, children's logs, perf log)
    for path in [*(tmp_path / "staging").rglob("*"), *out.rglob("*")]:
        if path.is_file():
            assert b"s3cret" not in path.read_bytes(), path
    # and a password change is the same source: same id, nothing redone
    again = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "process", f"{sftp_root.replace('s3cret', 'n3w-s3cret')}/remote/in/",
         "--output", f"{sftp_root.replace('s3cret', 'n3w-s3cret')}/remote/out", "--no-speakers",
         "--embedding-profile", "embedded", "--device", "cpu"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PIPELINE_STAGING_DIR": str(tmp_path / "staging")})
    assert again.returncode == 0, again.stderr[-3000:]
    rerun = json.loads((out / "run-report.json").read_text())
    assert [i["id"] for i in rerun["inputs"]] == ["in/clip000"]
    assert all(s["attempts"] == [] for s in rerun["stages"]), "a new password redoes nothing"
