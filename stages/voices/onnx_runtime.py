"""The embedded diarizer's torch models run through ONNX Runtime: exported once, checked, cached.

At first use a model is exported with ``torch.onnx.export`` from the very weights
the torch path loads, into ``<weights dir>/onnx/<name>-<key>.onnx`` (written
atomically; the key covers the weight file's bytes, the torch version and
:data:`FORMAT`, so new weights or a new exporter export again). Every time a
session is opened, its output on a fixed seeded probe is compared with the torch
model's; beyond the tolerance the caller keeps torch and the log says why.

Why: on the 2-core CPU the same segmentation-3.0 and CAM++ forward
passes take several times less time in ONNX Runtime than in torch, and torch's
OpenMP threads lose most when anything else runs on the machine (the parent, a
warm child, another job).
Imported only inside stage children (it imports torch).
"""

from __future__ import annotations

import hashlib
import io
import logging
import warnings
from pathlib import Path

import numpy as np
import torch

from contracts.io import atomic_write_bytes
from stages.runtime.memory import is_oom

log = logging.getLogger(__name__)

#: bump when the export changes (inputs, opset, the modules' code), so that cached files are exported again
FORMAT = 1
OPSET = 17


def _key(weights: Path) -> str:
    import onnxruntime as ort

    digest = hashlib.sha256()
    with open(weights, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    digest.update(f"torch={torch.__version__};ort={ort.__version__};format={FORMAT};opset={OPSET}".encode())
    return digest.hexdigest()[:16]


def session(
    name: str,
    module: torch.nn.Module,
    weights: Path,
    probe: torch.Tensor,
    input_name: str,
    dynamic: dict[int, str],
    tolerance: float,
    cache_dir: Path | None = None,
):
    """An ONNX Runtime session computing ``module`` (eval mode) on inputs shaped like ``probe``, or None
    (logged) when it cannot be exported, loaded, or differs from torch by more than ``tolerance``
    (largest absolute difference on ``probe``). The check runs when the file is exported and its result
    is kept beside it (``.checked``): a child that opens a checked file runs no torch forward pass (a
    cold one costs seconds)."""
    try:
        import onnxruntime as ort

        directory = cache_dir if cache_dir is not None else weights.parent / "onnx"
        path = directory / f"{name}-{_key(weights)}.onnx"
        checked = path.with_suffix(".checked")
        if not path.exists():
            buffer = io.BytesIO()
            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the exporter's advice on LSTM batch sizes and instance norm
                torch.onnx.export(
                    module,
                    (probe,),
                    buffer,
                    input_names=[input_name],
                    output_names=["output"],
                    dynamic_axes={input_name: dynamic, "output": {0: dynamic[0]}},
                    opset_version=OPSET,
                    dynamo=False,
                )
            directory.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(path, buffer.getvalue())
            log.info("onnx: exported %s to %s", name, path)
        options = ort.SessionOptions()
        options.intra_op_num_threads = torch.get_num_threads()
        options.inter_op_num_threads = 1
        # a waiting thread sleeps instead of spinning: on a CPU shared with the parent and a warm child, a
        # spinning thread holds a core the thread it waits for needs (1.06x faster and 18 % less CPU alone)
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.log_severity_level = 3
        runner = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        if checked.exists() and float(checked.read_text()) <= tolerance:
            log.info(
                "onnx: %s runs in ONNX Runtime (%s, checked against torch when exported)", name, path.name
            )
            return OnnxModel(runner, input_name)
        with torch.inference_mode():
            expected = module(probe).float().numpy()
        got = runner.run(None, {input_name: probe.numpy()})[0]
        difference = float(np.abs(expected - got).max())
        if difference <= tolerance:
            atomic_write_bytes(checked, f"{difference!r}\n".encode())
    except Exception as exc:  # any failure keeps the torch path, which is always there
        if is_oom(exc):
            raise
        log.warning(
            "onnx: %s stays on torch: %s: %s", name, type(exc).__name__, " ".join(str(exc).split())[:200]
        )
        return None
    if not difference <= tolerance:
        log.warning(
            "onnx: %s stays on torch: ONNX Runtime differs by %.2e on the probe (tolerance %.0e)",
            name,
            difference,
            tolerance,
        )
        return None
    log.info("onnx: %s runs in ONNX Runtime (differs from torch by %.1e on the probe)", name, difference)
    return OnnxModel(runner, input_name)


class OnnxModel:
    """A callable like the torch module: float32 tensor in, float32 tensor out."""

    def __init__(self, runner, input_name: str) -> None:
        self.runner = runner
        self.input_name = input_name

    def __call__(self, inputs: torch.Tensor) -> torch.Tensor:
        array = np.ascontiguousarray(inputs.detach().cpu().numpy(), dtype=np.float32)
        return torch.from_numpy(self.runner.run(None, {self.input_name: array})[0])
