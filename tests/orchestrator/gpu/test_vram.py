"""VRAM-aware defaults: batch size maths, the asr_model=auto ladder, and their wiring into Settings."""

from __future__ import annotations

import pytest

from contracts.units import GIB_MIB as GIB
from orchestrator.gpu.nvml import GpuDevice, GpuSnapshot, RecordedReader
from orchestrator.gpu.sizing import Need, auto_batch_size, cached_asr_models, pick_asr_model, resolve_auto
from orchestrator.settings import Settings


def test_batch_data_gets_one_eighth_of_the_card_rounded_down_to_a_power_of_two():
    # 24 GiB card, all free, 1 GiB model, 100 MiB per item: 3 GiB budget -> 30 items -> 16
    assert auto_batch_size(24 * GIB, 24 * GIB, Need(1 * GIB, 100)) == 16
    # twice the card, twice the batch
    assert auto_batch_size(48 * GIB, 48 * GIB, Need(1 * GIB, 100)) == 32


def test_free_memory_limits_the_batch_when_the_card_is_shared():
    # 24 GiB card with only 2 GiB free: 2048 - 1024 (model) - 512 (reserve) = 512 MiB -> 5 items -> 4
    assert auto_batch_size(2 * GIB, 24 * GIB, Need(1 * GIB, 100)) == 4


def test_batch_is_at_least_one_and_at_most_the_cap():
    assert auto_batch_size(0.5 * GIB, 24 * GIB, Need(1 * GIB, 100)) == 1
    assert auto_batch_size(80 * GIB, 80 * GIB, Need(0.3 * GIB, 1), cap=256) == 256


@pytest.mark.parametrize(
    ("total_gib", "expected"),
    [
        (7.6, "small"),  # an "8 GB" card as NVML reports it
        (11.8, "medium"),  # 12 GB
        (14.74, "large-v3"),  # seed 004's T4 ("16 GB")
        (23.6, "large-v3"),
        (3.0, "embedded"),
    ],
)
def test_asr_auto_follows_the_seed_table_on_an_idle_card(total_gib, expected):
    model, _ = pick_asr_model(total_gib * GIB, total_gib * GIB - 300, offline=False, cached=set())
    assert model == expected


def test_asr_auto_steps_down_when_free_memory_is_short():
    # a 24 GiB card with 4 GiB free: large-v3 (4.5 GiB) does not fit, distil-large-v3 (2.5 GiB) does
    model, why = pick_asr_model(24 * GIB, 4 * GIB, offline=False, cached=set())
    assert model == "distil-large-v3" and "24.0 GiB card" in why


def test_asr_auto_offline_uses_only_cached_models_else_the_embedded_one():
    assert pick_asr_model(24 * GIB, 23 * GIB, offline=True, cached={"medium"})[0] == "medium"
    model, why = pick_asr_model(24 * GIB, 23 * GIB, offline=True, cached=set())
    assert model == "embedded" and "not in the hub cache" in why


def test_asr_auto_without_a_gpu_is_the_embedded_model():
    assert pick_asr_model(None, None, offline=False, cached={"large-v3"}) == (
        "embedded",
        "no GPU seen: the embedded Whisper tiny.en runs on the CPU",
    )


def write_cache(
    root, repo: str, files: dict[str, bytes], commit: str = "0123456789abcdef0123456789abcdef01234567"
) -> None:
    """The hub cache's layout as huggingface_hub writes it: blobs, a snapshot of links, refs/main."""
    folder = root / f"models--{repo.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True, exist_ok=True)
    (folder / "refs" / "main").write_text(commit)
    (folder / "snapshots" / commit).mkdir(parents=True, exist_ok=True)
    (folder / "blobs").mkdir(exist_ok=True)
    for name, data in files.items():
        blob = folder / "blobs" / f"blob-{name}"
        blob.write_bytes(data)
        (folder / "snapshots" / commit / name).symlink_to(blob)


def test_cached_models_are_found_in_the_hub_cache_layout(tmp_path):
    write_cache(tmp_path, "Systran/faster-whisper-medium", {"model.bin": b"x", "config.json": b"{}"})
    write_cache(tmp_path, "Systran/faster-whisper-small", {"config.json": b"{}"})  # incomplete: no weights
    assert cached_asr_models(tmp_path) == {"medium"}


# -- wiring -------------------------------------------------------------------------


def test_settings_accept_auto_for_batch_sizes_and_model(monkeypatch):
    monkeypatch.setenv("ASR_BATCH_SIZE", "auto")
    monkeypatch.setenv("EMBEDDING_BATCH_SIZE", "32")
    s = Settings(asr_model="auto")
    assert (s.asr_batch_size, s.embedding_batch_size, s.asr_model) == ("auto", 32, "auto")


def test_auto_on_a_recorded_24_gib_card_resolves_to_gpu_values(tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(
        huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path)
    )  # empty: offline, nothing usable
    card = GpuDevice(index=0, name="RTX 4090", total_mib=24 * GIB, used_mib=500, free_mib=24 * GIB - 500)
    reader = RecordedReader([GpuSnapshot(available=True, devices=[card])])
    s = resolve_auto(Settings(asr_model="auto", asr_batch_size="auto", embedding_batch_size="auto"), reader)
    assert s.asr_model == "embedded"  # offline and nothing cached
    assert s.asr_batch_size == 64  # 3 GiB / 30 MiB per window for tiny -> 102 -> 64
    assert s.embedding_batch_size == 256  # capped
    online = resolve_auto(Settings(asr_model="auto", asr_batch_size="auto", allow_hub=True), reader)
    assert online.asr_model == "large-v3" and online.asr_batch_size == 16  # 3 GiB / 160 MiB -> 19 -> 16


def test_auto_without_a_gpu_keeps_the_cpu_defaults():
    reader = RecordedReader([GpuSnapshot(available=False, reason="no NVML")])
    s = resolve_auto(Settings(asr_model="auto", asr_batch_size="auto", embedding_batch_size="auto"), reader)
    assert (s.asr_model, s.asr_batch_size, s.embedding_batch_size) == ("embedded", 16, 128)


def test_settings_without_auto_are_returned_unchanged_without_reading_the_gpu():
    reader = RecordedReader([GpuSnapshot(available=False)])
    s = Settings(asr_batch_size=8)
    assert resolve_auto(s, reader) is s and reader.reads == 0
