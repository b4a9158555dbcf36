"""Alignment offline (recorded, fast) and the merge of speakers into the final transcript."""

from __future__ import annotations

import time

import pytest

from contracts import (
    DiarizationArtifact,
    Segment,
    SpeakerEmbeddingsArtifact,
    SpeakerTurn,
    StageRequest,
    TranscriptArtifact,
    Word,
    WorkItem,
    load_artifact,
    save_model,
)
from stages.alignment import AlignmentStage, assign_speakers, drop_non_speech, speaker_at, split_at_speakers
from stages.audio import AudioStage
from tests.conftest import MEDIA, stage_settings

EMPTY_SHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
TURNS = [
    SpeakerTurn(start=0.0, end=4.0, speaker="SPEAKER_00"),
    SpeakerTurn(start=4.5, end=8.0, speaker="SPEAKER_01"),
]


def test_a_segment_gets_the_speaker_it_overlaps_most():
    assert speaker_at(0.5, 3.0, TURNS) == "SPEAKER_00"
    assert speaker_at(3.0, 7.0, TURNS) == "SPEAKER_01", "1 s of SPEAKER_00, 2.5 s of SPEAKER_01"
    assert speaker_at(4.1, 4.4, TURNS) == "SPEAKER_00", "in a gap: the nearest turn"
    assert speaker_at(20.0, 21.0, TURNS) is None, "far from every turn: nobody"


def test_names_replace_cluster_labels_and_words_decide_the_segment():
    segments = [
        Segment(id=0, start=0.0, end=3.5, text="hello there"),
        Segment(
            id=1,
            start=3.0,
            end=8.0,
            text="a b c",
            words=[
                Word(word="a", start=3.0, end=3.9),
                Word(word="b", start=4.6, end=6.0),
                Word(word="c", start=6.0, end=7.5),
                Word(word="d"),
            ],
        ),
    ]
    out = assign_speakers(segments, TURNS, {"SPEAKER_00": "Host"})
    assert out[0].speaker == "Host"
    assert [w.speaker for w in out[1].words] == ["Host", "SPEAKER_01", "SPEAKER_01", None]
    assert out[1].speaker == "SPEAKER_01"
    assert assign_speakers(segments, [], {})[0].speaker is None


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("align")
    AudioStage().run(
        StageRequest(
            request_id="a",
            stage="audio",
            module="stages.audio",
            batch_size=1,
            device="cpu",
            result_path=str(tmp / "a.json"),
            settings=stage_settings("audio"),
            items=[
                WorkItem(
                    id="s",
                    inputs={"source": str(MEDIA / "speech.wav")},
                    output=str(tmp / "audio.json"),
                    fingerprint="fp",
                )
            ],
        )
    )
    save_model(
        TranscriptArtifact(
            item_id="s",
            fingerprint="fp-asr",
            source="speech.wav",
            language="en",
            model="m",
            requested_model="embedded",
            device="cpu",
            compute_type="int8",
            batch_size=1,
            duration_s=10.0,
            segments=[
                Segment(id=0, start=0.0, end=3.5, text="The quick brown fox."),
                Segment(id=1, start=5.0, end=7.5, text="She sells sea shells."),
            ],
        ),
        tmp / "asr.json",
    )
    save_model(
        DiarizationArtifact(
            item_id="s",
            fingerprint="fp",
            source="speech.wav",
            turns=TURNS,
            model="embedded:x",
            requested_model="auto",
            device="cpu",
            duration_s=10.0,
        ),
        tmp / "diarization.json",
    )
    save_model(
        SpeakerEmbeddingsArtifact(
            item_id="s",
            fingerprint="fp",
            source="speech.wav",
            sidecar="x.npy",
            sha256=EMPTY_SHA256,
            encoder="campplus",
            encoder_model="campplus:/w.pt",
            dimension=192,
            turn_rows=[],
            profiles=["Host"],
            device="cpu",
            batch_size=4,
            matches=[
                {
                    "speaker": "SPEAKER_00",
                    "seconds": 4.0,
                    "profile": "Host",
                    "similarity": 0.9,
                    "threshold": 0.6,
                    "name": "Host",
                },
                {
                    "speaker": "SPEAKER_01",
                    "seconds": 3.5,
                    "profile": "Host",
                    "similarity": 0.3,
                    "threshold": 0.6,
                },
            ],
        ),
        tmp / "speaker_embeddings.json",
    )
    (tmp / "x.npy").write_bytes(b"")
    return tmp


def _run(tmp, keys, **settings) -> TranscriptArtifact:
    item = WorkItem(
        id="s",
        inputs={k: str(tmp / f"{k}.json") for k in keys},
        output=str(tmp / "transcript.json"),
        fingerprint="fp-final",
    )
    result = AlignmentStage().run(
        StageRequest(
            request_id="r",
            stage="alignment",
            module="stages.alignment",
            batch_size=1,
            device="cpu",
            settings=stage_settings("alignment", **settings),
            items=[item],
            result_path=str(tmp / "r.json"),
        )
    )
    assert result.items[0].ok, result.items
    return load_artifact(tmp / "transcript.json", TranscriptArtifact)


def test_offline_alignment_is_recorded_as_not_done_without_waiting(inputs, monkeypatch, tmp_path):
    """Given no aligner on disk and HF_HUB_OFFLINE=1, the stage keeps segment times, says why, and does not
    wait for a download; diarization and enrollment still name the speakers."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))  # an empty torch hub: the aligner is not there
    t0 = time.monotonic()
    # and the transcript's ASR model "m" is nowhere either (no cross-attention alignment by Whisper instead)
    final = _run(
        inputs,
        ["asr", "audio", "diarization", "speaker_embeddings"],
        align=True,
        speakers=True,
        asr_model="m",
    )
    assert time.monotonic() - t0 < 60
    assert final.aligned is False and final.aligner is None and "not downloaded" in final.alignment_note
    assert [s.speaker for s in final.segments] == ["Host", "SPEAKER_01"]
    assert final.diarization == "embedded:x" and final.speaker_encoder == "campplus:/w.pt"
    assert final.fingerprint == "fp-final" and final.model == "m", "the ASR facts are kept"


def test_without_diarization_the_transcript_says_why_there_are_no_speakers(inputs):
    final = _run(inputs, ["asr", "audio"], align=False, speakers=True)
    assert [s.speaker for s in final.segments] == [None, None]
    assert "diarization did not run" in final.speakers_note and final.alignment_note.startswith(
        "alignment off"
    )
    plain = _run(inputs, ["asr", "audio"], align=False, speakers=False)
    assert plain.speakers_note is None


def test_skipped_enrollment_keeps_cluster_labels_and_says_so(inputs):
    final = _run(
        inputs, ["asr", "audio", "diarization"], align=False, speakers=True, skip_voice_embeddings=True
    )
    assert [s.speaker for s in final.segments] == ["SPEAKER_00", "SPEAKER_01"]
    assert "SKIP_VOICE_EMBEDDINGS" in final.speakers_note and final.speaker_encoder is None


def test_a_segment_whose_words_change_speaker_is_split_at_the_change():
    seg = Segment(
        id=0,
        start=0.0,
        end=8.0,
        text="Thanks for joining. Yes, hello.",
        words=[
            Word(word="Thanks", start=0.0, end=0.5),
            Word(word="for", start=0.5, end=0.8),
            Word(word="joining.", start=0.8, end=3.5),
            Word(word="Yes,", start=4.6, end=5.0),
            Word(word="hello.", start=5.0, end=5.6),
            Word(word="um"),
        ],
    )
    out = split_at_speakers(assign_speakers([seg], TURNS, {"SPEAKER_00": "Host"}))
    assert [(s.id, s.speaker, s.text, s.start, s.end) for s in out] == [
        (0, "Host", "Thanks for joining.", 0.0, 3.5),
        (1, "SPEAKER_01", "Yes, hello. um", 4.6, 5.6),
    ]
    assert all({w.speaker for w in s.words} <= {s.speaker, None} for s in out)
    one = Segment(
        id=0,
        start=0.0,
        end=1.0,
        text="a b",
        words=[Word(word="a", start=0.0, end=0.5, speaker="X"), Word(word="b", speaker=None)],
    )
    assert split_at_speakers([one]) == [one], "one speaker: the segment as it was"


def test_segments_outside_the_decoded_speech_are_dropped_and_counted():
    segs = [
        Segment(
            id=0, start=0.0, end=2.0, text="hello", words=[Word(word="hello", start=0.2, end=1.0, score=0.9)]
        ),
        Segment(
            id=1, start=5.0, end=5.1, text="you", words=[Word(word="you", start=5.0, end=5.1, score=0.9)]
        ),
    ]
    kept, dropped = drop_non_speech(segs, [(0.0, 2.0)])
    assert ([s.text for s in kept], [s.id for s in kept], dropped) == (["hello"], [0], 1)


@pytest.mark.slow
def test_offline_words_are_timed_by_the_asr_models_cross_attention(inputs, monkeypatch, tmp_path):
    """No wav2vec2 on disk: the embedded Whisper model that "wrote" the transcript times its words."""
    from stages.whisper.models import embedded_model_path
    from tests.conftest import SPEECH_TEXT

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    audio = load_artifact(inputs / "audio.json", __import__("contracts").AudioArtifact)
    save_model(
        TranscriptArtifact(
            item_id="s",
            fingerprint="fp-asr",
            source="speech.wav",
            language="en",
            model=str(embedded_model_path()),
            requested_model="embedded",
            device="cpu",
            compute_type="int8",
            batch_size=1,
            duration_s=audio.duration_s,
            speech=[(0.0, audio.duration_s)],
            segments=[Segment(id=0, start=0.0, end=audio.duration_s, text=SPEECH_TEXT)],
        ),
        tmp_path / "asr.json",
    )
    item = WorkItem(
        id="s",
        inputs={"asr": str(tmp_path / "asr.json"), "audio": str(inputs / "audio.json")},
        output=str(tmp_path / "transcript.json"),
        fingerprint="fp-final",
    )
    result = AlignmentStage().run(
        StageRequest(
            request_id="r",
            stage="alignment",
            module="stages.alignment",
            batch_size=2,
            device="cpu",
            items=[item],
            result_path=str(tmp_path / "r.json"),
            settings=stage_settings("alignment", align=True, speakers=False),
        )
    )
    assert result.items[0].ok, result.items
    final = load_artifact(tmp_path / "transcript.json", TranscriptArtifact)
    assert (
        final.aligned and final.aligner == "whisper-cross-attention:embedded" and final.alignment_note is None
    )
    words = final.segments[0].words
    assert [w.word for w in words] == SPEECH_TEXT.split()
    starts = [w.start for w in words]
    assert starts == sorted(starts) and all(w.start <= w.end and 0 < w.score <= 1 for w in words)
    # the words spread over the speech (espeak says the three sentences in ~10 s), not piled up at one end
    assert words[0].start < 1.0 and words[-1].end > audio.duration_s - 2.0 and starts[len(starts) // 2] > 2.0
    assert sum(w.score for w in words) / len(words) > 0.5
