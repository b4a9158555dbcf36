"""End to end on a real telephone conversation: pyannote.audio's sample (30 s, two speakers, rapid exchanges,
words said over each other), run once through ``pipeline process`` offline. The captions keep the subtitle
rules a viewer checks (tests/caption_rules.py, with the run's notes), which synthetic voices never test."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.corpus.captions import CaptionRules
from tests.caption_rules import check, parse
from tests.conftest import ROOT


def _sample() -> Path:
    import pyannote.audio

    return Path(pyannote.audio.__file__).parent / "sample" / "sample.wav"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    sample = _sample()
    if not sample.exists():
        pytest.skip("pyannote.audio's sample.wav is not installed")
    out = tmp_path_factory.mktemp("conversation")
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "process", str(sample), "--output", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done, out


@pytest.mark.slow
@pytest.mark.parametrize("name", ["transcript.srt", "transcript.vtt"])
def test_real_conversation_captions_keep_the_rules_or_the_notes_count_them(run, name):
    _, out = run
    assert check(out / "sample" / name) == []


@pytest.mark.slow
def test_rapid_exchanges_get_no_flash_cues(run):
    # Given the rapid exchanges of a real call, then no cue flashes by: each stays the minimum at least
    # (joined with its neighbour, as a two-speaker cue where two speak, or appearing earlier)
    _, out = run
    rules = CaptionRules()
    shown = [
        (end - start, lines) for start, end, lines in parse((out / "sample" / "transcript.srt").read_text())
    ]
    assert shown
    assert min(d for d, _ in shown) >= rules.min_s - 0.0015, shown
    # and the last cue ends with the audio at the latest
    duration = json.loads((out / "sample" / "transcript.json").read_text())["duration_s"]
    assert parse((out / "sample" / "transcript.srt").read_text())[-1][1] <= duration + 0.0015


@pytest.mark.slow
def test_the_run_notes_count_the_cues_the_words_come_too_fast_for(run):
    done, out = run
    report = json.loads((out / "run-report.json").read_text())
    notes = [n for n in report["inputs"][0]["notes"] if n.startswith("captions: ")]
    assert len(notes) <= 1  # one note summarizing the count, never one per cue
    page = (out / "sample" / "transcript.html").read_text()
    for note in notes:
        assert note.split(":")[1].split(" of ")[0].strip().isdigit()
        assert note.split(" cue")[0] in page
