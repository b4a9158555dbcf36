"""Artifacts round-trip, are written atomically, and are never trusted when corrupt."""

from __future__ import annotations

import json
import os
from datetime import UTC

import numpy as np
import pytest

from contracts import (
    ArtifactError,
    AudioArtifact,
    EmbeddingsArtifact,
    StageRequest,
    TranscriptArtifact,
    WorkItem,
    load_artifact,
    load_model,
    save_model,
)
from contracts.io import atomic_write_bytes, sha256_file


def _audio(tmp_path, samples=16000) -> tuple[AudioArtifact, object]:
    sidecar = tmp_path / "audio.npy"
    np.save(sidecar, np.zeros(samples, np.float32))
    art = AudioArtifact(
        item_id="a",
        fingerprint="f",
        source="/x.mp4",
        source_size=10,
        sidecar="audio.npy",
        sha256=sha256_file(sidecar),
        num_samples=samples,
        duration_s=samples / 16000,
        source_codec="aac",
        source_sample_rate=44100,
        source_channels=2,
    )
    return art, tmp_path / "audio.json"


def test_audio_round_trip(tmp_path):
    art, path = _audio(tmp_path)
    save_model(art, path)
    assert load_artifact(path, AudioArtifact) == art


def test_transcript_round_trip(tmp_path):
    art = TranscriptArtifact(
        item_id="a",
        fingerprint="f",
        source="/x.mp4",
        language="en",
        segments=[
            {
                "id": 0,
                "start": 0.0,
                "end": 1.5,
                "text": "hello",
                "words": [{"word": "hello", "start": 0.1, "end": 0.5}],
            }
        ],
        model="tiny.en",
        requested_model="embedded",
        device="cpu",
        compute_type="int8",
        batch_size=4,
        duration_s=2.0,
    )
    save_model(art, tmp_path / "t.json")
    back = load_artifact(tmp_path / "t.json", TranscriptArtifact)
    assert back == art and back.segments[0].words[0].word == "hello" and back.aligned is False


def test_truncated_json_is_an_error_naming_the_file(tmp_path):
    art, path = _audio(tmp_path)
    save_model(art, path)
    path.write_bytes(path.read_bytes()[:40])
    with pytest.raises(ArtifactError) as info:
        load_artifact(path, AudioArtifact)
    assert str(path) in str(info.value) and "not valid JSON" in str(info.value)


def test_schema_version_mismatch_is_rejected(tmp_path):
    art, path = _audio(tmp_path)
    data = json.loads(art.model_dump_json())
    data["schema_version"] = 99
    path.write_text(json.dumps(data))
    with pytest.raises(ArtifactError, match="schema_version"):
        load_artifact(path, AudioArtifact)


def test_wrong_artifact_kind_is_rejected(tmp_path):
    art, path = _audio(tmp_path)
    save_model(art, path)
    with pytest.raises(ArtifactError, match="TranscriptArtifact"):
        load_artifact(path, TranscriptArtifact)


def test_modified_sidecar_is_detected_by_sha256(tmp_path):
    art, path = _audio(tmp_path)
    save_model(art, path)
    np.save(tmp_path / "audio.npy", np.ones(16000, np.float32))
    with pytest.raises(ArtifactError) as info:
        load_artifact(path, AudioArtifact)
    assert "audio.npy" in str(info.value) and "sha256" in str(info.value)


def test_missing_sidecar_is_detected(tmp_path):
    art, path = _audio(tmp_path)
    save_model(art, path)
    os.unlink(tmp_path / "audio.npy")
    with pytest.raises(ArtifactError, match="missing"):
        load_artifact(path, AudioArtifact)


def test_invalid_model_is_not_written(tmp_path):
    art, path = _audio(tmp_path)
    bad = art.model_copy(update={"duration_s": 99.0})  # model_copy skips validation
    with pytest.raises(ArtifactError, match="refusing to write"):
        save_model(bad, path)
    assert not path.exists()


def test_embeddings_count_and_sidecar_hash(tmp_path):
    np.save(tmp_path / "embeddings.npy", np.eye(3, 8, dtype=np.float32))
    art = EmbeddingsArtifact(
        item_id="a",
        fingerprint="f",
        source="/x",
        sidecar="embeddings.npy",
        sha256=sha256_file(tmp_path / "embeddings.npy"),
        model="m",
        profile="speed",
        requested_model="r",
        dimension=8,
        count=3,
        normalized=True,
        device="cpu",
        batch_size=2,
    )
    save_model(art, tmp_path / "embeddings.json")
    assert load_artifact(tmp_path / "embeddings.json", EmbeddingsArtifact).count == 3


def test_atomic_write_leaves_old_file_when_writing_fails(tmp_path):
    target = tmp_path / "f.json"
    atomic_write_bytes(target, b"old")

    with pytest.raises(TypeError):
        atomic_write_bytes(target, object())  # fails inside the write
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["f.json"], "no temp file may be left behind"


def test_request_rejects_duplicate_item_ids(tmp_path):
    item = WorkItem(id="a", inputs={}, output="/o", fingerprint="f")
    with pytest.raises(ValueError, match="unique"):
        StageRequest(
            request_id="r", stage="s", module="m", items=[item, item], batch_size=1, result_path="/r"
        )


def test_missing_file_is_an_error_naming_it(tmp_path):
    with pytest.raises(ArtifactError, match="missing") as info:
        load_model(tmp_path / "nope.json", StageRequest)
    assert "nope.json" in str(info.value)


def test_a_large_model_is_written_one_element_at_a_time_and_reads_back_equal(tmp_path):
    from datetime import datetime

    from contracts.io import load_model, save_large
    from contracts.report import InputReport, RunReport

    now = datetime.now(UTC)
    report = RunReport(
        run_id="r",
        started_at=now,
        finished_at=now,
        output_dir="out",
        settings={"a": [1, "x"]},
        ok=3,
        failed=0,
        chunk_size=2,
        chunks=2,
        stages=[],
        stopped='disk "full": [] "inputs":[]',
        inputs=[InputReport(id=f'odd "inputs":[] {n}', source=f"s{n}", status="ok") for n in range(3)],
    )
    save_large(report, "inputs", tmp_path / "a.json", tmp_path / "b.json")
    assert load_model(tmp_path / "a.json", RunReport) == report == load_model(tmp_path / "b.json", RunReport)
    # the copy is the written file itself (a link: a 140 MB report is not written twice) ...
    assert (tmp_path / "a.json").stat().st_ino == (tmp_path / "b.json").stat().st_ino
    empty = report.model_copy(update={"inputs": []})
    save_large(empty, "inputs", tmp_path / "c.json")
    assert load_model(tmp_path / "c.json", RunReport) == empty
    # ... and the next report written in its place leaves the copy as it was (a run's own report)
    save_large(empty, "inputs", tmp_path / "a.json", tmp_path / "d.json")
    assert load_model(tmp_path / "b.json", RunReport) == report
    assert load_model(tmp_path / "a.json", RunReport) == empty == load_model(tmp_path / "d.json", RunReport)
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")], "no temporary file left"


def test_a_file_reads_as_the_python_parser_read_it_and_a_bad_one_is_worded_as_ever(tmp_path):
    """load_model parses with pydantic's JSON parser (fast); what it returns, and why it refuses a file,
    are what json.loads and model_validate gave."""
    art, path = _audio(tmp_path)
    save_model(art, path)
    assert load_model(path, AudioArtifact) == AudioArtifact.model_validate(json.loads(path.read_bytes()))
    path.write_bytes(b'{"item_id": "\xff"}')
    with pytest.raises(ArtifactError, match="not valid JSON"):
        load_model(path, AudioArtifact)
    path.write_text(json.dumps({**json.loads(art.model_dump_json()), "sample_rate": "many"}))
    with pytest.raises(ArtifactError, match="does not match AudioArtifact: sample_rate"):
        load_model(path, AudioArtifact)
