"""The run report from hand-made run states; pipeline langid's tables; the model substitution lines."""

from __future__ import annotations

import csv
import errno
import json
from datetime import UTC, datetime
from pathlib import Path

from contracts import DiarizationArtifact, EmbeddingsArtifact, Segment, TranscriptArtifact
from contracts.artifacts import LanguageId, LanguageScore
from contracts.errors import DiskFullError
from contracts.report import ItemStage
from orchestrator import Settings, layout
from orchestrator.planning.inputs import Input
from orchestrator.planning.state import InputState
from orchestrator.run.report import (
    LANGID_COLUMNS,
    build_report,
    disk_line,
    model_substitutions,
    write_langid_tables,
)


def _state(tmp_path: Path, item_id: str, **run) -> InputState:
    state = InputState(Input(id=item_id, source=tmp_path / f"{item_id}.wav", directory=tmp_path / item_id))
    for name, value in run.items():
        setattr(state, name, value)
    return state


def _report(tmp_path, inputs, wall_s=10.0, **settings):
    settings = Settings(_env_file=None, output_dir=tmp_path, chunk_size=2, **settings)
    return build_report(settings, "run-1", datetime.now(UTC), wall_s, tmp_path, inputs, [], ["repo/x"])


def test_counts_audio_and_throughput_come_from_the_run_states(tmp_path):
    inputs = [
        _state(
            tmp_path, "a", complete=True, worked=True, duration_s=30.0, outputs={"srt": "a/transcript.srt"}
        ),
        _state(tmp_path, "b", complete=True, duration_s=50.0),  # reused: counted as audio, not as work
        _state(tmp_path, "c", complete=True, worked=True, duration_s=20.0, damage="decoded 20.0 s of 60.0 s"),
        _state(tmp_path, "d", error="decoding failed", failed_stage="audio", duration_s=99.0),
        _state(tmp_path, "e", interrupted=True, stages={"audio": ItemStage(status="interrupted")}),
    ]
    report = _report(tmp_path, inputs)
    assert (report.ok, report.partial, report.failed, report.interrupted) == (2, 1, 1, 1)
    assert [i.status for i in report.inputs] == ["ok", "ok", "partial", "failed", "interrupted"]
    assert report.chunks == 3 and report.chunk_size == 2
    assert report.audio_s == 100.0, "the audio of complete inputs only"
    assert report.throughput == 5.0, "audio this run worked on (a and c), per second of wall time"
    assert report.inputs[2].error == "damaged source: decoded 20.0 s of 60.0 s"
    assert report.inputs[3].failed_stage == "audio"
    assert report.inputs[4].stages["audio"].status == "interrupted"
    assert report.downloads == ["repo/x"]


def test_nothing_worked_on_has_no_throughput(tmp_path):
    assert _report(tmp_path, [_state(tmp_path, "a", complete=True, duration_s=3.0)]).throughput is None
    assert _report(tmp_path, [], wall_s=0.0).throughput is None


def test_substitutions_are_listed_once_and_the_output_url_without_its_password(tmp_path):
    line = "embeddings: asked for 'multilingual' ..."
    inputs = [_state(tmp_path, n, complete=True, substitutions=[line]) for n in ("a", "b")]
    report = _report(tmp_path, inputs, output_url="sftp://alice:secret@host/out")
    assert report.substitutions == [line]
    assert report.settings["output_url"] == "sftp://alice:***@host/out"


def test_langid_tables_have_one_row_per_input(tmp_path):
    found = LanguageId(
        status="detected",
        language="fr",
        probability=0.91,
        top=[LanguageScore(language="fr", probability=0.91), LanguageScore(language="it", probability=0.05)],
        speech_s=12.5,
    )
    inputs = [
        _state(tmp_path, "a", complete=True, language=found),
        _state(tmp_path, "b", error="reading the language failed: no asr.json", failed_stage="outputs"),
    ]
    csv_path, json_path = write_langid_tables(_report(tmp_path, inputs), tmp_path)
    assert (csv_path, json_path) == (
        layout.path(tmp_path, layout.LANGID_CSV),
        layout.path(tmp_path, layout.LANGID_JSON),
    )
    rows = list(csv.DictReader(csv_path.open(encoding="utf-8")))
    assert tuple(rows[0]) == LANGID_COLUMNS
    assert rows[0] | {"source": ""} == {
        "input": "a",
        "source": "",
        "status": "detected",
        "language": "fr",
        "probability": "0.91",
        "speech_s": "12.5",
        "top": "fr:0.910 it:0.050",
        "reason": "",
    }
    assert (rows[1]["status"], rows[1]["language"], rows[1]["reason"]) == (
        "failed",
        "",
        "reading the language failed: no asr.json",
    )
    assert [r["input"] for r in json.loads(json_path.read_text())] == ["a", "b"]


def test_each_model_not_used_is_one_line_saying_how_to_get_it():
    said = Segment.model_construct(text=" Hello there.", words=None)
    transcript = TranscriptArtifact.model_construct(
        diarization=True, aligned=False, alignment_note="no aligner", segments=[said]
    )
    embeddings = EmbeddingsArtifact.model_construct(
        fallback_reason="hub   unreachable", profile="multilingual", requested_model="e5"
    )
    diarization = DiarizationArtifact.model_construct(
        fallback_reason="x" * 300, requested_model="pyannote/community-1", model="embedded"
    )
    lines = model_substitutions(transcript, embeddings, diarization)
    assert [line.split(":")[0] for line in lines] == ["embeddings", "diarization", "alignment"]
    assert "used the embedded all-MiniLM-L6-v2: hub unreachable To use it" in lines[0]
    assert "x" * 97 + "..." in lines[1] and "x" * 98 not in lines[1], "a long reason is cut"
    assert "no word timing (no aligner)" in lines[2]
    nothing = EmbeddingsArtifact.model_construct(fallback_reason=None)
    aligned = TranscriptArtifact.model_construct(diarization=True, aligned=True, segments=[said])
    assert model_substitutions(aligned, nothing, None) == []


def test_no_alignment_line_when_nothing_was_said():
    # Given a silent input: speakers on, no aligner ran, and no words at all
    silent = TranscriptArtifact.model_construct(
        diarization=True, aligned=False, alignment_note="no aligner", segments=[]
    )
    nothing = EmbeddingsArtifact.model_construct(fallback_reason=None)
    # then there is nothing to align, and no advice to fetch an aligner
    assert model_substitutions(silent, nothing, None) == []


def test_a_full_disk_is_one_line_with_what_failed_and_the_space_left(tmp_path):
    line = disk_line(OSError(errno.ENOSPC, "No space left on device", "out/a/transcript.json"), tmp_path)
    assert line.startswith("No space left on device: out/a/transcript.json; ")
    assert f"MiB free on {tmp_path}; free some space and run the same command again" in line
    assert disk_line(DiskFullError("writing   x\nneeds 5 MiB"), tmp_path).startswith(
        "writing x needs 5 MiB; "
    )


def test_each_entry_shares_its_run_states_values_and_is_validated_where_it_is_written(tmp_path):
    from contracts.errors import ArtifactError
    from orchestrator.run.report import save_report

    outputs = {"srt": str(tmp_path / "a" / "transcript.srt")}
    notes = ["captions: 0 of 3 cue(s) ..."]
    good = _state(tmp_path, "a", complete=True, duration_s=3.0, outputs=outputs, notes=notes)
    report = _report(tmp_path, [good])
    # no copy of 100,000 inputs' outputs and notes: the report's entry holds the run state's own
    assert report.inputs[0].outputs is outputs and report.inputs[0].notes is notes
    settings = Settings(_env_file=None, output_dir=tmp_path)
    assert save_report(settings, report, tmp_path, tmp_path / ".runs" / "r") is None
    assert json.loads((tmp_path / layout.REPORT).read_text())["inputs"][0]["outputs"] == outputs
    # a value of the wrong type is refused where the report is written (small and large reports alike)
    bad = _state(tmp_path, "b", complete=True, duration_s=1.0, outputs={"srt": 5})
    for count in (1, 1001):
        broken = _report(tmp_path, [bad] * count)
        try:
            save_report(settings, broken, tmp_path, tmp_path / ".runs" / "r")
        except ArtifactError as exc:
            assert "refusing to write an invalid RunReport" in str(exc)
        else:
            raise AssertionError("an invalid report was written")


def test_a_substitution_is_said_once_per_output_folder_and_the_next_run_counts_it(tmp_path):
    from orchestrator.run.report import notes_to_show

    diarizer = (
        "diarization: asked for 'auto', used embedded:segmentation+campplus: LocalEntryNotFoundError: ..."
    )
    embeddings = (
        "embeddings: asked for 'speed' (BAAI/bge-small-en-v1.5), used the embedded MiniLM: OSError: a"
    )
    # Given a first run with the diarizer's fallback: it is said
    assert notes_to_show(tmp_path, [diarizer]) == ([diarizer], 0)
    # When the next run has it again (another reason's wording) and a new one
    again = diarizer.replace("LocalEntryNotFoundError: ...", "OSError: offline")
    # Then only the new one is said, and the old one is counted
    assert notes_to_show(tmp_path, [again, embeddings]) == ([embeddings], 1)
    assert notes_to_show(tmp_path, [diarizer, embeddings]) == ([], 2)
    # another output folder says them again
    assert notes_to_show(tmp_path / "other", [diarizer])[0] == [diarizer]
