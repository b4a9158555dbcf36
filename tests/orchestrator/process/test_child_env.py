"""What children get from the GPU-memory settings: thresholds, TF32, CUDA_VISIBLE_DEVICES, device order."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from contracts import WorkItem, load_model
from contracts.stage_settings import MemorySettings
from orchestrator.process.executor import LocalExecutor
from orchestrator.process.hooks import default_hooks
from orchestrator.process.pidfiles import ChildRegistry
from orchestrator.registry import StageSpec
from orchestrator.run.runner import StageRunner
from orchestrator.settings import Settings
from tests.fixtures.stages import FixtureSettings, NoteArtifact

NAMES = ["CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "PYTORCH_CUDA_ALLOC_CONF", "PIPELINE_MEMORY_NOTICE_PCT"]


def test_memory_settings_are_typed_and_gpu_settings_reach_the_child_environment(monkeypatch):
    monkeypatch.setenv("PIPELINE_MEMORY_NOTICE_PCT", "60")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    settings = Settings(memory_warning_pct=80, tf32=False)
    memory = settings.memory()
    assert (memory.notice_pct, memory.warning_pct, memory.tf32, memory.every_item) == (60, 80, False, False)
    env = settings.child_env()
    assert not any(name.startswith("PIPELINE_MEMORY") for name in env), (
        "memory options travel typed, not as env"
    )
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


def _probe(tmp_path, settings: Settings) -> dict:
    """What a real child, started as the runner starts them, saw."""
    runner = StageRunner(
        LocalExecutor(default_hooks(registry=ChildRegistry(tmp_path / "pids"))),
        tmp_path / "run",
        env=settings.child_env(),
        device="cpu",
        max_signal_retries=0,
        memory=settings.memory(),
    )
    item = WorkItem(
        id="a", inputs={"source": "x"}, output=str(tmp_path / "a" / "note.json"), fingerprint="fp"
    )
    outcomes, _ = runner.run(
        StageSpec(
            "envprobe",
            "tests.fixtures.stages_envprobe",
            NoteArtifact,
            settings=FixtureSettings(**{"names": NAMES}),
        ),
        [item],
    )
    assert outcomes["a"].ok
    return json.loads(load_model(tmp_path / "a" / "note.json", NoteArtifact).text)


def test_a_real_child_sees_the_gpu_environment(tmp_path, monkeypatch):
    # Given settings naming GPU 1 and a 50 % notice threshold, and a parent whose own environment says otherwise
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    seen = _probe(tmp_path, Settings(cuda_visible_devices="1", memory_notice_pct=50))
    # Then the child runs with the settings' values, not the inherited ones
    # (the memory options arrive typed in the request, not as environment variables)
    assert seen == {
        "CUDA_VISIBLE_DEVICES": "1",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        "PIPELINE_MEMORY_NOTICE_PCT": None,
        "memory": {
            "notice_pct": 50.0,
            "warning_pct": 85.0,
            "every_item": False,
            "tf32": True,
            "gpu_memory_fraction": None,
        },
        # and its malloc keeps what it frees (glibc here)
        "heap": "keep",
    }


def test_a_child_keeps_the_c_librarys_heap_defaults_when_asked(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPELINE_CHILD_HEAP", "system")
    assert _probe(tmp_path, Settings())["heap"] == "system"


def test_the_gpu_memory_fraction_reaches_a_real_child_typed(tmp_path, monkeypatch):
    # Given the cap set through its environment name
    monkeypatch.setenv("PIPELINE_GPU_MEMORY_FRACTION", "0.25")
    settings = Settings()
    # When a real child is started as the runner starts stage children
    seen = _probe(tmp_path, settings)
    # Then the child's request carries the fraction in its memory options (not as an environment variable)
    assert seen["memory"]["gpu_memory_fraction"] == 0.25
    assert "PIPELINE_GPU_MEMORY_FRACTION" not in settings.child_env()


@pytest.mark.parametrize("value", ["0", "-0.5", "1.5", "half"])
def test_an_invalid_gpu_memory_fraction_is_refused_naming_the_setting(monkeypatch, value):
    monkeypatch.setenv("PIPELINE_GPU_MEMORY_FRACTION", value)
    with pytest.raises(ValidationError) as caught:
        Settings()
    error = caught.value.errors()[0]
    # what the CLI prints: "invalid setting gpu_memory_fraction: Input should be ..."
    assert error["loc"] == ("gpu_memory_fraction",)
    assert error["msg"].startswith("Input should be")


def test_no_gpu_memory_fraction_means_no_cap_and_the_child_contract_refuses_a_bad_one(monkeypatch):
    monkeypatch.delenv("PIPELINE_GPU_MEMORY_FRACTION", raising=False)
    assert Settings().memory().gpu_memory_fraction is None
    monkeypatch.setenv("PIPELINE_GPU_MEMORY_FRACTION", "off")
    assert Settings().gpu_memory_fraction is None
    assert Settings(gpu_memory_fraction=1).memory().gpu_memory_fraction == 1.0
    # a request written by hand is checked again on the child's side
    with pytest.raises(ValidationError, match="gpu_memory_fraction"):
        MemorySettings(gpu_memory_fraction=2)
