"""The console of `bin/pipeline process`, run as a user runs it (real children, not a terminal)."""

from __future__ import annotations

import re

import pytest

from stages.runtime.noise import KNOWN_WARNINGS
from tests.conftest import MEDIA
from tests.scenarios.test_cli import pipeline

#: what the known-harmless library output looked like in a child log before it was handled at the source
KNOWN_NOISE = (
    "torchcodec is not installed correctly",
    "list_audio_backends has been deprecated",
    "Lightning automatically upgraded your loaded checkpoint",
    "Applied quirks",
    "Performing voice activity detection",
    "Could not download Pipeline from",
    "No modules.json found",
)


@pytest.fixture(scope="module")
def first(tmp_path_factory):
    out = tmp_path_factory.mktemp("out")
    return pipeline("process", str(MEDIA / "speech.mp4"), "--output", str(out)), out


@pytest.mark.slow
def test_the_readme_first_command_prints_a_short_console_with_the_substitutions(first):
    done, _ = first
    assert done.returncode == 0, done.stderr[-3000:]
    lines = (done.stdout + done.stderr).splitlines()
    assert len(lines) <= 15, "\n".join(lines)
    # the substitutions a user must not miss, one line each
    notes = [line for line in lines if line.startswith("NOTE ")]
    assert any(
        line.startswith("NOTE embeddings: asked for 'speed' (BAAI/bge-small-en-v1.5), used the embedded")
        for line in notes
    ), lines
    # words are timed offline now (Whisper cross-attention): no alignment substitution to note
    assert not any(line.startswith("NOTE alignment") for line in notes), notes
    assert len(notes) == len(set(notes))
    # the children's own lines stay in their log files
    assert not [
        line for line in lines if re.search(r"\[(audio|asr|diarization|alignment|embeddings)\]", line)
    ]
    assert not [line for line in lines if any(noise in line for noise in KNOWN_NOISE)]


@pytest.mark.slow
def test_known_library_noise_is_handled_in_the_children(first):
    _, out = first
    [run_dir] = (out / ".runs").iterdir()
    logs = {path.name: path.read_text() for path in run_dir.glob("*.log")}
    assert {name.split("-")[1] for name in logs} >= {"audio", "asr", "diarization", "alignment", "embeddings"}
    for noise in KNOWN_NOISE:  # at most one line per run (none here), never one per child
        assert sum(text.count(noise) for text in logs.values()) <= 1, noise
    # the children's own lines are there: the logs are quiet, not empty
    assert "asr: speech done in" in "".join(logs.values())


@pytest.mark.slow
def test_verbose_streams_the_children_and_quiet_prints_the_summary_only(first, tmp_path):
    _, out = first
    quiet = pipeline("process", str(MEDIA / "speech.mp4"), "--output", str(out), "-q")
    assert quiet.returncode == 0, quiet.stderr[-3000:]
    assert "Progress:" not in quiet.stderr and "1 ok, 0 failed" in quiet.stderr
    verbose = pipeline(
        "process",
        str(MEDIA / "speech.mp4"),
        "--output",
        str(tmp_path / "v"),
        "-v",
        "--no-speakers",
        "--embedding-profile",
        "embedded",
    )
    assert verbose.returncode == 0, verbose.stderr[-3000:]
    assert "[asr] stages.runtime.base: asr: speech done in" in verbose.stderr


def test_every_known_warning_is_narrowed_to_a_module():
    for category, message, module in KNOWN_WARNINGS:
        assert issubclass(category, Warning) and message and module, "no blanket filters"


def _cli(*args: str):
    import subprocess
    import sys

    from tests.conftest import ROOT

    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
    )


def test_usage_help_and_version_read_like_a_command():
    from importlib.metadata import version

    assert _cli("--version").stdout.strip() == f"pipeline (isostage) {version('isostage')}"
    for command in ("process", "enroll", "serve", "gpu", "report"):
        text = _cli(command, "--help").stdout
        assert text.startswith(f"Usage: pipeline {command} "), text[:200]
        assert not re.search(r"\s\.(\s|$)", text), f"stray ' .' in {command} --help"
        if command != "report":  # (report has no setting)
            assert "[env " in text, "the env names are shown, not eaten as markup"


def test_batch_size_flags_take_auto_or_a_positive_number():
    bad = _cli("process", "x.mp4", "--asr-batch-size", "banana")
    assert bad.returncode == 2 and "neither a positive number nor 'auto'" in bad.stderr


def test_serve_keeps_its_state_in_a_per_user_directory(monkeypatch, tmp_path):
    from orchestrator.settings import Settings

    monkeypatch.delenv("PIPELINE_SERVER_DIR", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    assert Settings().server_dir == tmp_path / "state" / "isostage" / "server"
    monkeypatch.delenv("XDG_STATE_HOME")
    assert Settings().server_dir.is_relative_to(__import__("pathlib").Path.home())
