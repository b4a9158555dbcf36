"""Memory checkpoints inside stage children: log format, thresholds, RSS on the CPU, no torch import for it."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

import stages.runtime.memory
from contracts import StageRequest, WorkItem
from contracts.perf import PERF_LOG_ENV, MemoryCheckpoint, read_events
from contracts.stage_settings import MemorySettings
from contracts.units import GIB_MIB as GIB
from orchestrator.settings import Settings
from stages.runtime.memory import format_checkpoint, limit_gpu_memory, pressure
from tests.conftest import MEDIA, ROOT
from tests.fixtures.stages import PICKY


def test_gpu_line_matches_the_seed_format_exactly():
    # Given torch's numbers for a 24 GiB card with 7.23 GiB allocated (seed 000's "Before Whisper Cleanup")
    cp = MemoryCheckpoint(
        point="model loaded",
        t=0.0,
        kind="gpu",
        allocated_mb=7.23 * GIB,
        reserved_mb=8.5 * GIB,
        free_mb=15.1 * GIB,
        total_mb=24 * GIB,
    )
    # Then the line is the one users grep for
    assert format_checkpoint("asr", cp) == (
        "[GPU Memory] asr model loaded: Allocated: 7.23GB (30.1%) | Reserved: 8.50GB (35.4%) | "
        "Free: 15.10GB | Total: 24.00GB"
    )


def test_cpu_line_says_it_is_rss_not_vram():
    cp = MemoryCheckpoint(point="before exit", t=0.0, kind="cpu", rss_mb=0.5 * GIB, peak_rss_mb=1.25 * GIB)
    assert format_checkpoint("embeddings", cp) == (
        "[CPU Memory] embeddings before exit: RSS: 0.50GB | Peak RSS: 1.25GB (CPU run: process RSS, not VRAM)"
    )


@pytest.mark.parametrize(
    ("pct", "expected"),
    [(10.0, None), (70.0, None), (70.1, "NOTICE"), (85.0, "NOTICE"), (85.1, "WARNING"), (99.9, "WARNING")],
)
def test_thresholds_are_strictly_above_70_and_85(pct, expected):
    got = pressure(pct)
    assert (got[1].split(":")[0] if got else None) == expected
    if expected == "WARNING":
        assert got == (
            logging.WARNING,
            f"WARNING: GPU memory usage is critically high ({pct:.1f}%). "
            "Consider reducing batch size or using a smaller model.",
        )
    if expected == "NOTICE":
        assert (
            got[1]
            == f"NOTICE: GPU memory usage is elevated ({pct:.1f}%). Monitor for potential OOM conditions."
        )


def test_thresholds_come_from_the_settings_and_the_seed_env_names(monkeypatch):
    monkeypatch.setenv("PIPELINE_MEMORY_NOTICE_PCT", "50")
    monkeypatch.setenv("PIPELINE_MEMORY_WARNING_PCT", "60")
    monkeypatch.setenv("PIPELINE_MEMORY_EVERY_ITEM", "true")
    monkeypatch.setenv("PIPELINE_TF32", "0")
    options = Settings().memory()
    assert options == MemorySettings(notice_pct=50, warning_pct=60, every_item=True, tf32=False)
    assert pressure(55, options.notice_pct, options.warning_pct)[1].startswith("NOTICE")
    assert pressure(61, options.notice_pct, options.warning_pct)[1].startswith("WARNING")
    monkeypatch.delenv("PIPELINE_MEMORY_NOTICE_PCT")
    monkeypatch.delenv("PIPELINE_MEMORY_WARNING_PCT")
    monkeypatch.delenv("PIPELINE_MEMORY_EVERY_ITEM")
    monkeypatch.delenv("PIPELINE_TF32")
    assert Settings().memory() == MemorySettings()
    with pytest.raises(ValueError):
        MemorySettings(notice_pct=90, warning_pct=80)


def _request(tmp_path, env, items=("a", "b"), every_item=False, fraction=None) -> StageRequest:
    return StageRequest(
        request_id="picky-1",
        stage="picky",
        module="tests.fixtures.stages_picky",
        batch_size=2,
        device="cpu",
        env=env,
        result_path=str(tmp_path / "result.json"),
        memory=MemorySettings(every_item=every_item, gpu_memory_fraction=fraction),
        items=[
            WorkItem(
                id=i, inputs={"source": "good"}, output=str(tmp_path / i / "note.json"), fingerprint="fp"
            )
            for i in items
        ],
    )


def test_stage_loop_takes_cpu_checkpoints_logs_them_and_appends_them_to_the_perf_log(tmp_path, caplog):
    perf = tmp_path / "performance_logs" / "run.jsonl"
    caplog.set_level(logging.INFO, logger="stages.runtime.memory")
    # When a stage runs on the CPU with per-item checkpoints asked for
    result = PICKY.run(_request(tmp_path, {PERF_LOG_ENV: str(perf)}, every_item=True))
    # Then every checkpoint is in the result, in order, measured as RSS
    points = ["before model load", "model loaded", "after item 1/2", "after item 2/2", "before exit"]
    assert [c.point for c in result.checkpoints] == points
    assert all(
        c.kind == "cpu" and c.rss_mb > 10 and c.peak_rss_mb >= c.rss_mb * 0.5 for c in result.checkpoints
    )
    assert result.peak_vram_mb is None
    # and logged in the CPU format
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("[CPU Memory]")]
    assert [line.split(":")[0] for line in lines] == [f"[CPU Memory] picky {p}" for p in points]
    # and appended to the performance log as checkpoint events
    events = read_events(perf)
    assert [(e.event, e.stage, e.attempt, e.point) for e in events] == [
        ("checkpoint", "picky", 1, p) for p in points
    ]


def test_without_the_setting_there_is_no_per_item_checkpoint_and_no_perf_log(tmp_path):
    result = PICKY.run(_request(tmp_path, {}))
    assert [c.point for c in result.checkpoints] == ["before model load", "model loaded", "before exit"]
    assert not list(tmp_path.rglob("*.jsonl"))


def test_a_gpu_memory_fraction_on_the_cpu_is_ignored_and_said_once(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(stages.runtime.memory, "_fraction_ignored", None)
    caplog.set_level(logging.INFO, logger="stages.runtime.memory")
    # When a stage child capped at 0.3 of its GPU runs on the CPU, twice in the same process
    first = PICKY.run(_request(tmp_path / "1", {}, fraction=0.3))
    second = PICKY.run(_request(tmp_path / "2", {}, fraction=0.3))
    # Then it works as without the cap, and says once that the cap does not apply
    assert all(i.ok for i in first.items + second.items)
    said = [r.getMessage() for r in caplog.records if "gpu_memory_fraction" in r.getMessage()]
    assert said == [
        "gpu_memory_fraction 0.3 ignored: this child does not run torch on a CUDA device (device cpu)"
    ]


class _FakeCuda:
    """torch.cuda as limit_gpu_memory uses it, on a 80 GiB card (records what it was asked)."""

    def __init__(self) -> None:
        self.asked: list[tuple[float, int]] = []

    def is_available(self) -> bool:
        return True

    def current_device(self) -> int:
        return 0

    def set_per_process_memory_fraction(self, fraction: float, index: int) -> None:
        self.asked.append((fraction, index))

    def get_device_properties(self, index: int):
        return type("Props", (), {"total_memory": 80 * 1024**3})()


def test_on_cuda_the_fraction_is_applied_to_the_childs_device(monkeypatch, caplog):
    import types

    class _Device:
        def __init__(self, name: str) -> None:
            self.index = int(name.split(":")[1]) if ":" in name else None

    fake = types.SimpleNamespace(cuda=_FakeCuda(), device=_Device)
    monkeypatch.setitem(sys.modules, "torch", fake)
    caplog.set_level(logging.INFO, logger="stages.runtime.memory")
    assert limit_gpu_memory("cuda", 0.25) == 0.25
    assert limit_gpu_memory("cuda:1", 0.5) == 0.5
    assert limit_gpu_memory("cuda:1", None) is None
    assert fake.cuda.asked == [(0.25, 0), (0.5, 1)]
    assert "GPU memory cap: this child's torch allocator may take 0.25 of cuda:0, 20.00GB of 80.00GB" in [
        r.getMessage() for r in caplog.records
    ]


AUDIO_CHILD = """
import json, logging, sys
logging.basicConfig(level=logging.INFO)
from contracts import StageRequest, WorkItem
from stages.audio import STAGE
req = StageRequest(request_id="a", stage="audio", module="stages.audio", batch_size=1, device="cuda",
                   result_path=sys.argv[2], settings={"on_damaged": "keep"},
                   items=[WorkItem(id="s", inputs={"source": sys.argv[1]}, output=sys.argv[3], fingerprint="fp")])
STAGE.import_libraries()
result = STAGE.run(req)
print(json.dumps({"torch": "torch" in sys.modules, "kinds": [c.kind for c in result.checkpoints],
                  "ok": result.items[0].ok}))
"""


def test_audio_stage_is_measured_without_importing_torch_even_when_asked_for_cuda(tmp_path):
    # Given the audio stage (PyAV, no torch) asked to run on "cuda"
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            AUDIO_CHILD,
            str(MEDIA / "speech.wav"),
            str(tmp_path / "r.json"),
            str(tmp_path / "audio.json"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    # Then its checkpoints are RSS readings and torch was never imported for them
    assert seen == {"torch": False, "kinds": ["cpu", "cpu", "cpu"], "ok": True}
    assert "[CPU Memory] audio model loaded: RSS: " in done.stderr


def _cuda() -> bool:
    """Cheap check (no torch import at collection): an NVIDIA driver's device node exists."""
    return Path("/dev/nvidiactl").exists()


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda(), reason="needs a CUDA GPU")
def test_on_a_gpu_checkpoints_see_a_real_allocation_and_the_peak(tmp_path):
    from tests.fixtures.stages_gpu import TENSOR

    TENSOR.import_libraries()
    request = StageRequest(
        request_id="t",
        stage="tensor",
        module="tests.fixtures.stages_tensor",
        batch_size=1,
        device="cuda",
        result_path=str(tmp_path / "r.json"),
        memory=MemorySettings(every_item=True),
        items=[WorkItem(id="a", inputs={"source": "512"}, output=str(tmp_path / "a.json"), fingerprint="fp")],
    )
    result = TENSOR.run(request)
    before, after = result.checkpoints[0], result.checkpoints[2]
    assert before.kind == after.kind == "gpu"
    assert after.allocated_mb - before.allocated_mb >= 512
    assert result.peak_vram_mb >= 512


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda(), reason="needs a CUDA GPU")
def test_on_a_gpu_an_allocation_beyond_the_fraction_is_an_out_of_memory(tmp_path):
    import torch

    from stages.runtime.memory import is_oom
    from tests.fixtures.stages_gpu import TENSOR

    TENSOR.import_libraries()
    total_mib = torch.cuda.get_device_properties(0).total_memory / 2**20
    # Given a child capped at 1 GiB that allocates 2 GiB
    request = StageRequest(
        request_id="t",
        stage="tensor",
        module="tests.fixtures.stages_tensor",
        batch_size=1,
        device="cuda",
        result_path=str(tmp_path / "r.json"),
        memory=MemorySettings(gpu_memory_fraction=1024 / total_mib),
        items=[
            WorkItem(id="a", inputs={"source": "2048"}, output=str(tmp_path / "a.json"), fingerprint="fp")
        ],
    )
    # Then the allocation fails as out of memory, which the parent answers with half the batch
    with pytest.raises(BaseException) as caught:
        TENSOR.run(request)
    assert is_oom(caught.value)
