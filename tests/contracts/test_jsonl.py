"""The one JSON-lines writer and tolerant reader, and the one units module."""

from __future__ import annotations

import multiprocessing

from contracts import ItemResult
from contracts.jsonl import append_line, read_lines
from contracts.units import GIB, GIB_MIB, MIB, gib


def test_a_torn_last_line_and_an_invalid_line_are_skipped(tmp_path):
    path = tmp_path / "items.jsonl"
    append_line(path, ItemResult(id="a", ok=True, output="a.json"))
    with open(path, "a") as fh:
        fh.write('{"id": "b", "ok": tr\n')  # invalid
    append_line(path, ItemResult(id="c", ok=False, error="bad input"))
    with open(path, "a") as fh:
        fh.write('{"id": "d", "o')  # a writer killed mid-line
    assert [r.id for r in read_lines(path, ItemResult)] == ["a", "c"]
    assert [r["id"] for r in read_lines(path)] == ["a", "c"]
    assert read_lines(tmp_path / "missing.jsonl") == []


def _writer(path: str, tag: str) -> None:
    for i in range(300):
        append_line(path, {"tag": tag, "i": i, "pad": "x" * 500})


def test_concurrent_writers_never_interleave_within_a_line(tmp_path):
    path = str(tmp_path / "shared.jsonl")
    procs = [multiprocessing.get_context("spawn").Process(target=_writer, args=(path, t)) for t in "ab"]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    records = read_lines(path)
    assert len(records) == 600 and sorted(r["i"] for r in records if r["tag"] == "a") == list(range(300))


def test_units_are_binary_and_format_like_the_seeds():
    assert (MIB, GIB, GIB_MIB) == (1 << 20, 1 << 30, 1024.0)
    assert gib(1536) == "1.50 GiB" and gib(1556.48, unit="GB") == "1.52GB" and gib(None) == "0.00 GiB"


def test_a_short_write_does_not_tear_a_journal_line(tmp_path, monkeypatch):
    """Given a kernel that writes at most 7 bytes per ``os.write`` (a signal, a nearly full disk), when the
    journal records events, then every line is whole and every event reads back."""
    import os

    from orchestrator.books.journal import Journal

    real = os.write
    calls = []

    def short(fd, data):
        calls.append(len(data))
        return real(fd, bytes(data[:7]))

    monkeypatch.setattr(os, "write", short)
    journal = Journal(tmp_path / "journal.jsonl", "run-1")
    for n in range(3):
        journal.record(f"item-{n}", "asr", "ok", fingerprint="f" * 40)
    monkeypatch.undo()
    assert len(calls) > 3, "the writes were short"
    assert [e["item"] for e in journal.events()] == ["item-0", "item-1", "item-2"]
    assert (tmp_path / "journal.jsonl").read_text().count("\n") == 3
