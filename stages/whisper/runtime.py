"""Which runtime runs Whisper: CTranslate2 (whisperX / faster-whisper) or torch (transformers' Whisper
modules, stages/whisper/torch_model.py), and in what precision. The ``asr`` stage's ``choose_runtime``
decides ``ASR_RUNTIME=auto`` with these: a transformers Whisper directory runs on torch; CTranslate2's
compute types map onto torch dtypes where torch runs.
"""

from __future__ import annotations

from pathlib import Path

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
