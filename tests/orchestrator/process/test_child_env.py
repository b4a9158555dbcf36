"""What children get from the GPU-memory settings: thresholds, TF32, CUDA_VISIBLE_DEVICES, device order."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from contracts import WorkItem, load_model
from orchestrator.process.executor import LocalExecutor
from orchestrator.run.runner import StageRunner, StageSpec
from orchestrator.settings import Settings
from orchestrator.process.watch import ChildWatch
from orchestrator.process.pidfiles import ChildRegistry
from tests.fixtures.stages import NoteArtifact

NAMES = ["CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "PYTORCH_CUDA_ALLOC_CONF", "PIPELINE_MEMORY_NOTICE_PCT",
         "PIPELINE_MEMORY_WARNING_PCT", "PIPELINE_MEMORY_EVERY_ITEM", "PIPELINE_TF32"]


def test_memory_settings_reach_the_child_environment(monkeypatch):
    monkeypatch.setenv("PIPELINE_MEMORY_NOTICE_PCT", "60")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    env = Settings(memory_warning_pct=80, tf32=False).child_env()
    assert env["PIPELINE_MEMORY_NOTICE_PCT"] == "60.0" and env["PIPELINE_MEMORY_WARNING_PCT"] == "80.0"
    assert env["PIPELINE_TF32"] == "0" and env["PIPELINE_MEMORY_EVERY_ITEM"] == "0"
    assert env["CUDA_VISIBLE_DEVICES"] == "1,0" and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


def test_unset_cuda_visible_devices_is_not_invented(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert "CUDA_VISIBLE_DEVICES" not in Settings().child_env()


def test_asr_compute_type_accepts_ctranslate2_types_and_rejects_typos(monkeypatch):
    monkeypatch.setenv("ASR_COMPUTE_TYPE", "int8_float16")
    assert Settings().asr_compute_type == "int8_float16"
    with pytest.raises(ValidationError):
        Settings(asr_compute_type="fp16")


def test_warning_threshold_below_notice_is_rejected():
    with pytest.raises(ValidationError, match="memory_notice_pct"):
        Settings(memory_notice_pct=80, memory_warning_pct=70)


def test_a_real_child_sees_the_gpu_environment(tmp_path, monkeypatch):
    # Given settings naming GPU 1 and a 50 % notice threshold, and a parent whose own environment says otherwise
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    env = Settings(cuda_visible_devices="1", memory_notice_pct=50).child_env()
    runner = StageRunner(LocalExecutor(ChildWatch(ChildRegistry(tmp_path / "pids"))), tmp_path / "run", env=env,
                         device="cpu", max_signal_retries=0)
    item = WorkItem(id="a", inputs={"source": "x"}, output=str(tmp_path / "a" / "note.json"), fingerprint="fp")
    outcomes, _ = runner.run(StageSpec("envprobe", "tests.fixtures.stages_envprobe", NoteArtifact,
                                       settings={"names": NAMES}), [item])
    assert outcomes["a"].ok
    seen = json.loads(load_model(tmp_path / "a" / "note.json", NoteArtifact).text)
    # Then the child runs with the settings' values, not the inherited ones
    assert seen == {"CUDA_VISIBLE_DEVICES": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "PIPELINE_MEMORY_NOTICE_PCT": "50.0",
                    "PIPELINE_MEMORY_WARNING_PCT": "85.0", "PIPELINE_MEMORY_EVERY_ITEM": "0", "PIPELINE_TF32": "1"}
