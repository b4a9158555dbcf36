"""A speaker on each channel (``PIPELINE_CHANNELS``), through ``bin/pipeline`` with real children and the
embedded models: stereo recordings made from the committed speech (tests/fixtures/generate.py:
``channel_recordings``). One ``auto`` run over a two-speaker recording, a stereo copy and its mono source;
one ``separate`` run with diarization on; one transcription through the API's ``channels`` field; the dry
runs tell what a change of the settings redoes."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import openai
import pytest

from contracts import AudioArtifact, TranscriptArtifact, load_artifact
from orchestrator.api.server import start_in_thread
from orchestrator.corpus.captions import CaptionRules
from orchestrator.corpus.export import load_sources
from orchestrator.settings import Settings
from tests.conftest import normalise, pipeline
from tests.fixtures.generate import CALLER_TEXT, channel_recordings

pytestmark = pytest.mark.slow

#: words each side's reference holds that the embedded tiny.en gets on its own (the other side's never)
LEFT_WORDS = ("roof", "summers", "nobody")
RIGHT_WORDS = ("weather", "morning", "newspaper")
NAMES = "agent,customer"


def _words(text: str) -> set[str]:
    return set(normalise(text).split())


@pytest.fixture(scope="module")
def recordings(tmp_path_factory) -> dict[str, Path]:
    return channel_recordings(tmp_path_factory.mktemp("recordings"))


@pytest.fixture(scope="module")
def auto_run(tmp_path_factory, recordings):
    """``--channels auto`` over the two-speaker recording, the stereo copy and the mono source (the decoded
    audio kept, to read the audio stage's decision)."""
    base = tmp_path_factory.mktemp("auto")
    inputs = base / "in"
    inputs.mkdir()
    for name in ("two_speakers", "copy", "mono"):
        shutil.copy(recordings[name], inputs / f"{name}.wav")
    out = base / "out"
    args = [str(inputs), "--output", str(out), "--no-speakers", "--offline"]
    args += ["--channels", "auto", "--channel-names", NAMES]
    done = pipeline("process", *args, env=_env())
    assert done.returncode == 0, done.stderr[-3000:]
    return out, args


def _env(**extra: str) -> dict[str, str]:
    import os

    return {**os.environ, "ASR_MODEL": "embedded", "PIPELINE_KEEP_AUDIO": "true", **extra}


def _audio(out: Path, item: str) -> AudioArtifact:
    return load_artifact(next((out / item).rglob("audio.json")), AudioArtifact)


def _transcript(out: Path, item: str) -> TranscriptArtifact:
    return load_artifact(out / item / "transcript.json", TranscriptArtifact)


def _channel_text(transcript: TranscriptArtifact, channel: int) -> str:
    return " ".join(s.text for s in transcript.segments if s.channel == channel)


def test_auto_separates_one_speaker_per_channel_and_mixes_a_stereo_copy(auto_run):
    out, _ = auto_run
    two = _audio(out, "in/two_speakers")
    assert two.channel_decision.startswith("separated") and [t.channel for t in two.channel_tracks] == [0, 1]
    assert two.channel_measure.correlation < 0.5 and two.sidecar == "audio.npy"
    copy = _audio(out, "in/copy")
    assert copy.channel_tracks == [] and "go together" in copy.channel_decision, copy.channel_decision
    assert _audio(out, "in/mono").channel_decision is None  # one channel: nothing to decide


def test_each_channel_is_its_own_speaker_with_its_own_words(auto_run):
    out, _ = auto_run
    transcript = _transcript(out, "in/two_speakers")
    left, right = _words(_channel_text(transcript, 0)), _words(_channel_text(transcript, 1))
    assert all(w in left for w in LEFT_WORDS) and not any(w in left for w in RIGHT_WORDS), left
    assert all(w in right for w in RIGHT_WORDS) and not any(w in right for w in LEFT_WORDS), right
    names = {0: "agent", 1: "customer"}
    for seg in transcript.segments:
        assert seg.speaker == names[seg.channel], seg
        assert all(w.speaker == seg.speaker for w in seg.words or []), seg
    starts = [s.start for s in transcript.segments]
    assert starts == sorted(starts), "segments in time order, the channels' merged"
    assert len(_words(CALLER_TEXT) & left) >= 0.6 * len(_words(CALLER_TEXT)), left


def test_speech_at_the_same_time_on_both_channels_is_shown_as_overlap(auto_run):
    """The right side speaks from 2.5 s over the left: in segments.jsonl each side's segment names the other,
    and the customer's words said while the agent speaks carry the agent as overlap (what the JSON export
    writes); the page and captions name both."""
    out, _ = auto_run
    rows = [
        json.loads(line) for line in (out / "in" / "two_speakers" / "segments.jsonl").read_text().splitlines()
    ]
    by_speaker = {row["speaker"]: row for row in rows}
    assert set(by_speaker) == {"agent", "customer"}, rows
    assert {(row["speaker"], row["channel"]) for row in rows} == {("agent", 0), ("customer", 1)}, rows
    assert any(row.get("overlap") == ["customer"] for row in rows if row["speaker"] == "agent"), rows
    assert any(row.get("overlap") == ["agent"] for row in rows if row["speaker"] == "customer"), rows
    shown = load_sources(out / "in" / "two_speakers", "in/two_speakers", CaptionRules()).transcript
    customer_words = [w for seg in shown.segments if seg.speaker == "customer" for w in seg.words]
    assert any(w.overlap == ["agent"] for w in customer_words), customer_words
    page = (out / "in" / "two_speakers" / "transcript.html").read_text()
    captions = (out / "in" / "two_speakers" / "transcript.srt").read_text()
    assert "agent" in page and "customer" in page
    assert "[agent]" in captions and "[customer]" in captions, captions
    report = json.loads((out / "run-report.json").read_text())
    (two,) = [i for i in report["inputs"] if i["id"] == "in/two_speakers"]
    assert two["overlap_s"] > 1.0, two


def test_a_stereo_copy_under_auto_is_transcribed_as_its_mono_source(auto_run):
    out, _ = auto_run
    copy, mono = _transcript(out, "in/copy"), _transcript(out, "in/mono")
    text = [" ".join(s.text for s in t.segments) for t in (copy, mono)]
    assert normalise(text[0]) == normalise(text[1]) and text[1], text
    assert all(s.channel is None and s.speaker is None for s in copy.segments)


def test_the_setting_redoes_exactly_the_stages_it_changes(auto_run):
    """The same settings: nothing to redo. Another mode: the audio stage and all after it. Other names:
    the alignment and what follows, ASR's transcripts kept (the audio is redone only as scratch)."""
    out, args = auto_run
    same = _plan(args)
    assert "3 complete, 0 with work to do" in same and "to redo:" not in same, same
    mixed = _plan([*args, "--channels", "mix"])
    assert re.search(r"^asr \[.*\]: 0 to reuse, 3 to redo$", mixed, re.M), mixed
    assert "asr: 3 to redo: its input (audio) is redone" in mixed, mixed
    renamed = _plan([*args, "--channel-names", "left,right"])
    assert re.search(r"^asr \[.*\]: 3 to reuse, 0 to redo$", renamed, re.M), renamed
    assert re.search(r"^alignment \[.*\]: 0 to reuse, 3 to redo$", renamed, re.M), renamed
    assert re.search(r"^embeddings \[.*\]: 0 to reuse, 3 to redo$", renamed, re.M), renamed


def _plan(args: list[str]) -> str:
    done = pipeline("process", *args, "--dry-run", env=_env())
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_separate_with_diarization_on_names_each_channel_with_its_default_name(tmp_path, recordings):
    out = tmp_path / "out"
    args = [str(recordings["two_speakers"]), "--output", str(out), "--offline", "--channels", "separate"]
    done = pipeline("process", *args, env=_env(PIPELINE_CHANNEL_NAMES=""))
    assert done.returncode == 0, done.stderr[-3000:]
    transcript = _transcript(out, "two_speakers")
    assert transcript.diarization is not None, "diarization ran"
    assert {(s.channel, s.speaker) for s in transcript.segments} == {(0, "channel 1"), (1, "channel 2")}
    assert all(w in _words(_channel_text(transcript, 1)) for w in RIGHT_WORDS)
    assert "channels separated" in transcript.speakers_note


def test_the_api_takes_the_channels_form_field(tmp_path, recordings):
    running = start_in_thread(
        Settings(
            server_dir=tmp_path / "state",
            port=0,
            input_roots=[tmp_path],
            device="cpu",
            speakers=False,
            asr_model="embedded",
            embedding_profile="embedded",
            channel_names=["agent", "customer"],
            export_formats=["txt"],
        )
    )
    try:
        with openai.OpenAI(base_url=f"{running.url}/v1", api_key="unused", max_retries=0) as client:
            with open(recordings["two_speakers"], "rb") as audio:
                answer = client.audio.transcriptions.create(
                    file=("call.wav", audio),
                    model="whisper-1",
                    response_format="verbose_json",
                    timestamp_granularities=["word", "segment"],
                    extra_body={"channels": "separate"},
                )
            with pytest.raises(openai.BadRequestError) as caught:
                with open(recordings["two_speakers"], "rb") as audio:
                    client.audio.transcriptions.create(
                        file=("call.wav", audio), model="whisper-1", extra_body={"channels": "both"}
                    )
    finally:
        running.stop()
    assert answer.model_extra["speakers"] == ["agent", "customer"], answer.model_extra
    said = {w.model_extra["speaker"]: set() for w in answer.words}
    for w in answer.words:
        said[w.model_extra["speaker"]] |= _words(w.word)
    assert all(w in said["agent"] for w in LEFT_WORDS) and all(w in said["customer"] for w in RIGHT_WORDS)
    assert caught.value.body["param"] == "channels"
