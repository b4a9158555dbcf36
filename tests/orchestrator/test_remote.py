"""Inputs and outputs at fsspec URLs: fetched before the first stage, uploaded when an input finishes."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import fsspec
import pytest

from contracts import TranscriptArtifact
from contracts.errors import InputError
from orchestrator import Orchestrator, Settings
from orchestrator.planning.inputs import MEDIA_SUFFIXES, expand_inputs, item_ids
from orchestrator.remote import FetchLimits, expand_url, fetch, is_url, redact, url_identity, url_suffix
from orchestrator.run.progress import Progress
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


#: the defaults, for fetches that stay within them
LIMITS = FetchLimits.from_settings(Settings())


def test_fetch_is_atomic_and_a_missing_url_is_a_one_line_input_error(memfs, tmp_path):
    memfs.pipe("/in/a.wav", b"RIFF....")
    assert fetch("memory://in/a.wav", tmp_path / "w" / "source.wav", LIMITS).read_bytes() == b"RIFF...."
    with pytest.raises(InputError, match=r"could not fetch memory://in/gone.wav: FileNotFoundError") as err:
        fetch("memory://in/gone.wav", tmp_path / "w" / "gone.wav", LIMITS)
    assert "\n" not in str(err.value)
    assert sorted(p.name for p in (tmp_path / "w").iterdir()) == ["source.wav"]  # no partial file left


# -- a download is bounded in size and time, and cannot hang the run --------------------


#: what the bad server's files hold: 3 MB, over the 1 MB limit the tests set
BIG = 3_000_000


class _BadHabits(BaseHTTPRequestHandler):
    """A real HTTP server with a bad habit per path: ``/stall.wav`` sends its headers (0.5 MB, it says) and
    a few bytes, then nothing; ``/drip.wav`` a byte every 0.2 s; ``/big.wav`` is 3 MB and says so;
    ``/chunked.wav`` is 3 MB and does not say (chunked)."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def _headers(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "audio/wav")
        if self.path.startswith("/chunked"):
            self.send_header("Transfer-Encoding", "chunked")
        else:  # the stalling ones say they are within the limit
            self.send_header("Content-Length", str(BIG if self.path.startswith("/big") else 500_000))
        self.end_headers()

    def do_HEAD(self) -> None:
        self._headers()

    def do_GET(self) -> None:
        release = self.server.release
        self._headers()
        try:
            if self.path.startswith("/stall"):
                self.wfile.write(b"RIFF" + bytes(1000))
                self.wfile.flush()
                release.wait(120)
            elif self.path.startswith("/drip"):
                while not release.wait(0.2):
                    self.wfile.write(b"x")
                    self.wfile.flush()
            elif self.path.startswith("/chunked"):
                for _ in range(BIG // 65536 + 1):
                    self.wfile.write(b"10000\r\n" + bytes(65536) + b"\r\n")
                self.wfile.write(b"0\r\n\r\n")
            else:
                self.wfile.write(bytes(BIG))
        except OSError:  # the client gave up: what this server is for
            pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        pass  # clients that hang up are what it is for


@pytest.fixture
def bad_server():
    """The server's base URL (127.0.0.1, a free port); stalled answers are let go at the end."""
    server = _Server(("127.0.0.1", 0), _BadHabits)
    server.release = threading.Event()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.release.set()
    server.shutdown()
    server.server_close()


#: tiny limits: every bad habit shows within seconds
TIGHT = FetchLimits(
    max_bytes=1_000_000, connect_timeout_s=1.0, read_timeout_s=1.0, floor_s=60.0, per_mb_s=0.0
)


def _fails(url: str, target: Path, limits: FetchLimits = TIGHT) -> tuple[str, float]:
    began = time.monotonic()
    with pytest.raises(InputError) as err:
        fetch(url, target, limits)
    return str(err.value), time.monotonic() - began


def test_a_download_that_stalls_after_its_headers_fails_in_seconds_in_one_line(bad_server, tmp_path):
    # Given a server that sends headers and 1 KB, then nothing, and a URL with a password in it
    url = bad_server.replace("http://", "http://alice:s3cret@") + "/stall.wav"
    # When it is fetched with a read timeout of 1 s
    reason, took = _fails(url, tmp_path / "w" / "source.wav")
    # Then it fails within seconds, in one line, without the password, and leaves nothing behind
    assert reason.startswith("could not fetch http://alice:***@127.0.0.1:")
    assert "stalled" in reason or "timed out" in reason, reason
    assert "\n" not in reason and "s3cret" not in reason
    assert took < 20, took
    assert list((tmp_path / "w").iterdir()) == []


def test_a_read_no_timeout_can_end_is_stopped_by_the_watchdog(tmp_path):
    # Given a "file" whose open() blocks forever (a FIFO nobody writes to): no protocol timeout applies
    fifo = tmp_path / "in" / "talk.wav"
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    # When it is fetched, Then the download process is stopped once no data came for 1 s
    reason, took = _fails(f"file://{fifo}", tmp_path / "w" / "source.wav")
    assert reason == (
        f"could not fetch file://{fifo}: stalled: no data for 1 s, 0.0 MB received "
        "(PIPELINE_REMOTE_READ_TIMEOUT_S)"
    )
    assert took < 20, took
    assert list((tmp_path / "w").iterdir()) == []


def test_a_download_slower_than_its_deadline_fails(bad_server, tmp_path):
    # Given a server that never stalls but sends a byte every 0.2 s, and 3 s for the whole download
    limits = FetchLimits(
        max_bytes=1_000_000, connect_timeout_s=1.0, read_timeout_s=1.0, floor_s=3.0, per_mb_s=0.0
    )
    reason, took = _fails(f"{bad_server}/drip.wav", tmp_path / "w" / "source.wav", limits)
    assert "timed out: not done within 3 s" in reason and "(PIPELINE_REMOTE_DEADLINE_FLOOR_S" in reason, (
        reason
    )
    assert took < 20, took
    assert list((tmp_path / "w").iterdir()) == []


@pytest.mark.parametrize("name", ["big.wav", "chunked.wav"])
def test_a_url_larger_than_the_limit_fails_whether_or_not_it_tells_its_size(bad_server, tmp_path, name):
    # Given 3 MB at the URL (its size told, or not: chunked) and a limit of 1 MB
    reason, _ = _fails(f"{bad_server}/{name}", tmp_path / "w" / "source.wav")
    # Then it fails naming the limit, and nothing half-written is left
    assert reason.endswith("larger than the limit of 1.0 MB (PIPELINE_REMOTE_MAX_BYTES)"), reason
    if name == "big.wav":  # told: refused before downloading
        assert f"it is {BIG / 1e6:.1f} MB" in reason
    assert list((tmp_path / "w").iterdir()) == []


def test_the_remote_limits_are_settings():
    env = {
        "PIPELINE_REMOTE_MAX_BYTES": "1000",
        "PIPELINE_REMOTE_CONNECT_TIMEOUT_S": "2",
        "PIPELINE_REMOTE_READ_TIMEOUT_S": "3",
        "PIPELINE_REMOTE_DEADLINE_FLOOR_S": "4",
        "PIPELINE_REMOTE_DEADLINE_PER_MB_S": "0.5",
    }
    with pytest.MonkeyPatch.context() as mp:
        for name, value in env.items():
            mp.setenv(name, value)
        limits = FetchLimits.from_settings(Settings())
    assert limits == FetchLimits(
        max_bytes=1000, connect_timeout_s=2, read_timeout_s=3, floor_s=4, per_mb_s=0.5
    )
    assert limits.deadline_s(size=10_000_000, received=0) == 9.0  # 4 s + 0.5 s per MB of the told size
    assert limits.deadline_s(size=None, received=20_000_000) == 14.0  # none told: of what came so far
    assert LIMITS.max_bytes == 20 * 1024**3


@pytest.mark.slow
def test_url_inputs_that_stall_or_are_too_large_fail_alone_and_the_run_goes_on(
    bad_server, silent_server, tmp_path
):
    local = clips(tmp_path / "clips", 1, seconds=2.5)[0]
    sources = [
        str(local),
        f"{bad_server}/stall.wav",
        f"{bad_server}/big.wav",
        f"{bad_server}/chunked.wav",
        f"{silent_server}/silent.wav",  # accepts, never answers: planning gives up on it in seconds
    ]
    out = tmp_path / "out"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator.cli",
            "process",
            *sources,
            "--output",
            str(out),
            "--no-speakers",
            "--embedding-profile",
            "embedded",
            "--device",
            "cpu",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={
            **os.environ,
            "PIPELINE_REMOTE_READ_TIMEOUT_S": "1",
            "PIPELINE_REMOTE_CONNECT_TIMEOUT_S": "1",
            "PIPELINE_REMOTE_MAX_BYTES": "1000000",
        },
    )
    # the run finished (exit 1: some inputs failed) with the local input done
    assert done.returncode == 1, done.stderr[-3000:]
    report = json.loads((out / "run-report.json").read_text())
    inputs = {i["source"]: i for i in report["inputs"]}
    assert (report["ok"], report["failed"]) == (1, 4)
    # planning gave up on the silent server within the timeouts, in one line that names them
    said = [line for line in done.stderr.splitlines() if "silent.wav" in line and "PIPELINE_REMOTE_" in line]
    assert said and "timed out" in said[0], done.stderr[-3000:]
    assert inputs[str(local)]["status"] == "ok" and "-->" in (out / "clip000" / "transcript.srt").read_text()
    # each URL failed alone, at the fetch, with a one-line reason
    expected = {
        "stall.wav": ("stalled", "timed out"),
        "big.wav": ("larger than the limit of 1.0 MB",),
        "chunked.wav": ("larger than the limit of 1.0 MB",),
        "silent.wav": ("stalled", "timed out"),
    }
    for name, words in expected.items():
        base = silent_server if name == "silent.wav" else bad_server
        failed = inputs[f"{base}/{name}"]
        assert failed["failed_stage"] == "fetch" and "\n" not in failed["error"], failed
        assert any(word in failed["error"] for word in words), failed["error"]
    # nothing half-written anywhere
    assert not [p for p in out.rglob("*") if p.name.endswith((".partial", ".fetch.json"))]


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
    settings = Settings(
        output_url="memory://out",
        staging_dir=tmp_path / "staging",
        speakers=False,
        embedding_profile="embedded",
        device="cpu",
    )
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
    assert (
        next(i for i in report.inputs if i.id == "clip000").outputs["transcript.srt"]
        == "memory://out/clip000/transcript.srt"
    )
    # the fetched copy was scratch: gone after success
    assert not list((tmp_path / "staging").rglob("source.wav"))

    # a rerun resumes from the staging directory: no stage runs again, and a lost upload is redone
    memfs.rm("/out/clip000/transcript.srt")
    with Orchestrator(settings) as orch:
        again = orch.process(sources[:2], progress=Progress())
    assert again.ok == 2 and not again.stages
    assert memfs.exists("/out/clip000/transcript.srt")


@pytest.mark.slow
def test_s3_inputs_and_outputs_through_the_cli(s3, tmp_path):
    fs, env = s3
    for clip in clips(tmp_path / "clips", 2, seconds=2.5):
        fs.put_file(str(clip), f"media/in/{clip.name}")
    fs.pipe("media/in/notes.wav", b"this is text, not audio")
    staging = tmp_path / "staging"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator.cli",
            "process",
            "s3://media/in/",
            "--output",
            "s3://media/out",
            "--no-speakers",
            "--embedding-profile",
            "embedded",
            "--device",
            "cpu",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **env, "PIPELINE_STAGING_DIR": str(staging)},
    )
    # exit 1: one input failed, alone, with a one-line reason; the others are in the bucket
    assert done.returncode == 1, done.stderr[-3000:]
    assert "FAILED s3://media/in/notes.wav: [audio]" in done.stderr
    fs.invalidate_cache()
    for item in ("in/clip000", "in/clip001"):  # ids mirror the input "folder"
        assert fs.exists(f"media/out/{item}/transcript.srt") and fs.exists(f"media/out/{item}/embeddings.npy")
        assert "-->" in fs.cat(f"media/out/{item}/transcript.srt").decode()
    report = json.loads(fs.cat("media/out/run-report.json"))
    assert (report["ok"], report["failed"]) == (2, 1)
    assert {i["source"] for i in report["inputs"]} == {
        f"s3://media/in/{n}" for n in ("clip000.wav", "clip001.wav", "notes.wav")
    }
    # the catalogue went beside the outputs: another machine (another cache) searches the bucket
    assert fs.find("media/out/.catalogue")
    said = TranscriptArtifact.model_validate_json(fs.cat("media/out/in/clip000/transcript.json"))
    word = max((w.strip(".,!?") for s in said.segments for w in s.text.split()), key=len)
    found = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator.cli",
            "search",
            "s3://media/out",
            word,
            "--mode",
            "words",
            "--json",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **env, "PIPELINE_STAGING_DIR": str(tmp_path / "elsewhere")},
    )
    assert found.returncode == 0, found.stderr[-2000:]
    hits = json.loads(found.stdout)["hits"]
    assert "in/clip000" in {hit["input"] for hit in hits}, hits
    assert all(word.lower() in hit["marked"].lower() for hit in hits), hits
    assert list((tmp_path / "elsewhere" / "catalogues").glob("*/.catalogue/*"))


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
    asyncssh = pytest.importorskip(
        "asyncssh", reason="the remote group is not installed (uv sync --group remote)"
    )
    import asyncio
    import threading

    loop = asyncio.new_event_loop()
    started = threading.Event()
    holder = {}

    async def serve():
        key = asyncssh.generate_private_key("ssh-ed25519")
        holder["server"] = await asyncssh.listen(
            "127.0.0.1", 0, server_host_keys=[key], sftp_factory=True, server_factory=_PasswordServer
        )
        holder["port"] = holder["server"].sockets[0].getsockname()[1]
        started.set()

    thread = threading.Thread(
        target=lambda: (loop.run_until_complete(serve()), loop.run_forever()), daemon=True
    )
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
        [
            sys.executable,
            "-m",
            "orchestrator.cli",
            "process",
            f"{sftp_root}/remote/in/",
            "--output",
            f"{sftp_root}/remote/out",
            "--no-speakers",
            "--embedding-profile",
            "embedded",
            "--device",
            "cpu",
            "-v",
        ],  # every log line on the console: the password must be in none of them
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PIPELINE_STAGING_DIR": str(tmp_path / "staging")},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = tmp_path / "remote" / "out"
    assert "-->" in (out / "in" / "clip000" / "transcript.srt").read_text()
    report = json.loads((out / "run-report.json").read_text())
    assert report["ok"] == 1 and report["inputs"][0]["source"].startswith("sftp://pipeline:***@127.0.0.1:")
    assert "s3cret" not in json.dumps(report) and "s3cret" not in done.stderr  # nor in the log
    # nothing the run keeps holds the password (index, journal, children's logs, perf log)
    for path in [*(tmp_path / "staging").rglob("*"), *out.rglob("*")]:
        if path.is_file():
            assert b"s3cret" not in path.read_bytes(), path
    # and a password change is the same source: same id, nothing redone
    again = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator.cli",
            "process",
            f"{sftp_root.replace('s3cret', 'n3w-s3cret')}/remote/in/",
            "--output",
            f"{sftp_root.replace('s3cret', 'n3w-s3cret')}/remote/out",
            "--no-speakers",
            "--embedding-profile",
            "embedded",
            "--device",
            "cpu",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PIPELINE_STAGING_DIR": str(tmp_path / "staging")},
    )
    assert again.returncode == 0, again.stderr[-3000:]
    rerun = json.loads((out / "run-report.json").read_text())
    assert [i["id"] for i in rerun["inputs"]] == ["in/clip000"]
    assert all(s["attempts"] == [] for s in rerun["stages"]), "a new password redoes nothing"


# -- credentials: never in an identity, an id or anything shown ---------------------------------------------


def test_redact_hides_any_password_and_every_signing_parameter():
    # a password holding "@", ":" or "/" (the last should be %2F; it is still not shown)
    assert redact("sftp://alice:p@ss@host/x") == "sftp://alice:***@host/x"
    assert redact("sftp://alice:p:s@s@host:22/x.wav") == "sftp://alice:***@host:22/x.wav"
    assert redact("sftp://alice:p/s@s@host/x.wav") == "sftp://alice:***@host/x.wav"
    assert redact("sftp://alice:p%40ss@host/x") == "sftp://alice:***@host/x"
    # an address of IPv6 or a path with "@" is not a password
    assert redact("http://[::1]/a@b.wav") == "http://[::1]/a@b.wav"
    assert redact("s3://b/users/a@b.com/x.wav") == "s3://b/users/a@b.com/x.wav"
    signed = "https://h/a.wav?versionId=3&X-Amz-Credential=AKIA%2Fx&X-Amz-Signature=abc&token=t#f"
    assert (
        redact(signed) == "https://h/a.wav?versionId=3&X-Amz-Credential=***&X-Amz-Signature=***&token=***#f"
    )


def test_a_urls_identity_leaves_out_credentials_wherever_they_sit():
    from orchestrator.remote import without_credentials

    aws = "https://b.s3.amazonaws.com/a.wav?X-Amz-Algorithm=A&X-Amz-Date=1&X-Amz-Signature=s&X-Amz-Expires=9"
    gcs = "https://storage.googleapis.com/b/a.wav?X-Goog-Algorithm=A&X-Goog-Credential=c&X-Goog-Signature=s"
    azure = "https://acct.blob.core.windows.net/c/a.wav?sv=2022-11-02&st=1&se=2&sr=b&sp=r&sig=XYZ%3D"
    for url in (aws, gcs, azure, "https://u:p@h/a.wav?access_token=x&api_key=y&key=z"):
        assert "?" not in without_credentials(url) and "@" not in without_credentials(url), url
    # what tells objects apart stays; Azure's "st" alone (no "sig") is not a credential
    assert without_credentials("https://h/a.wav?versionId=3&token=t") == "https://h/a.wav?versionId=3"
    assert without_credentials("https://h/stream.wav?st=30") == "https://h/stream.wav?st=30"
    # the setting adds names (a trailing "*": a prefix)
    from orchestrator.remote import configure

    try:
        configure(Settings(remote_secret_params=["SessionId", "x-my-*"]))
        url = "https://h/a.wav?sessionid=1&X-My-Sig=2&x=3"
        assert without_credentials(url) == "https://h/a.wav?x=3"
        assert redact(url) == "https://h/a.wav?sessionid=***&X-My-Sig=***&x=3"
    finally:
        configure(Settings())
    assert without_credentials(url) == url


def test_fetch_errors_do_not_quote_the_signature(memfs, tmp_path):
    with pytest.raises(InputError) as err:  # the protocol's own error quotes the path, query and all
        fetch("memory://in/gone.wav?token=s3cr3tvalue", tmp_path / "w" / "gone.wav", LIMITS)
    assert "s3cr3tvalue" not in str(err.value) and "token=***" in str(err.value)


@pytest.mark.parametrize("name", ["fsspec.http", "botocore.endpoint", "aiohttp.client", "httpx", "s3fs"])
def test_the_libraries_debug_logs_are_redacted(caplog, name):
    caplog.set_level(logging.DEBUG, logger=name)  # (an earlier test may have quietened that library's logger)
    logging.getLogger(name).debug("open %s", "sftp://alice:p@ss@host/x?X-Amz-Signature=abc")
    logging.getLogger(name).debug("GET https://h/a.wav?token=abc")
    assert "p@ss" not in caplog.text and "abc" not in caplog.text
    assert "sftp://alice:***@host/x?X-Amz-Signature=***" in caplog.text


def test_the_clis_log_lines_are_redacted_whatever_logger_says_them(capsys):
    from orchestrator.cli.common import VERBOSE, setup_logging

    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        setup_logging(VERBOSE)
        logging.getLogger("some.library.deep.child").warning("connecting to %s", "sftp://u:p@ss@host/x")
        err = capsys.readouterr().err
        assert "sftp://u:***@host/x" in err and "p@ss" not in err
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


# -- planning a URL is bounded by the remote timeouts ---------------------------------------------------


@pytest.fixture
def silent_server():
    """A real TCP server on 127.0.0.1 that accepts every connection and never answers; its base URL."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            held.append(conn)

    threading.Thread(target=accept, daemon=True).start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    listener.close()
    for conn in held:
        conn.close()


@pytest.fixture
def remote_defaults():
    """Planning's remote settings back to the defaults after the test (a run's settings stay set)."""
    yield
    from orchestrator import remote

    remote.configure(Settings())


def test_planning_a_url_that_never_answers_gives_up_within_the_remote_timeouts(
    silent_server, memfs, caplog, tmp_path, remote_defaults
):
    from orchestrator.planning.needs import dry_run

    memfs.pipe("/in/good.wav", b"RIFF....")
    settings = Settings(
        remote_connect_timeout_s=1,
        remote_read_timeout_s=1,
        output_dir=tmp_path / "out",
        speakers=False,
        embedding_profile="embedded",
        device="cpu",
    )
    specs = Orchestrator(settings).stage_specs()
    result: dict = {}
    sources = [f"{silent_server}/a.wav", "memory://in/good.wav"]

    def plan() -> None:  # in a thread: a plan that hangs fails this test in seconds, not minutes
        result["plan"] = dry_run(settings, specs, sources, time.monotonic())

    began = time.monotonic()
    worker = threading.Thread(target=plan, daemon=True)
    worker.start()
    worker.join(15)
    took = time.monotonic() - began
    assert not worker.is_alive(), "planning did not give up"
    assert took < 6, took  # one timeout (connect + read), not three calls of 60 s
    assert result["plan"].inputs == 2  # the other input is planned
    # one line says why, naming the settings
    lines = [r.getMessage() for r in caplog.records if silent_server in r.getMessage()]
    assert lines and all("\n" not in line for line in lines)
    assert any("PIPELINE_REMOTE_CONNECT_TIMEOUT_S" in line for line in lines), lines


def test_a_presigned_s3_url_under_a_new_signature_is_the_same_input_and_is_fetched_whole(s3, tmp_path):
    """moto's S3 server: two pre-signed URLs of one object plan to one id and one fingerprint (a rerun
    reuses the work), nothing stored or shown holds the signature, and the fetch sends it. SigV4
    (X-Amz-*) and SigV2 (AWSAccessKeyId, Signature, Expires)."""
    from urllib.parse import parse_qsl, urlsplit

    import boto3
    from botocore.config import Config

    from orchestrator.planning.fingerprints import chain_fingerprints
    from orchestrator.planning.inputs import plan_inputs
    from orchestrator.planning.state import InputState

    fs, env = s3
    fs.pipe("media/talk.wav", b"RIFF" + bytes(5000))
    specs = Orchestrator(Settings(speakers=False, embedding_profile="embedded", device="cpu")).stage_specs()
    for signing in ("s3v4", "s3"):
        client = boto3.client(
            "s3",
            endpoint_url=env["AWS_ENDPOINT_URL"],
            region_name="us-east-1",
            config=Config(signature_version=signing),
        )
        first, second = (
            client.generate_presigned_url(
                "get_object", Params={"Bucket": "media", "Key": "talk.wav"}, ExpiresIn=expires
            )
            for expires in (600, 900)
        )
        # the query's values, but not the short ones (X-Amz-Expires=600), which a hex fingerprint may hold by chance
        secrets = {v for url in (first, second) for _, v in parse_qsl(urlsplit(url).query) if len(v) >= 8} - {
            "host"
        }
        assert first != second and secrets
        out = tmp_path / signing
        planned = []
        for url in (first, second):
            [inp] = [InputState(i) for i in plan_inputs([url], out)]
            chain_fingerprints(inp, specs)
            planned.append(inp)
            stored = (out / ".ids.json").read_text() + inp.shown + json.dumps(inp.fingerprints)
            assert not [v for v in secrets if v in stored], stored
        assert planned[0].id == planned[1].id == "talk"
        assert planned[0].fingerprints == planned[1].fingerprints  # the first stage's work is reused
        assert not planned[0].fingerprints[specs[0].name].startswith("unreadable")
        # the full URL, signature and all, is what is fetched
        got = fetch(second, tmp_path / signing / "w" / "source.wav", LIMITS)
        assert got.read_bytes() == b"RIFF" + bytes(5000)
