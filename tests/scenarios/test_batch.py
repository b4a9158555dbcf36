"""A long batch: 60 inputs in chunks of 25, each stage one child per chunk."""

from __future__ import annotations

import pytest

from contracts import TranscriptArtifact
from orchestrator import Orchestrator, Settings
from stages.whisper.speech import repeats_itself
from tests.fixtures.generate import clips

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("batch")
    clips(tmp / "in", 60, seconds=1.5)
    with Orchestrator(Settings(output_dir=tmp / "out", chunk_size=25, embedding_profile="embedded")) as orch:
        report = orch.process([tmp / "in"])
    return report, tmp / "out"


def test_every_input_completes(batch):
    report, out = batch
    assert (report.ok, report.failed, report.chunks) == (60, 0, 3)
    assert all((out / item.id / "transcript.srt").is_file() for item in report.inputs)


def test_no_transcript_keeps_a_decoder_loop(batch):
    """60 clips of 1.5 s, joined into shared windows: whisper-tiny.en looped ("tell her, " 66 times in one clip's
    1.5 s) in one of them; Whisper's repetition guard decodes such a window again. A clip given more words than
    1.5 s can hold (a neighbour's) is decoded again alone; which clips share a window is fixed by the join
    groups (5 consecutive clips), so this holds run after run."""
    report, out = batch
    texts = {}
    for item in report.inputs:
        transcript = TranscriptArtifact.model_validate_json((out / item.id / "transcript.json").read_text())
        texts[item.id] = " ".join(segment.text for segment in transcript.segments)
    assert not [k for k, text in texts.items() if repeats_itself(text)]
    assert max(len(text.split()) for text in texts.values()) < 1.5 * 8, (
        "no clip holds more words than 1.5 s can"
    )


def test_each_stage_loads_its_model_once_per_chunk_in_a_fresh_child(batch):
    report, _ = batch
    for stage in ("audio", "asr", "embeddings"):
        runs = [run for run in report.stages if run.stage == stage]
        assert [run.chunk for run in runs] == [1, 2, 3]
        assert [len(run.attempts) for run in runs] == [1, 1, 1]
        assert [run.attempts[0].items for run in runs] == [25, 25, 10]  # whole join groups of 5
    # model loads per stage = number of chunks, each in its own process
    for stage in ("asr", "embeddings"):
        loads = [run.attempts[0].load_s for run in report.stages if run.stage == stage]
        assert len(loads) == 3 and all(load > 0 for load in loads)
    pids = [run.attempts[0].pid for run in report.stages]
    # audio, asr, diarization, alignment, embeddings (no profiles: no enrollment) for each of 3 chunks
    assert len(pids) == 15 and len(set(pids)) == 15, "every stage child of every chunk is a new process"


def test_report_totals(batch):
    report, _ = batch
    assert report.audio_s == pytest.approx(60 * 1.5, abs=0.5)
    assert report.throughput and report.throughput > 0
    assert report.wall_s > 0
