"""POST /v1/audio/transcriptions in OpenAI's shape, through the official ``openai`` client, against one real
server (embedded models, no speakers): each response format, the size limit and admission by expected wait."""

from __future__ import annotations

import shutil
import time

import httpx
import openai
import pytest

from orchestrator.api.server import start_in_thread
from orchestrator.settings import Settings
from tests.conftest import MAX_WER, MEDIA, SPEECH_TEXT, wer

pytestmark = pytest.mark.slow  # each transcription is a real job: audio, ASR, alignment, embeddings children


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


def test_json_and_text(client, server):
    answer = _create(client)
    assert wer(SPEECH_TEXT, answer.text) <= MAX_WER, answer.text
    text = _create(
        client, response_format="text", language="en", prompt="Stella, snow peas, slabs of blue cheese."
    )
    assert isinstance(text, str) and wer(SPEECH_TEXT, text) <= MAX_WER, text
    jobs = server.app.state.jobs
    assert not list(jobs.directory.iterdir()), "a transcription's upload and outputs go once it is answered"


def test_verbose_json_with_words_and_segments(client):
    answer = _create(client, response_format="verbose_json", timestamp_granularities=["word", "segment"])
    assert answer.language == "en" and 10 < answer.duration < 13
    assert answer.segments and answer.words and wer(SPEECH_TEXT, answer.text) <= MAX_WER
    assert all(s.end >= s.start for s in answer.segments) and answer.segments[0].compression_ratio > 0
    assert all(w.end >= w.start for w in answer.words)
    assert answer.model_extra.get("speakers") == [], "speakers is this server's extra field (none here)"
    words_only = _create(client, response_format="verbose_json", timestamp_granularities=["word"])
    assert words_only.words and words_only.segments is None


@pytest.mark.parametrize("response_format", ["srt", "vtt"])
def test_subtitles(client, response_format):
    captions = _create(client, response_format=response_format)
    assert isinstance(captions, str) and "-->" in captions
    assert captions.startswith("WEBVTT") == (response_format == "vtt")


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
