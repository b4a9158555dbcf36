"""Shared fixtures: committed media files and a word-error-rate helper."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

# The default ASR model is the multilingual Whisper base. Tests that do not test language run the
# smaller English-only tiny.en ("embedded"), set here for this process and every child it starts; the
# language tests (tests/scenarios/test_languages.py) ask for whisper-base themselves.
os.environ.setdefault("ASR_MODEL", "embedded")

ROOT = Path(__file__).resolve().parents[1]
MEDIA = ROOT / "tests" / "fixtures" / "media"
#: what tests/fixtures/make_media.sh has espeak-ng say in speech.wav / speech.mp4
SPEECH_TEXT = (
    "The quick brown fox jumps over the lazy dog. She sells sea shells by the sea shore. "
    "Please call Stella and ask her to bring these things with her from the store."
)
#: what make_media.sh has the two voices say in each committed dialogue (tests/fixtures/media/speakers)
DIALOGUE_TEXT = {
    "host_guest": "Thanks for joining us. What got you interested in mapping old roads? "
    "It started on long walks with my father, who could name every hill we passed. "
    "And how do you find a road that nobody has used for a century? "
    "From the air in a dry summer, the old tracks show up as pale lines in the fields.",
    "host_stranger": "Our next caller has a question about winter gardening. "
    "Yes, hello. I planted garlic in November, and now the leaves are turning yellow. "
    "That happens after a hard frost. Did you cover the beds with straw? "
    "No, I left them bare. I will try straw next year, thank you very much.",
}
#: the command `bin/pipeline` runs, in this interpreter
PIPELINE = [sys.executable, "-m", "orchestrator.cli"]


def pipeline(
    *args: str, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess:
    """``bin/pipeline ARGS...`` run to its end from the project root, its output as text; ``env``: the whole
    environment (default: this process's)."""
    return subprocess.run(
        [*PIPELINE, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env
    )


def process_args(inputs: Path | str, out: Path | str, *options: str) -> list[str]:
    """``bin/pipeline process INPUTS --output OUT OPTIONS...`` as a child process's arguments."""
    return [*PIPELINE, "process", str(inputs), "--output", str(out), *options]


#: Whisper tiny.en on the espeak voice gets ~16 % here ("sells sea shells" is hard);
#: a broken decode/resample or a wrong stream gives ~100 %.
MAX_WER = 0.35


def wait_for(predicate, timeout: float = 300.0, what: str = "condition"):
    """``predicate()``'s first truthy value, polled every 0.1 s; AssertionError naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def normalise(text: str) -> str:
    return " ".join(re.sub(r"[^a-z0-9' ]+", " ", text.lower()).split())


def wer(reference: str, hypothesis: str) -> float:
    import jiwer

    return jiwer.wer(normalise(reference), normalise(hypothesis))


@pytest.fixture(scope="session")
def media() -> Path:
    return MEDIA


@pytest.fixture(autouse=True, scope="session")
def _own_pid_dir(tmp_path_factory):
    """Stage children started by tests (also through subprocesses) register in a test-only pid dir."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PIPELINE_PID_DIR", str(tmp_path_factory.getbasetemp() / "pids"))
        yield


@pytest.fixture(scope="session")
def reference_model():
    """all-MiniLM-L6-v2 loaded in the test process: what the API's worker children must match."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer

    from stages.embeddings import embedded_model_path

    return SentenceTransformer(str(embedded_model_path()), device="cpu")


def stage_settings(stage: str, **fields) -> dict:
    """The settings dump the parent would send ``stage`` for default Settings, with some of the stage's
    own ``fields`` replaced (validated by its model, as in a real run)."""
    from orchestrator.registry import stage_settings as build

    return build(stage, **fields).model_dump(mode="json")


def pytest_sessionfinish(session, exitstatus):
    """Every SRT / WebVTT file the tests wrote (under pytest's base temporary directory) keeps the subtitle
    rules the words allow (tests/caption_rules.py); one that breaks a rule fails the session."""
    from tests.caption_rules import check

    factory = getattr(session.config, "_tmp_path_factory", None)
    if factory is None or getattr(session.config, "workerinput", None) is not None:
        return
    try:
        base = factory.getbasetemp()
    except (OSError, ValueError):
        return
    files = sorted(p for ext in ("*.srt", "*.vtt") for p in base.rglob(ext) if p.is_file())
    problems = [f"{p.relative_to(base)}: {line}" for p in files for line in check(p)]
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"caption rules: {len(files)} caption files checked, {len(problems)} problems")
        for line in problems[:50]:
            reporter.write_line(f"  CAPTION RULE BROKEN {line}", red=True)
    if problems:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture
def s3(monkeypatch):
    """A real S3 endpoint (moto's server) on 127.0.0.1, reached through s3fs like any bucket, with a
    bucket ``media``: (the filesystem, the AWS_* variables that reach it, also set in this process)."""
    pytest.importorskip("s3fs", reason="the remote group is not installed (uv sync --group remote)")
    import fsspec
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": f"http://{host}:{port}",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    # moto's backends live in this process, shared by every server it starts: each test starts empty
    urllib.request.urlopen(urllib.request.Request(f"http://{host}:{port}/moto-api/reset", method="POST"))
    fs = fsspec.filesystem("s3", skip_instance_cache=True)
    type(fs).clear_instance_cache()  # a filesystem cached by an earlier test holds that test's endpoint
    fs.mkdir("media")
    yield fs, env
    server.stop()
