"""pyannote.audio's real telephone sample (30 s, two speakers, rapid exchanges) through ``pipeline process``
once per ASR runtime, CTranslate2 (the default) and ``ASR_RUNTIME=torch``: the two time the same words a
little differently, and the captions keep the subtitle rules on both (tests/caption_rules.py), with no cue
that flashes by, and name only speakers the transcript's words have."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.corpus.captions import CaptionRules
from orchestrator.corpus.labels import corpus_labels, read_corpus
from tests.caption_rules import check, parse
from tests.conftest import ROOT


def _sample() -> Path:
    import pyannote.audio

    return Path(pyannote.audio.__file__).parent / "sample" / "sample.wav"


@pytest.fixture(scope="module", params=["ctranslate2", "torch"])
def run(request, tmp_path_factory):
    sample = _sample()
    if not sample.exists():
        pytest.skip("pyannote.audio's sample.wav is not installed")
    out = tmp_path_factory.mktemp(f"conversation-{request.param}")
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "process", str(sample), "--output", str(out)]
        + ["--embedding-profile", "embedded"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        # the default model (the test suite's own default is the smaller tiny.en), as a user runs it
        env={**os.environ, "ASR_RUNTIME": request.param, "ASR_MODEL": "whisper-base"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return out / "sample"


@pytest.mark.slow
def test_captions_keep_the_subtitle_rules_on_each_runtime(run):
    assert check(run / "transcript.srt") == []
    assert check(run / "transcript.vtt") == []
    # and no cue flashes by: each stays the minimum at least (joined, or appearing earlier)
    shown = [(end - start, lines) for start, end, lines in parse((run / "transcript.srt").read_text())]
    assert shown and min(d for d, _ in shown) >= CaptionRules().min_s - 0.0015, shown


@pytest.mark.slow
def test_caption_labels_name_only_the_speakers_the_transcript_gives_its_words(run):
    transcript = json.loads((run / "transcript.json").read_text())
    labels = corpus_labels(read_corpus(run.parent)).get(run.name, {})
    said = {
        labels[s][1] if s in labels else s
        for seg in transcript["segments"]
        for s in [seg["speaker"], *(w.get("speaker") for w in seg["words"] or [])]
        if s
    }
    assert said  # the sample has two speakers, and the transcript names them
    for name in ("transcript.srt", "transcript.vtt"):
        shown = set(re.findall(r"^\[([^\]]+)\]", (run / name).read_text(), flags=re.M))
        assert shown and shown <= said, (name, shown, said)
