"""Progress counts, with one chunk at a time and with chunks in parallel (Ray)."""

from __future__ import annotations

from contracts import ItemResult
from orchestrator.run.progress import Progress


def _item(item_id: str) -> ItemResult:
    return ItemResult(id=item_id, ok=True, output=f"/out/{item_id}/asr.json", seconds=0.1)


def test_one_chunk_at_a_time_reads_as_before():
    progress = Progress()
    progress.start(total=4, resumed=0, chunks=2)
    progress.stage_started(1, "asr", 2)
    progress.item_finished("asr", _item("a"), chunk=1)
    assert "| chunk 1/2 asr 1/2 |" in progress.line()
    progress.chunk_finished(1)
    progress.stage_started(2, "audio", 2)
    assert "| chunk 2/2 audio 0/2 |" in progress.line()


def test_chunks_in_parallel_are_counted_apart():
    progress = Progress()
    progress.start(total=4, resumed=0, chunks=2)
    progress.stage_started(1, "asr", 2)
    progress.stage_started(2, "audio", 2)
    progress.item_finished("asr", _item("a"), chunk=1)
    progress.item_finished("audio", _item("c"), chunk=2)
    progress.item_finished("audio", _item("d"), chunk=2)
    assert "chunk 1/2 asr 1/2, chunk 2/2 audio 2/2" in progress.line()
    progress.chunk_finished(2)
    assert "chunk 2/2" not in progress.line()
    progress.input_finished(True, 3600.0)
    assert progress.line().startswith("Progress: 1/4 videos (0 failed)")
