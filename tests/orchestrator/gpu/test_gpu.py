"""The parent's NVML logic on recorded readings: who holds VRAM, free-memory refusal, the 0 MiB / baseline proof."""

from __future__ import annotations

import logging
import os
import threading

import pytest

from contracts.errors import GpuMemoryError
from contracts.units import GIB_MIB as GIB
from orchestrator.gpu.guard import GpuMonitor, check_after, free_memory_error
from orchestrator.gpu.nvml import (
    GpuDevice,
    GpuProcess,
    GpuSnapshot,
    NvmlReader,
    RecordedReader,
    device_problem,
    nvml_index,
)
from tests.conftest import wait_for

ME = os.getpid()
TRAINER = GpuProcess(pid=75955, used_mib=14.17 * GIB, command="python3 train_konkanivani_asr.py")


def t4(used: float, processes=(), index=0, uuid="GPU-aaaa-1111") -> GpuDevice:
    total = 14.74 * GIB  # seed 004's Tesla T4
    return GpuDevice(
        index=index,
        name="Tesla T4",
        uuid=uuid,
        total_mib=total,
        used_mib=used,
        free_mib=total - used,
        processes=list(processes),
    )


def snap(*devices: GpuDevice) -> GpuSnapshot:
    return GpuSnapshot(available=True, driver="550.54", devices=list(devices))


# -- before a stage -------------------------------------------------------------


def test_another_process_holding_the_card_is_named_like_torch_names_it():
    dev = t4(14.5 * GIB, [TRAINER])
    error = free_memory_error("asr", dev, need_mib=3 * GIB, ours={ME})
    assert "Process 75955 (python3 train_konkanivani_asr.py) has 14.17 GiB memory in use" in error
    assert error.startswith(
        "asr needs about 3.00 GiB of GPU memory but GPU 0 (Tesla T4) has only 0.24 GiB free"
    )


def test_enough_free_memory_or_a_stage_without_gpu_needs_is_no_error():
    assert free_memory_error("asr", t4(1 * GIB, [TRAINER]), need_mib=3 * GIB, ours={ME}) is None
    assert free_memory_error("audio", t4(14.5 * GIB, [TRAINER]), need_mib=0, ours={ME}) is None


def test_monitor_refuses_to_start_a_stage_and_logs_the_others(caplog):
    monitor = GpuMonitor(RecordedReader([snap(t4(14.5 * GIB, [TRAINER]))]), sample_s=None)
    with (
        caplog.at_level(logging.WARNING, logger="orchestrator.gpu.guard"),
        pytest.raises(GpuMemoryError, match="75955"),
    ):
        monitor.before("asr", "cuda", None, need_mib=3 * GIB)
    assert "other processes hold memory on GPU 0: Process 75955" in caplog.text


def test_refusal_can_be_switched_off():
    monitor = GpuMonitor(RecordedReader([snap(t4(14.5 * GIB, [TRAINER]))]), sample_s=None, check_free=False)
    watch = monitor.before("asr", "cuda", None, need_mib=3 * GIB)
    assert watch is not None and watch.baseline.used_mib == 14.5 * GIB


# -- after a stage --------------------------------------------------------------


def test_zero_mib_held_and_usage_back_to_baseline_is_the_proof():
    before, after = t4(500, [TRAINER]), t4(600, [TRAINER])
    result = check_after("asr", before, after, ours={ME, 4242}, tolerance_mib=256)
    assert result.leak is None and result.tree_mib == 0.0 and result.growth_mib == 100


def test_our_child_still_listed_after_exit_is_a_leak_naming_the_stage():
    after = t4(3000, [GpuProcess(pid=4242, used_mib=2500, command="python -c spawn_main")])
    result = check_after("embeddings", t4(500), after, ours={ME, 4242}, tolerance_mib=256)
    assert result.tree_mib == 2500
    assert result.leak == (
        "embeddings: GPU memory leak: our process tree still holds 2500 MiB on GPU 0 "
        "after the stage child exited (pid 4242)"
    )


def test_device_usage_above_baseline_beyond_tolerance_is_a_leak():
    result = check_after("asr", t4(500), t4(1500), ours={ME}, tolerance_mib=256)
    assert result.tree_mib == 0.0
    assert (
        "did not return to its pre-stage baseline: 500 MiB before, 1500 MiB after (+1000 MiB" in result.leak
    )


def test_growth_of_another_process_is_not_blamed_on_us():
    other_before = GpuProcess(pid=99, used_mib=100, command="other")
    other_after = GpuProcess(pid=99, used_mib=1100, command="other")
    result = check_after(
        "asr", t4(600, [other_before]), t4(1600, [other_after]), ours={ME}, tolerance_mib=256
    )
    assert result.leak is None and result.growth_mib == 0


def test_monitor_waits_for_the_driver_to_release_an_exited_child():
    # Given the exited child is still listed on the first reading after exit, gone on the second
    held = t4(2500, [GpuProcess(pid=4242, used_mib=2000)])
    reader = RecordedReader([snap(t4(500)), snap(held), snap(t4(520))])
    monitor = GpuMonitor(reader, sample_s=None, settle_s=2.0)
    watch = monitor.before("asr", "cuda:0", None, need_mib=1 * GIB)
    watch.pid = 4242
    check = monitor.after(watch)
    # Then the proof holds once the driver caught up
    assert check.leak is None and check.tree_after_mib == 0.0 and reader.reads == 3


def test_monitor_logs_a_leak_error_when_memory_never_comes_back(caplog):
    reader = RecordedReader([snap(t4(500)), snap(t4(4000))])
    monitor = GpuMonitor(reader, sample_s=None, settle_s=0.3)
    watch = monitor.before("asr", "cuda", None, need_mib=0)
    with caplog.at_level(logging.ERROR, logger="orchestrator.gpu.guard"):
        check = monitor.after(watch)
    assert check.leak and "asr: GPU memory leak" in caplog.text


def test_sampling_records_the_childs_peak_on_its_device():
    child = 4242
    readings = [snap(t4(500))] + [
        snap(t4(500 + m, [GpuProcess(pid=child, used_mib=m)])) for m in (300, 1800, 900)
    ]
    monitor = GpuMonitor(RecordedReader(readings), sample_s=None)
    watch = monitor.before("asr", "cuda", None, need_mib=0)
    watch.pid = child
    seen = []
    for _ in range(3):
        monitor.sample(watch, on_sample=lambda w, dev, held: seen.append(held))
    assert seen == [300, 1800, 900] and watch.process_peak_mib == 1800 and watch.device_peak_used_mib == 2300


def test_sampler_thread_runs_while_the_child_runs_and_stops_after():
    readings = [snap(t4(500)), snap(t4(1700, [GpuProcess(pid=4242, used_mib=1200)]))]
    monitor = GpuMonitor(RecordedReader(readings), sample_s=0.01, settle_s=0)
    watch = monitor.before("asr", "cuda", None, need_mib=0)
    monitor.started(watch, 4242)
    wait_for(lambda: watch.process_peak_mib, timeout=30, what="a sample of the child")
    monitor.after(watch)
    assert watch.process_peak_mib == 1200 and watch.sampler is None
    assert not [t for t in threading.enumerate() if t.name == "gpu-asr"]


# -- no NVML ----------------------------------------------------------------------


def test_without_nvml_the_reader_says_why_and_the_monitor_is_a_quiet_no_op(caplog):
    reader = NvmlReader()
    snapshot = reader.read()
    if snapshot.available:
        pytest.skip("this machine has NVML")
    assert snapshot.reason and "NVML" in snapshot.reason
    monitor = GpuMonitor(reader)
    with caplog.at_level(logging.DEBUG, logger="orchestrator.gpu.guard"):
        assert monitor.before("asr", "cuda", None, need_mib=10 * GIB) is None
        assert monitor.before("embeddings", "auto", None, need_mib=10 * GIB) is None
    said = [r for r in caplog.records if r.name == "orchestrator.gpu.guard"]
    assert len(said) == 1 and said[0].levelno == logging.DEBUG and "GPU monitor off" in said[0].getMessage()


def test_cpu_stages_are_not_watched():
    reader = RecordedReader([snap(t4(14.5 * GIB, [TRAINER]))])
    assert GpuMonitor(reader).before("asr", "cpu", None, need_mib=10 * GIB) is None
    assert reader.reads == 0


# -- which device --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("device", "visible", "expected"),
    [
        ("cuda", None, 0),
        ("auto", None, 0),
        ("cuda:1", None, 1),
        ("cuda:2", None, None),
        ("cpu", None, None),
        ("cuda", "1", 1),
        ("cuda:1", "1,0", 0),
        ("cuda", "", None),
        ("cuda:1", "0", None),
        ("cuda", "GPU-bbbb", 1),
        ("cuda", "MIG-xyz", None),
        ("cuda:1", "0,junk,1", None),
    ],
)
def test_cuda_device_maps_to_nvml_index_through_cuda_visible_devices(device, visible, expected):
    two = snap(t4(0, index=0, uuid="GPU-aaaa-1111"), t4(0, index=1, uuid="GPU-bbbb-2222"))
    assert nvml_index(device, visible, two) == expected


def test_recorded_readings_round_trip_through_a_file(tmp_path):
    path = tmp_path / "readings.jsonl"
    readings = [snap(t4(500, [TRAINER])), GpuSnapshot(available=False, reason="NVML is not available")]
    path.write_text("\n".join(s.model_dump_json() for s in readings) + "\n")
    reader = RecordedReader.from_file(path)
    assert [reader.read(), reader.read(), reader.read()] == [readings[0], readings[1], readings[1]]


def test_a_cuda_device_this_machine_lacks_is_named_before_a_run():
    # Given a machine with one GPU (a recorded NVML reading)
    one = snap(t4(0))
    assert device_problem("cpu", None, one) is None and device_problem("auto", None, one) is None
    assert device_problem("cuda", None, one) is None and device_problem("cuda:0", None, one) is None
    # Then a second GPU, a GPU CUDA_VISIBLE_DEVICES hides, or a machine without NVML is one line each
    assert "no such GPU" in device_problem("cuda:7", None, one) and "cuda:0 Tesla T4" in device_problem(
        "cuda:7", None, one
    )
    assert "CUDA_VISIBLE_DEVICES=" in device_problem("cuda:0", "", one)
    none = GpuSnapshot(available=False, reason="NVML is not available")
    assert "no CUDA GPU can be read" in device_problem("cuda:0", None, none)
