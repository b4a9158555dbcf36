"""Speaker artifacts validate on write and on read."""

from __future__ import annotations

import json

import pytest

from contracts import (
    ArtifactError,
    DiarizationArtifact,
    SpeakerEmbeddingsArtifact,
    SpeakerMatch,
    VoiceProfile,
    load_model,
    save_model,
)

UNIT = [0.6, 0.8]


def profile(**kw) -> VoiceProfile:
    fields = dict(
        item_id="Host",
        fingerprint="fp",
        name="Host",
        encoder="campplus",
        encoder_model="campplus:/w.pt",
        dimension=2,
        embedding=UNIT,
        threshold=0.6,
        clips=[{"path": "/a.wav", "sha256": "0" * 64, "duration_s": 2.0, "embedding": [1.0, 0.0]}],
    )
    return VoiceProfile(**(fields | kw))


def test_voice_profile_round_trip_records_encoder_and_threshold(tmp_path):
    save_model(profile(), tmp_path / "Host.json")
    back = load_model(tmp_path / "Host.json", VoiceProfile)
    assert (back.name, back.encoder, back.threshold, back.embedding) == ("Host", "campplus", 0.6, UNIT)


@pytest.mark.parametrize(
    "bad", [{"embedding": [1.0, 1.0]}, {"embedding": [1.0]}, {"threshold": 1.5}, {"clips": []}]
)
def test_invalid_profiles_are_refused(bad):
    with pytest.raises(ValueError):
        profile(**bad)


def test_a_profile_edited_into_an_invalid_one_is_refused_on_read(tmp_path):
    path = save_model(profile(), tmp_path / "Host.json")
    data = json.loads(path.read_text())
    data["embedding"] = [2.0, 0.0]
    path.write_text(json.dumps(data))
    with pytest.raises(ArtifactError, match="L2-normalised"):
        load_model(path, VoiceProfile)


def diarization(turns) -> DiarizationArtifact:
    return DiarizationArtifact(
        item_id="d",
        fingerprint="fp",
        source="/d.mp4",
        turns=turns,
        model="embedded:x",
        requested_model="auto",
        device="cpu",
        duration_s=10.0,
    )


def test_diarization_turns_are_sorted_labelled_and_positive():
    art = diarization(
        [{"start": 0, "end": 1, "speaker": "SPEAKER_00"}, {"start": 1, "end": 2, "speaker": "SPEAKER_01"}]
    )
    assert art.speakers == ["SPEAKER_00", "SPEAKER_01"]
    for bad in (
        [{"start": 1, "end": 1, "speaker": "SPEAKER_00"}],
        [{"start": 0, "end": 1, "speaker": "Host"}],
        [{"start": 2, "end": 3, "speaker": "SPEAKER_00"}, {"start": 0, "end": 1, "speaker": "SPEAKER_01"}],
    ):
        with pytest.raises(ValueError):
            diarization(bad)


def test_one_enrolled_name_names_one_speaker_only():
    fields = dict(
        item_id="d",
        fingerprint="fp",
        source="/d.mp4",
        sidecar="s.npy",
        sha256="0" * 64,
        encoder="campplus",
        encoder_model="m",
        dimension=2,
        turn_rows=[],
        profiles=["Host"],
        device="cpu",
        batch_size=4,
    )
    SpeakerEmbeddingsArtifact(**fields, matches=[SpeakerMatch(speaker="SPEAKER_00", seconds=1, name="Host")])
    with pytest.raises(ValueError, match="one speaker"):
        SpeakerEmbeddingsArtifact(
            **fields,
            matches=[
                SpeakerMatch(speaker="SPEAKER_00", seconds=1, name="Host"),
                SpeakerMatch(speaker="SPEAKER_01", seconds=1, name="Host"),
            ],
        )
