"""whisperX ASR with the embedded Whisper tiny.en, loaded once for the module."""

from __future__ import annotations

import pytest

from contracts import StageRequest, TranscriptArtifact, WorkItem, load_artifact
from contracts.errors import ModelUnavailableError
from stages.asr import AsrStage, embedded_model_path, resolve_model
from stages.audio import STAGE as AUDIO
from tests.conftest import MAX_WER, SPEECH_TEXT, wer, stage_settings

pytestmark = pytest.mark.slow


def _request(tmp_path, audio_json, batch_size=4, **settings) -> StageRequest:
    return StageRequest(
        request_id="r", stage="asr", module="stages.asr", batch_size=batch_size, device="cpu",
        settings=stage_settings("asr", **settings), result_path=str(tmp_path / "res.json"),
        items=[WorkItem(id="s", inputs={"audio": str(audio_json)}, output=str(tmp_path / "transcript.json"),
                        fingerprint="fp-asr")],
    )


@pytest.fixture(scope="module")
def audio_json(tmp_path_factory, media):
    tmp = tmp_path_factory.mktemp("audio")
    AUDIO.import_libraries()
    AUDIO.run(StageRequest(request_id="a", stage="audio", module="stages.audio", batch_size=1,
                           result_path=str(tmp / "r.json"), settings=stage_settings("audio"),
                           items=[WorkItem(id="s", inputs={"source": str(media / "speech.wav")},
                                           output=str(tmp / "audio.json"), fingerprint="fp")]))
    return tmp / "audio.json"


def test_embedded_model_resolves_inside_its_wheel():
    path, english_only = resolve_model("embedded")
    assert path == str(embedded_model_path()) and english_only
    assert (embedded_model_path() / "model.bin").is_file()
    assert resolve_model("distil-large-v3") == ("distil-large-v3", False)


def test_transcribes_the_spoken_words_and_records_what_ran(tmp_path, audio_json):
    result = AsrStage().run(_request(tmp_path, audio_json, batch_size=4))
    assert result.items[0].ok, result.items[0].error
    transcript = load_artifact(tmp_path / "transcript.json", TranscriptArtifact)
    text = " ".join(s.text for s in transcript.segments)
    assert wer(SPEECH_TEXT, text) < MAX_WER, text
    assert transcript.model == str(embedded_model_path()) and transcript.requested_model == "embedded"
    assert (transcript.device, transcript.compute_type, transcript.batch_size) == ("cpu", "int8", 4)
    assert transcript.fingerprint == "fp-asr" and transcript.aligned is False and transcript.language == "en"
    assert 0 <= transcript.segments[0].start < transcript.segments[-1].end <= transcript.duration_s + 0.5
    assert result.load_s > 0 and result.compute_s > 0


def test_unavailable_model_is_a_clear_error_offline(tmp_path, audio_json, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelUnavailableError, match="cannot load ASR model 'no-such-model'"):
        AsrStage().run(_request(tmp_path, audio_json, model="no-such-model"))
