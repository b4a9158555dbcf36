"""Voice profiles and enrollment matching on real voices (the reference turns as diarization)."""

from __future__ import annotations

import pytest

from contracts import (
    DiarizationArtifact,
    SpeakerEmbeddingsArtifact,
    SpeakerTurn,
    StageRequest,
    VoiceProfile,
    WorkItem,
    load_artifact,
    save_model,
)
from stages.audio import AudioStage
from stages.enrollment import EnrollmentStage, load_profiles, match_speakers
from stages.voice_profile import VoiceProfileStage
from tests.conftest import MEDIA, stage_settings

SPEAKERS = MEDIA / "speakers"
DIALOGUES = ("host_guest", "host_stranger")
#: the RTTM's names as diarization clusters
CLUSTERS = {"Host": "SPEAKER_00", "Guest": "SPEAKER_01", "Stranger": "SPEAKER_01"}


def request(tmp_path, stage: str, items, batch_size=4, **settings) -> StageRequest:
    return StageRequest(
        request_id=f"r-{stage}",
        stage=stage,
        module=f"stages.{stage}",
        items=items,
        batch_size=batch_size,
        device="cpu",
        settings=stage_settings(stage, **settings),
        result_path=str(tmp_path / f"{stage}-result.json"),
    )


@pytest.fixture(scope="module")
def profiles(tmp_path_factory):
    """Host enrolled from two clips, Guest from one: sentences that occur in no dialogue."""
    tmp = tmp_path_factory.mktemp("profiles")
    clips = {"Host": ["host_enroll_1.wav", "host_enroll_2.wav"], "Guest": ["guest_enroll_1.wav"]}
    items = [
        WorkItem(
            id=name,
            inputs={f"clip{i}": str(SPEAKERS / c) for i, c in enumerate(files)},
            output=str(tmp / f"{name}.json"),
            fingerprint="fp",
        )
        for name, files in clips.items()
    ]
    stage = VoiceProfileStage()
    for item in items:  # one request per name, as `pipeline enroll` does
        result = stage.run(request(tmp, "voice_profile", [item], name=item.id, encoder="campplus"))
        assert result.items[0].ok, result.items
    return tmp


@pytest.fixture(scope="module")
def matched(profiles, tmp_path_factory):
    """Each dialogue's reference turns as its diarization, matched against the profiles in one child run."""
    tmp = tmp_path_factory.mktemp("enroll")
    items = []
    for name in DIALOGUES:
        AudioStage().run(
            request(
                tmp,
                "audio",
                [
                    WorkItem(
                        id=name,
                        inputs={"source": str(SPEAKERS / f"{name}.mp4")},
                        output=str(tmp / name / "audio.json"),
                        fingerprint="fp",
                    )
                ],
            )
        )
        turns = []
        for line in (SPEAKERS / f"{name}.rttm").read_text().splitlines():
            f = line.split()
            turns.append(
                SpeakerTurn(start=float(f[3]), end=float(f[3]) + float(f[4]), speaker=CLUSTERS[f[7]])
            )
        save_model(
            DiarizationArtifact(
                item_id=name,
                fingerprint="fp",
                source=name,
                turns=turns,
                model="reference",
                requested_model="reference",
                device="cpu",
                duration_s=20.0,
            ),
            tmp / name / "diarization.json",
        )
        items.append(
            WorkItem(
                id=name,
                inputs={
                    "diarization": str(tmp / name / "diarization.json"),
                    "audio": str(tmp / name / "audio.json"),
                },
                output=str(tmp / name / "speaker_embeddings.json"),
                fingerprint="fp-e",
            )
        )
    stage, seen = EnrollmentStage(), []
    write = stage._write_in_flight
    stage._write_in_flight = lambda req, in_flight: (seen.append(in_flight.ids), write(req, in_flight))
    req = request(tmp, "enrollment", items, encoder="campplus", profiles_dir=str(profiles))
    result = stage.run(req.model_copy(update={"inflight_path": str(tmp / "inflight.json")}))
    assert all(r.ok for r in result.items), result.items
    assert list(DIALOGUES) in seen, seen  # both dialogues' turns embedded in one stream
    out = {
        n: load_artifact(tmp / n / "speaker_embeddings.json", SpeakerEmbeddingsArtifact) for n in DIALOGUES
    }
    alone = {}
    for item in items:  # each dialogue in a request of its own: the same vectors
        moved = item.model_copy(update={"output": str(tmp / item.id / "alone.json")})
        assert (
            EnrollmentStage()
            .run(request(tmp, "enrollment", [moved], encoder="campplus", profiles_dir=str(profiles)))
            .items[0]
            .ok
        )
        alone[item.id] = load_artifact(moved.output, SpeakerEmbeddingsArtifact)
    return {"packed": out, "alone": alone, "dir": tmp} | out


def test_turns_of_several_inputs_share_batches_and_give_the_same_vectors(matched):
    import numpy as np

    for name in DIALOGUES:
        packed, alone = matched["packed"][name], matched["alone"][name]
        np.testing.assert_allclose(
            np.load(matched["dir"] / name / packed.sidecar),
            np.load(matched["dir"] / name / alone.sidecar),
            atol=1e-5,
        )
        assert [(m.speaker, m.name) for m in packed.matches] == [(m.speaker, m.name) for m in alone.matches]


def test_profile_holds_the_mean_of_its_clips_and_the_encoder_used(profiles):
    import numpy as np

    host = load_artifact(profiles / "Host.json", VoiceProfile)
    assert host.name == "Host" and host.encoder == "campplus" and host.encoder_model.startswith("campplus:")
    assert host.dimension == 192 and len(host.clips) == 2 and host.threshold == 0.6
    mean = np.mean([c.embedding for c in host.clips], axis=0)
    np.testing.assert_allclose(host.embedding, mean / np.linalg.norm(mean), atol=1e-5)
    assert all(c.path.endswith(".wav") and c.duration_s > 1.5 for c in host.clips)


def test_enrolled_voices_are_named_in_a_dialogue_they_were_not_enrolled_from(matched):
    names = {m.speaker: m.name for m in matched["host_guest"].matches}
    assert names == {"SPEAKER_00": "Host", "SPEAKER_01": "Guest"}
    for m in matched["host_guest"].matches:
        assert m.similarity >= m.threshold


def test_a_stranger_is_given_no_enrolled_name(matched):
    matches = {m.speaker: m for m in matched["host_stranger"].matches}
    assert matches["SPEAKER_00"].name == "Host"
    stranger = matches["SPEAKER_01"]
    assert stranger.name is None and stranger.similarity < stranger.threshold


def test_every_long_turn_is_embedded_in_batches(matched):
    art = matched["host_guest"]
    assert art.turn_rows == [0, 1, 2, 3] and art.batch_size == 4 and art.dimension == 192
    assert art.profiles == ["Guest", "Host"] and art.encoder == "campplus"


def _profile(name: str, vector, threshold=0.6) -> VoiceProfile:
    import numpy as np

    v = (np.asarray(vector, float) / np.linalg.norm(vector)).tolist()
    return VoiceProfile(
        item_id=name,
        fingerprint="fp",
        name=name,
        encoder="campplus",
        encoder_model="m",
        dimension=2,
        embedding=v,
        threshold=threshold,
        clips=[{"path": "/x.wav", "sha256": "0" * 64, "duration_s": 1.0, "embedding": v}],
    )


def test_each_name_goes_to_the_most_similar_speaker_only():
    host = _profile("Host", [1, 0])
    matches = {
        m.speaker: m
        for m in match_speakers({"A": ([1, 0.1], 3.0), "B": ([1, 0.3], 2.0), "C": ([0, 1], 1.0)}, [host])
    }
    assert matches["A"].name == "Host" and matches["B"].name is None and matches["C"].name is None
    assert matches["B"].similarity > 0.9, "B passes the threshold, but A is closer to Host"
    assert match_speakers({"A": ([1, 0], 1.0)}, [])[0].profile is None


def test_profiles_of_another_encoder_are_left_out(tmp_path):
    save_model(_profile("Host", [1, 0]), tmp_path / "Host.json")
    (tmp_path / "broken.json").write_text("{")
    assert [p.name for p in load_profiles(str(tmp_path), "campplus")] == ["Host"]
    assert load_profiles(str(tmp_path), "ecapa") == []
