"""Which runtime the ASR stage runs Whisper on, and in what precision torch runs it: no model is loaded.

``ASR_RUNTIME=auto`` runs CTranslate2 where it can use the device and torch where it cannot (CTranslate2 not
importable, or a CUDA device CTranslate2 reports none of) or where the model is a transformers directory, with
the reason kept for the transcript and the log. We have no GPU whose driver CTranslate2 cannot use, so its CUDA
device count is faked (the trial encode that catches a GPU it counts but cannot run on needs such a GPU).
"""

from __future__ import annotations

import sys

import pytest

import stages.asr
from stages.asr import AsrStage
from stages.whisper.runtime import torch_compute_type
from tests.conftest import stage_settings


def _stage(runtime: str) -> AsrStage:
    """A stage with ``runtime`` asked and its libraries imported, as its child has them before loading."""
    stage = AsrStage()
    stage.settings = stage.settings_model.model_validate(stage_settings("asr", runtime=runtime))
    stage.import_libraries()
    return stage


@pytest.fixture
def ctranslate2(monkeypatch):
    """The real ``ctranslate2`` module as the stage imports it (not whisperX and faster-whisper besides: 5 s of
    imports, and the choice reads only ``ctranslate2``); its CUDA device count can be patched."""
    import ctranslate2

    def only_ctranslate2():
        monkeypatch.setattr(stages.asr, "ctranslate2", ctranslate2, raising=False)

    monkeypatch.setattr(stages.asr, "_import_ctranslate2", only_ctranslate2)
    return ctranslate2


@pytest.fixture
def without_ctranslate2(monkeypatch):
    """``import ctranslate2`` fails, as on an image without it."""
    monkeypatch.setitem(sys.modules, "ctranslate2", None)


def test_auto_runs_ctranslate2_on_the_cpu(ctranslate2):
    assert _stage("auto").choose_runtime("cpu") == ("ctranslate2", None)


def test_auto_runs_ctranslate2_on_a_gpu_it_sees(ctranslate2, monkeypatch):
    monkeypatch.setattr(ctranslate2, "get_cuda_device_count", lambda: 1)
    assert _stage("auto").choose_runtime("cuda:0") == ("ctranslate2", None)


@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_auto_runs_torch_on_a_gpu_ctranslate2_does_not_see_and_says_why(ctranslate2, monkeypatch, device):
    # Given CTranslate2 reporting no CUDA device (its builds for CUDA 12 on a CUDA 13 driver do)
    monkeypatch.setattr(ctranslate2, "get_cuda_device_count", lambda: 0)
    runtime, why = _stage("auto").choose_runtime(device)
    assert runtime == "torch" and "CTranslate2 sees no CUDA device" in why and "torch" in why


def test_auto_runs_torch_where_ctranslate2_cannot_ask_cuda(ctranslate2, monkeypatch):
    def broken():
        raise RuntimeError("CUDA driver version is insufficient for CUDA runtime version")

    monkeypatch.setattr(ctranslate2, "get_cuda_device_count", broken)
    runtime, why = _stage("auto").choose_runtime("cuda")
    assert (
        runtime == "torch" and "cannot query CUDA (RuntimeError: CUDA driver version is insufficient" in why
    )
    assert _stage("auto").choose_runtime("cpu") == ("ctranslate2", None), "the CPU does not ask CUDA"


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_auto_runs_torch_where_ctranslate2_cannot_be_imported_and_says_why(without_ctranslate2, device):
    runtime, why = _stage("auto").choose_runtime(device)
    assert runtime == "torch"
    assert "CTranslate2) cannot be imported (ModuleNotFoundError: " in why and "ctranslate2" in why


def test_auto_runs_torch_for_a_transformers_whisper_directory(ctranslate2, tmp_path):
    # Given a directory of transformers weights (no CTranslate2 model.bin), on a CPU CTranslate2 could use
    (tmp_path / "model.safetensors").write_bytes(b"")
    runtime, why = _stage("auto").choose_runtime("cpu", str(tmp_path))
    assert runtime == "torch" and "transformers Whisper directory" in why
    # a CTranslate2 directory, or a model name, stays on CTranslate2
    (tmp_path / "model.bin").write_bytes(b"")
    assert _stage("auto").choose_runtime("cpu", str(tmp_path)) == ("ctranslate2", None)
    assert _stage("auto").choose_runtime("cpu", "distil-large-v3") == ("ctranslate2", None)


def test_an_asked_runtime_is_kept(ctranslate2, monkeypatch):
    monkeypatch.setattr(ctranslate2, "get_cuda_device_count", lambda: 0)
    assert _stage("torch").choose_runtime("cpu") == ("torch", None)
    # ctranslate2 asked where it sees no GPU: as asked (its own load then says what is wrong)
    assert _stage("ctranslate2").choose_runtime("cuda") == ("ctranslate2", None)


def test_torch_asked_does_not_import_ctranslate2(without_ctranslate2):
    stage = _stage("torch")
    assert stage.ctranslate2_missing is None and stage.choose_runtime("cuda") == ("torch", None)


def test_ctranslate2_asked_but_not_importable_fails_at_import(without_ctranslate2):
    with pytest.raises(ImportError, match="ctranslate2"):
        _stage("ctranslate2")


@pytest.mark.parametrize(
    ("compute_type", "device", "dtype"),
    [
        # the defaults: float16 on CUDA, float32 on the CPU (torch has no int8 Whisper here)
        ("auto", "cuda", "float16"),
        ("auto", "cpu", "float32"),
        ("int8", "cpu", "float32"),
        ("int8_float16", "cuda:1", "float16"),
        ("int8_float32", "cuda", "float16"),
        # float types are kept where the device computes them; the CPU computes float32
        ("float16", "cuda", "float16"),
        ("float16", "cpu", "float32"),
        ("bfloat16", "cuda:0", "bfloat16"),
        ("bfloat16", "cpu", "float32"),
        ("float32", "cuda", "float32"),
        ("float32", "cpu", "float32"),
    ],
)
def test_torch_compute_type(compute_type, device, dtype):
    assert torch_compute_type(compute_type, device) == dtype
