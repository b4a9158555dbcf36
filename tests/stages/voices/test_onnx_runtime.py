"""ONNX Runtime sessions of torch modules: exported once into the cache, checked against torch, or refused."""

from __future__ import annotations

import logging

import numpy as np
import torch

from stages.voices.onnx_runtime import session


def _module(tmp_path):
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Conv1d(3, 5, 3, padding=1), torch.nn.ReLU()).eval()
    weights = tmp_path / "weights.pt"
    torch.save(module.state_dict(), weights)
    return module, weights


def test_a_module_is_exported_once_and_computes_what_torch_computes(tmp_path):
    module, weights = _module(tmp_path)
    probe = torch.randn(2, 3, 40)
    model = session("tiny", module, weights, probe, "x", {0: "batch", 2: "frames"}, tolerance=1e-4)
    assert model is not None
    exported = list((tmp_path / "onnx").glob("tiny-*.onnx"))
    assert len(exported) == 1
    other = torch.randn(4, 3, 17)  # another batch size and length than the probe's
    with torch.inference_mode():
        assert np.abs(model(other).numpy() - module(other).numpy()).max() < 1e-4
    stamp = exported[0].stat().st_mtime_ns
    assert session("tiny", module, weights, probe, "x", {0: "batch", 2: "frames"}, tolerance=1e-4) is not None
    assert exported[0].stat().st_mtime_ns == stamp, "the cached export is reused"
    assert float(exported[0].with_suffix(".checked").read_text()) < 1e-4, "the check is kept beside it"
    # its intra-op threads sleep when they wait (no spinning on a shared CPU)
    assert (
        model.runner.get_session_options().get_session_config_entry("session.intra_op.allow_spinning") == "0"
    )


def test_a_session_beyond_the_tolerance_is_refused_and_torch_kept(tmp_path, caplog):
    module, weights = _module(tmp_path)
    with caplog.at_level(logging.WARNING, logger="stages.voices.onnx_runtime"):
        assert (
            session("tiny", module, weights, torch.randn(2, 3, 40), "x", {0: "batch"}, tolerance=-1.0) is None
        )
    assert "tiny stays on torch" in caplog.text


def test_an_export_that_fails_keeps_torch(tmp_path, caplog):
    class Unexportable(torch.nn.Module):
        def forward(self, x):
            return torch.from_numpy(np.sort(x.numpy(), axis=-1))  # leaves torch: the tracer cannot follow

    _, weights = _module(tmp_path)
    with caplog.at_level(logging.WARNING, logger="stages.voices.onnx_runtime"):
        model = session(
            "broken", Unexportable(), weights, torch.randn(2, 3, 4), "x", {0: "batch"}, tolerance=1e-4
        )
    assert model is None and "broken stays on torch" in caplog.text
