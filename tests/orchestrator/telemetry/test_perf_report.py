"""`pipeline report`: summary of a performance log, run peak vs largest stage, the PNG plot, finding the log."""

from __future__ import annotations

import pytest

from contracts.errors import SettingsError
from contracts.perf import PerfEvent, append_event, perf_event
from contracts.report import Attempt
from contracts.units import GIB_MIB as GIB
from orchestrator.telemetry.perf_report import compute_cpu, find_perf_log, plot, run_peaks, summarize, table


def ev(t, event, stage=None, attempt=1, **fields) -> PerfEvent:
    return perf_event(t=1000.0 + t, event=event, stage=stage, attempt=attempt if stage else None, **fields)


def end(t, stage, attempt=1, batch_size=1, items=2, **record) -> PerfEvent:
    """A stage_end event with the child's record."""
    return ev(
        t,
        "stage_end",
        stage,
        attempt,
        record=Attempt(stage=stage, attempt=attempt, batch_size=batch_size, items=items, **record),
    )


def gpu_cp(t, stage, point, allocated, attempt=1):
    return ev(
        t,
        "checkpoint",
        stage,
        attempt,
        point=point,
        kind="gpu",
        allocated_mb=allocated,
        reserved_mb=allocated + 256,
        free_mb=24 * GIB - allocated - 600,
        total_mb=24 * GIB,
    )


#: a GPU run: audio on the CPU; asr (CTranslate2: torch sees little, NVML sees 3 GiB) OOMs once then succeeds;
#: embeddings leaks according to NVML
EVENTS = [
    ev(0, "stage_start", "audio", batch_size=1, items=2, device="auto"),
    ev(0.3, "checkpoint", "audio", point="before model load", kind="cpu", rss_mb=70, peak_rss_mb=70),
    ev(0.5, "checkpoint", "audio", point="before exit", kind="cpu", rss_mb=90, peak_rss_mb=95),
    end(0.6, "audio", outcome="ok", ok=2, failed=0, wall_s=0.6, items_per_s=20.0, device="cpu"),
    ev(1, "stage_start", "asr", batch_size=16, items=2, device="cuda"),
    gpu_cp(9, "asr", "before model load", 0),
    ev(
        9.5,
        "gpu_sample",
        "asr",
        gpu_index=0,
        process_mib=3000,
        device_used_mib=3500,
        device_total_mib=24 * GIB,
    ),
    gpu_cp(10, "asr", "at failure", 200),
    end(10.5, "asr", outcome="oom", wall_s=9.5, batch_size=16),
    ev(11, "retry", "asr", attempt=2, batch_size=8, previous_outcome="oom", previous_batch_size=16),
    ev(11, "stage_start", "asr", attempt=2, batch_size=8, items=2, device="cuda"),
    gpu_cp(19, "asr", "model loaded", 300, attempt=2),
    ev(19.5, "gpu_sample", "asr", attempt=2, gpu_index=0, process_mib=3300, device_used_mib=3800),
    gpu_cp(20, "asr", "before exit", 250, attempt=2),
    ev(20.2, "gpu_check", "asr", attempt=2, gpu_index=0, process_mib=0.0, device_used_mib=520),
    end(
        20.3,
        "asr",
        attempt=2,
        batch_size=8,
        outcome="ok",
        ok=2,
        failed=0,
        wall_s=9.3,
        items_per_s=1.5,
        peak_vram_mb=310,
        gpu_process_peak_mib=3300,
        gpu_tree_after_mib=0.0,
        device="cuda",
    ),
    ev(21, "stage_start", "embeddings", batch_size=128, items=2, device="cuda"),
    gpu_cp(27, "embeddings", "model loaded", 18 * GIB),
    ev(27.5, "gpu_sample", "embeddings", gpu_index=0, process_mib=19 * GIB, device_used_mib=19.5 * GIB),
    gpu_cp(28, "embeddings", "before exit", 20.5 * GIB),
    ev(
        28.5,
        "gpu_check",
        "embeddings",
        gpu_index=0,
        process_mib=0.0,
        device_used_mib=2000,
        leak="embeddings: GPU memory leak: GPU 0 usage did not return to its pre-stage baseline",
    ),
    end(
        28.6,
        "embeddings",
        batch_size=128,
        outcome="ok",
        ok=2,
        failed=0,
        wall_s=7.6,
        items_per_s=40.0,
        peak_vram_mb=20.6 * GIB,
        gpu_process_peak_mib=19 * GIB,
        gpu_tree_after_mib=0.0,
        device="cuda",
        gpu_leak="embeddings: GPU memory leak: GPU 0 usage did not return to its pre-stage baseline",
    ),
]


def test_summary_has_one_row_per_child_with_its_peaks_and_proof():
    rows = {(s.stage, s.attempt): s for s in summarize(EVENTS)}
    assert list(rows) == [("audio", 1), ("asr", 1), ("asr", 2), ("embeddings", 1)]
    assert rows["audio", 1].peak_rss_mb == 95 and rows["audio", 1].peak_gpu_mib is None
    # the first asr child died out of memory: its NVML peak comes from the live samples
    assert rows["asr", 1].outcome == "oom" and rows["asr", 1].gpu_process_peak_mib == 3000
    asr = rows["asr", 2]
    assert (asr.batch_size, asr.ok, asr.gpu_tree_after_mib, asr.gpu_leak) == (8, 2, 0.0, None)
    assert asr.peak_gpu_mib == 3300  # NVML sees CTranslate2's memory that torch does not
    emb = rows["embeddings", 1]
    assert emb.gpu_leak.startswith("embeddings: GPU memory leak")
    assert emb.max_allocated_pct == pytest.approx(100 * 20.5 / 24)


def test_the_table_says_how_busy_each_child_kept_the_cpu():
    from rich.console import Console

    from contracts.report import CpuUsage

    usage = CpuUsage(
        user_s=126.0,
        system_s=72.0,
        minor_faults=36_000_000,
        major_faults=0,
        voluntary_switches=1_300_000,
        involuntary_switches=16_000,
    )
    asr = Attempt(
        stage="asr",
        attempt=1,
        batch_size=16,
        items=16,
        outcome="ok",
        wall_s=130.0,
        compute_s=125.0,
        compute_cpu=usage,
    )
    # 198 CPU seconds over 125 s of compute: 1.58 cores busy on average, 36 % of it in the kernel
    assert compute_cpu(asr) == "198 s, 1.58 cores, 36 % system"
    older = Attempt(stage="asr", attempt=1, batch_size=16, items=16, outcome="ok", wall_s=130.0)
    assert compute_cpu(older) == "—"  # a child that did not report it (or died first)
    console = Console(record=True, width=300)
    console.print(table([asr, older]))
    text = console.export_text()
    assert "compute CPU" in text and "198 s, 1.58 cores, 36 % system" in text


def test_run_peak_is_compared_with_the_largest_single_stage():
    peaks = run_peaks(EVENTS, summarize(EVENTS))
    assert peaks.device_peak_mib == 19.5 * GIB
    assert (peaks.largest_stage, peaks.largest_stage_mib) == ("embeddings", 20.6 * GIB)


def test_plot_is_a_png_with_a_gpu_and_a_cpu_panel(tmp_path):
    import matplotlib.image

    png = plot(EVENTS, tmp_path / "run.png", title="run test")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    image = matplotlib.image.imread(png)
    height, width = image.shape[:2]
    assert width > 1000 and height > 700  # two panels stacked


def test_plot_of_a_cpu_only_run_has_one_panel(tmp_path):
    import matplotlib.image

    png = plot(EVENTS[:4], tmp_path / "cpu.png")
    assert matplotlib.image.imread(png).shape[0] < 500


def test_the_log_is_found_from_a_file_an_output_dir_or_a_run_dir(tmp_path):
    logs = tmp_path / "performance_logs"
    for run in ("20260101T000000Z-aaaaaa", "20260102T000000Z-bbbbbb"):
        append_event(logs / f"{run}.jsonl", EVENTS[0])
    (tmp_path / ".runs" / "20260101T000000Z-aaaaaa").mkdir(parents=True)
    newest = logs / "20260102T000000Z-bbbbbb.jsonl"
    assert find_perf_log(newest) == newest
    assert find_perf_log(tmp_path) == newest and find_perf_log(logs) == newest
    assert (
        find_perf_log(tmp_path / ".runs" / "20260101T000000Z-aaaaaa")
        == logs / "20260101T000000Z-aaaaaa.jsonl"
    )
    with pytest.raises(SettingsError, match="no performance log"):
        find_perf_log(tmp_path / "elsewhere")


def test_the_table_names_the_node_of_each_child_when_any_ran_on_a_cluster():
    from rich.console import Console

    node = "a1b2c3d4e5f6" + "0" * 44  # a Ray node id: 56 hex digits
    on_node = Attempt(stage="asr", attempt=1, batch_size=4, items=4, outcome="ok", wall_s=3.0, node=node)
    here = Attempt(stage="audio", attempt=1, batch_size=4, items=4, outcome="ok", wall_s=1.0)
    console = Console(record=True, width=300)
    console.print(table([here, on_node]))
    lines = console.export_text().splitlines()
    assert any("stage" in line and "node" in line for line in lines)
    rows = [line for line in lines if "│" in line]
    assert "a1b2c3d4e5f6" in rows[1] and node not in rows[1]  # shortened, as the nodes are told apart
    assert "—" in rows[0].split("│")[2]  # the child that ran on no cluster node
    # and a run on one machine has no node column at all
    console = Console(record=True, width=300)
    console.print(table([here]))
    assert " node " not in console.export_text()
