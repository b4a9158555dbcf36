"""Which runtime runs Whisper: CTranslate2 (whisperX / faster-whisper) or torch (transformers' Whisper
modules, stages/whisper/torch_model.py), and in what precision. :func:`choose_runtime` decides ``ASR_RUNTIME=auto``
for the ``asr`` stage: a transformers Whisper directory, CTranslate2 that cannot be imported or sees no CUDA
device run on torch, and :func:`ctranslate2_runs` catches a GPU CTranslate2 counts but cannot run on; its
compute types map onto torch dtypes where torch runs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from stages.runtime.memory import is_oom

CTRANSLATE2, TORCH = "ctranslate2", "torch"


def default_compute_type(device: str) -> str:
    return "float16" if device.startswith("cuda") else "int8"


def torch_compute_type(compute_type: str, device: str) -> str:
    """The torch dtype for a CTranslate2 compute type: float16 on CUDA and float32 on the CPU unless float32 or
    bfloat16 is asked for (torch has no int8 Whisper here: int8 types take the device's float type)."""
    if compute_type in ("float32", "bfloat16", "float16"):
        return compute_type if device.startswith("cuda") or compute_type == "float32" else "float32"
    return "float16" if device.startswith("cuda") else "float32"


def is_transformers_whisper(path: str) -> bool:
    """``path`` is a local transformers Whisper directory (weights for torch, not CTranslate2's ``model.bin``)."""
    folder = Path(path) if path else None
    if folder is None or not folder.is_dir() or (folder / "model.bin").is_file():
        return False
    return any((folder / name).is_file() for name in ("model.safetensors", "pytorch_model.bin"))


def choose_runtime(
    asked: str, device: str, path: str, ctranslate2_missing: str | None, cuda_device_count: Callable[[], int]
) -> tuple[str, str | None]:
    """(the runtime to run Whisper on, why it is torch where "auto" was asked). A CTranslate2 that reports
    the GPU may still be unable to run on it (a CUDA 12 build beside CUDA 13 libraries): the stage then
    tries one encode and falls back (:func:`ctranslate2_runs`)."""
    if asked != "auto":
        return asked, None
    if is_transformers_whisper(path):
        return TORCH, "the model is a transformers Whisper directory: Whisper runs on torch"
    if ctranslate2_missing:
        return (
            TORCH,
            "the CTranslate2 runtime's libraries (whisperX, faster-whisper, CTranslate2) cannot be imported "
            f"({ctranslate2_missing}): Whisper runs on torch",
        )
    if device.startswith("cuda"):
        try:
            count = cuda_device_count()
        except Exception as exc:  # noqa: BLE001 - the answer is "not usable", with the reason
            return (
                TORCH,
                f"CTranslate2 cannot query CUDA ({type(exc).__name__}: {exc}): Whisper runs on torch",
            )
        if count < 1:
            return TORCH, (
                "CTranslate2 sees no CUDA device (it has no build for CUDA 13 drivers): Whisper runs on torch"
            )
    return CTRANSLATE2, None


def ctranslate2_runs(whisper, device: str, n_frames: int) -> str | None:
    """None where the loaded CTranslate2 Whisper (faster-whisper's ``WhisperModel``) can encode on ``device``,
    else why not: one window of ``n_frames`` of silence (milliseconds on a GPU). CTranslate2 4.x is built for
    CUDA 12: beside CUDA 13 libraries only, it counts the GPU, loads the model, and fails at the first
    operation ("Library libcublas.so.12 is not found or cannot be loaded")."""
    if not device.startswith("cuda"):
        return None
    import ctranslate2
    import numpy as np

    n_mels = whisper.feat_kwargs.get("feature_size") or 80
    try:
        silence = np.zeros((1, n_mels, n_frames), dtype=np.float32)
        whisper.model.encode(ctranslate2.StorageView.from_array(silence), to_cpu=True)
    except Exception as exc:  # the reason is the answer; torch takes over
        if is_oom(exc):
            raise
        return f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
    return None
