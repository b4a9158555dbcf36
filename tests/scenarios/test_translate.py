"""``--translate`` through a real run: the English track beside the original for an input not in English, with
its speakers; none for an English input; translation is part of the fingerprints of what it makes."""

from __future__ import annotations

import re

import pytest

from contracts import TranscriptArtifact, load_artifact
from orchestrator import Orchestrator, Settings
from tests.conftest import MEDIA

LANGUAGES = MEDIA / "languages"


@pytest.mark.slow
def test_a_run_with_translate_writes_the_english_track_beside_the_original(tmp_path):
    out = tmp_path / "out"
    settings = Settings(
        _env_file=None, output_dir=out, asr_model="whisper-base", embedding_profile="embedded"
    )
    inputs = [LANGUAGES / "es.ogg", LANGUAGES / "en.ogg"]
    with Orchestrator(settings) as orch:
        assert orch.process(inputs).ok == 2
    assert not list(out.glob("*/transcript.en.*"))
    # When the same inputs are processed again with --translate
    with Orchestrator(settings.replace(asr_translate=True)) as orch:
        plan = orch.plan(inputs)
        report = orch.process(inputs)
    assert report.ok == 2
    # Then the translation redid ASR and what follows it, not the audio
    redo = {stage.stage: stage.redo for stage in plan.stages}
    assert redo["asr"] == redo["alignment"] == 2 and redo["diarization"] == 0, plan
    spanish, english = out / "es", out / "en"
    for name in ("json", "srt", "vtt", "txt", "html"):
        assert (spanish / f"transcript.en.{name}").is_file(), name
    assert not list(english.glob("transcript.en.*")), "an English input is not decoded twice"
    original = load_artifact(spanish / "transcript.json", TranscriptArtifact)
    translated = load_artifact(spanish / "transcript.en.json", TranscriptArtifact)
    assert original.language == "es" and translated.language == "en"
    assert "morning" in " ".join(s.text for s in translated.segments).lower()
    # the same speakers on both tracks (as the files show them: corpus speakers)
    assert all(s.speaker for s in translated.segments)

    def shown(name: str) -> set[str]:
        return set(re.findall(r"\[([^\]]+)\]", (spanish / name).read_text()))

    assert shown("transcript.en.srt") and shown("transcript.en.srt") <= shown("transcript.srt")
    assert {s.speaker for s in translated.segments} <= shown("transcript.srt")
    assert 'href="transcript.en.html"' in (spanish / "transcript.html").read_text()
    # When they are processed again without --translate (ASR is redone): no English track is left behind
    with Orchestrator(settings) as orch:
        assert orch.process(inputs).ok == 2
    assert not list(spanish.glob("transcript.en.*"))
    assert "transcript.en." not in (spanish / "transcript.html").read_text()
