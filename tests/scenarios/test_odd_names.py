"""Any name the filesystem allows gets a safe, stable id of its own."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from orchestrator import Orchestrator, Settings, layout
from orchestrator.planning.inputs import item_ids, load_ids, source_key
from tests.conftest import MEDIA


def test_ids_avoid_the_runs_own_names_case_twins_and_other_sources(tmp_path):
    a, b = tmp_path / "A" / "Talk.wav", tmp_path / "B" / "talk.wav"
    ids = item_ids(
        [
            a,
            b,
            tmp_path / "run-report.json.wav",
            tmp_path / "performance_logs.mp4",
            tmp_path / ".runs.mp4",
            tmp_path / "journal.jsonl.wav",
            tmp_path / "langid.csv.wav",
        ]
    )
    assert ids[0] == "Talk" and ids[1] == "talk-2", (
        "names differing only by case: the second gets a free suffix"
    )
    # the run's own files and folders are never an input's directory
    assert ids[2] == "run-report.json-2" and ids[3] == "performance_logs-2" and ids[4] == "runs"
    assert ids[5] == "journal.jsonl-2" and ids[6] == "langid.csv-2"
    assert not any(layout.reserved(i.split("/")[0]) for i in ids)
    # a later run over another folder: the same stem never takes an id another source has
    known = {source_key(tmp_path / "x" / "speech.wav"): "speech"}
    [other] = item_ids([tmp_path / "y" / "speech.wav"], known)
    assert other == "speech-2"
    assert item_ids([tmp_path / "x" / "speech.wav"], known) == ["speech"], "stable across runs"


def test_any_bytes_and_any_length_make_a_valid_id(tmp_path):
    raw = os.fsdecode(b"caf\xe9 \xff.wav")  # not UTF-8: surrogate escapes
    long = "x" * 250 + ".wav"
    ids = item_ids([tmp_path / raw, tmp_path / long, tmp_path / "-dash.wav", tmp_path / "new\nline.wav"])
    for i in ids:
        i.encode("utf-8")  # valid UTF-8
        assert len(i.encode()) <= 255 and "/" not in i and "\n" not in i
    assert ids[0] == "caf_ _" and ids[2] == "-dash" and ids[3] == "new_line"


@pytest.mark.slow
def test_a_run_over_odd_names_completes_each_and_a_rerun_keeps_the_ids(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    names = [
        os.fsdecode(b"caf\xe9.wav"),
        "run-report.json.wav",
        "Speech.wav",
        "speech.wav",
        "-dash.wav",
        "y" * 240 + ".wav",
    ]
    for name in names:
        shutil.copy(MEDIA / "speech.wav", src / name)
    out = tmp_path / "out"
    settings = Settings(output_dir=out, speakers=False, embedding_profile="embedded", allow_hub=False)
    with Orchestrator(settings) as orch:
        report = orch.process([src])
    assert report.ok == len(names), [(i.id, i.error) for i in report.inputs]
    assert (out / "run-report.json").is_file(), "an input named like the report does not take its place"
    sources = {i.source for i in report.inputs}
    assert str(src / "caf\\xe9.wav") in sources, "the report keeps the original name, escaped"
    ids = {i.source: i.id for i in report.inputs}
    assert len(set(ids.values())) == len(names)
    assert json.loads((out / layout.IDS).read_text()) == load_ids(out)
    with Orchestrator(settings) as orch:
        again = orch.process([src])
    assert {i.source: i.id for i in again.inputs} == ids and again.ok == len(names)
    assert all(s.attempts == [] for s in again.stages), "a rerun starts no child"
