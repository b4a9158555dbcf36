"""Progress counts, with one chunk at a time and with chunks in parallel (Ray)."""

from __future__ import annotations

from datetime import UTC

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
    assert progress.line().startswith("Progress: 1/4 inputs (0 failed)")


def test_the_summary_of_a_large_run_shows_every_problem_and_counts_the_rest():
    """At 100,000 inputs a row per input took minutes and scrolled the failures away."""
    from datetime import datetime

    from rich.console import Console

    from contracts.report import InputReport, RunReport
    from orchestrator.run.progress import summary_table

    inputs = [
        InputReport(
            id=f"corpus/{n:05d}/audio",
            source=f"/data/{n:05d}/audio.wav",
            status="failed" if n in (7, 90_001) else "ok",
            error="no audio stream" if n in (7, 90_001) else None,
        )
        for n in range(100_000)
    ]
    now = datetime.now(UTC)
    report = RunReport(
        run_id="r",
        started_at=now,
        finished_at=now,
        output_dir="out",
        settings={},
        ok=99_998,
        failed=2,
        chunk_size=50,
        chunks=2000,
        inputs=inputs,
        stages=[],
    )
    table = summary_table(report, plain=True)
    assert table.row_count == 51
    console = Console(width=160, record=True, file=open("/dev/null", "w"))
    console.print(table)
    text = console.export_text()
    assert "corpus/00007/audio" in text and "corpus/90001/audio" in text, "every failure is shown"
    assert "... 99,950 more (99,950 ok): see the run report" in text


def test_the_summary_says_how_much_of_the_run_no_child_was_computing():
    from datetime import datetime

    from contracts.report import RunReport
    from orchestrator.run.progress import summary_table

    now = datetime.now(UTC)
    report = RunReport(
        run_id="r", started_at=now, finished_at=now, output_dir="out", settings={}, ok=1, failed=0,
        chunk_size=50, chunks=1, audio_s=10.8, wall_s=19.0, computing_s=12.9, exposed_s=6.1, inputs=[],
        stages=[],
    )  # fmt: skip
    assert summary_table(report, plain=True).caption.endswith(
        "\nexposed 6.1 s of 19.0 s (start-up and waits)"
    )
