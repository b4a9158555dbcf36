"""The output directory's layout: run-level names live in orchestrator.layout, and an
input's id can never take one's place, for `process`, `langid` and API jobs alike."""

from __future__ import annotations

import csv
import subprocess
from pathlib import Path

import pytest

from orchestrator import layout
from tests.conftest import MEDIA, ROOT


def unexpected_top_level(out: Path, ids: list[str]) -> set[str]:
    """What a run wrote at the top of ``out`` that is neither a run-level name nor an input's folder."""
    tops = {i.split("/")[0] for i in ids}
    return {p.name for p in out.iterdir()} - layout.RUN_LEVEL - tops


def test_run_level_names_are_reserved_in_any_case():
    for name in layout.RUN_LEVEL:
        assert layout.reserved(name) and layout.reserved(name.upper())
    assert not layout.reserved("talk") and layout.reserved(".anything")
    with pytest.raises(ValueError):
        layout.path("out", "not-a-run-level-name")


@pytest.mark.slow
def test_langid_over_inputs_named_like_its_tables_writes_every_table(tmp_path):
    """`pipeline langid langid.csv.wav ...` crashed at the end (IsADirectoryError): the input's folder had
    taken the table's name. Now the input gets another id and the table is written."""
    names = ["langid.csv.wav", "LANGID.JSON.wav", "run-report.json.wav", "index.html.wav"]
    for name in names:
        (tmp_path / name).write_bytes((MEDIA / "speech.wav").read_bytes())
    out = tmp_path / "out"
    done = subprocess.run(
        [str(ROOT / "bin" / "pipeline"), "langid", *[str(tmp_path / n) for n in names], "--output", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    with open(out / layout.LANGID_CSV, newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["input"] for r in rows] == [
        "langid.csv-2",
        "LANGID.JSON-2",
        "run-report.json-2",
        "index.html-2",
    ]
    assert not any(r["status"] == "failed" for r in rows), rows
    assert (out / layout.LANGID_JSON).is_file() and (out / layout.REPORT).is_file()
    assert unexpected_top_level(out, [r["input"] for r in rows]) == set()
