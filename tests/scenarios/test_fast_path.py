"""Seed 001's fast path: out of memory in diarization at batch 1 -> the run goes on without speakers;
SKIP_VOICE_EMBEDDINGS skips enrollment. Real children, a real CPU-allocator OOM."""

from __future__ import annotations

import dataclasses
import json

import pytest

from contracts import VoiceProfile, save_model
from orchestrator import Orchestrator, Settings
from tests.conftest import MEDIA

pytestmark = pytest.mark.slow

DIALOGUE = MEDIA / "speakers" / "host_guest.mp4"


class OomDiarizationPipeline(Orchestrator):
    """The real pipeline with the diarization child replaced by one that always runs out of memory."""

    def stage_specs(self):
        return [
            dataclasses.replace(s, module="tests.fixtures.stages_oom_diarization")
            if s.name == "diarization"
            else s
            for s in super().stage_specs()
        ]


@pytest.fixture(scope="module")
def profiles(tmp_path_factory):
    directory = tmp_path_factory.mktemp("profiles")
    vector = [1.0] + [0.0] * 191
    save_model(
        VoiceProfile(
            item_id="Host",
            fingerprint="fp",
            name="Host",
            encoder="campplus",
            encoder_model="m",
            dimension=192,
            embedding=vector,
            threshold=0.6,
            clips=[{"path": "/x.wav", "sha256": "0" * 64, "duration_s": 2.0, "embedding": vector}],
        ),
        directory / "Host.json",
    )
    return directory


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    return tmp_path_factory.mktemp("out")


@pytest.fixture(scope="module")
def fast(out, profiles):
    # seed 001's batch of 4 (DIARIZATION_BATCH_SIZE is 16 by default): out of memory at 4, 2 and 1
    settings = Settings(
        output_dir=out, embedding_profile="embedded", profiles_dir=profiles, diarization_batch_size=4
    )
    with OomDiarizationPipeline(settings) as orch:
        return orch.process([DIALOGUE])


def test_oom_at_batch_1_with_the_fast_path_goes_on_without_speakers(fast, out):
    """Given diarization out of memory at 4, 2 and 1, the input still completes, without speakers."""
    assert (fast.ok, fast.failed) == (1, 0)
    item = fast.inputs[0]
    diarization = item.stages["diarization"]
    assert diarization.status == "skipped" and diarization.retries == 2 and diarization.batch_size == 1
    assert "ran out of memory even at batch size 1" in diarization.error and "fast path" in diarization.error
    assert item.stages["enrollment"].status == "skipped", "no diarization: nothing to match"
    assert item.stages["alignment"].status == item.stages["embeddings"].status == "ok"
    assert any(note.startswith("no speakers from diarization") for note in item.notes)
    attempts = next(r for r in fast.stages if r.stage == "diarization").attempts
    assert [(a.batch_size, a.outcome) for a in attempts] == [(4, "oom"), (2, "oom"), (1, "oom")]
    transcript = json.loads((out / item.id / "transcript.json").read_text())
    assert transcript["segments"] and all(s["speaker"] is None for s in transcript["segments"])
    assert "diarization did not run" in transcript["speakers_note"]
    assert "[" not in (out / item.id / "transcript.srt").read_text()
    report = json.loads((out / "run-report.json").read_text())
    assert report["inputs"][0]["notes"] == item.notes


def test_without_the_fast_path_the_same_oom_fails_the_input(fast, out, profiles):
    settings = Settings(
        output_dir=out,
        embedding_profile="embedded",
        profiles_dir=profiles,
        enable_fast_path=False,
        diarization_batch_size=4,
    )
    with OomDiarizationPipeline(settings) as orch:
        report = orch.process([DIALOGUE])
    item = report.inputs[0]
    assert (report.ok, report.failed) == (0, 1) and item.failed_stage == "diarization"
    assert "ran out of memory even at batch size 1: try a smaller model" in item.error
    assert item.stages["asr"].status == "reused", "the transcript from the first run was current"


def test_skip_voice_embeddings_skips_enrollment_and_keeps_cluster_labels(fast, out, profiles):
    settings = Settings(
        output_dir=out, embedding_profile="embedded", profiles_dir=profiles, skip_voice_embeddings=True
    )
    with Orchestrator(settings) as orch:
        report = orch.process([DIALOGUE])
    item = report.inputs[0]
    assert report.ok == 1 and "enrollment" not in item.stages and item.stages["diarization"].status == "ok"
    assert {r.stage for r in report.stages} >= {"diarization", "alignment"} and "enrollment" not in {
        r.stage for r in report.stages
    }
    transcript = json.loads((out / item.id / "transcript.json").read_text())
    assert {s["speaker"] for s in transcript["segments"]} == {"SPEAKER_00", "SPEAKER_01"}
    # the speakers' note, once (the captions may add theirs on the synthetic voices' fast cues)
    assert "SKIP_VOICE_EMBEDDINGS" in transcript["speakers_note"] and [
        n for n in item.notes if not n.startswith("captions:")
    ] == [transcript["speakers_note"]]
