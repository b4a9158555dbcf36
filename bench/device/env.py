"""The environment section: Python, torch and its CUDA, the GPU through NVML, and whether CTranslate2 runs there.

    python3 bench/device/env.py [--device cuda] [--out DIR] [--weights DIR]

torch and CTranslate2 are asked in child processes (so this process makes no CUDA context and a crash or
hang there is a recorded answer); NVML is read here, as the orchestrator reads it. Nothing raises: a
failure is recorded as its error text, which is the answer where a question fails (for CTranslate2, built
for CUDA 12, on the image's CUDA 13: whether it counts the GPU, and whether a tiny Whisper loads and runs).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.device.common import Context

#: the folder under ``ctx.weights`` prepare.py builds the tiny CTranslate2 Whisper into
TINY_CT2 = "ct2-whisper-tiny-random"
#: the packages whose versions and places (image or carried) the report gives
PACKAGES = (
    "torch",
    "transformers",
    "sentence-transformers",
    "huggingface-hub",
    "numpy",
    "scipy",
    "onnxruntime",
    "nvidia-ml-py",
    "psutil",
    "rich",
    "typer",
    "httpx",
    "uvloop",
    "prometheus-client",
    "typing-extensions",
    "anyio",
    "click",
    "h11",
    "idna",
    "pyyaml",
    "annotated-doc",
    "pydantic",
    "pydantic-core",
    "pydantic-settings",
    "multiprocess",
    "dill",
    "av",
    "fastapi",
    "starlette",
    "uvicorn",
    "python-multipart",
    "ctranslate2",
    "faster-whisper",
    "whisperx",
    "speechbrain",
)
PROBE_TIMEOUT_S = 240.0

# Each probe prints one line "PROBE-JSON: {...}" last; every step catches its own error.
_PRELUDE = r"""
import json, sys, time, traceback
out = {}
def step(name, fn):
    t = time.perf_counter()
    try:
        out[name] = fn()
    except BaseException as exc:  # the error text is the answer
        out[name] = None
        out[name + "_error"] = (type(exc).__name__ + ": " + str(exc))[:2000]
    out[name + "_s"] = round(time.perf_counter() - t, 3)
    return out[name]
"""

TORCH_PROBE = (
    _PRELUDE
    + r"""
device = sys.argv[1]
torch = step("import", lambda: __import__("torch"))
if torch is not None:
    out["import"] = True
    out["version"] = torch.__version__
    out["cuda_version"] = torch.version.cuda
    out["cudnn"] = step("cudnn", lambda: torch.backends.cudnn.version())
    out["cuda_available"] = step("cuda_available", lambda: torch.cuda.is_available())
    if out["cuda_available"]:
        out["device_count"] = torch.cuda.device_count()
        props = torch.cuda.get_device_properties(0)
        out["name"] = props.name
        out["total_mib"] = round(props.total_memory / 2**20)
        out["capability"] = list(torch.cuda.get_device_capability(0))
        out["multiprocessors"] = props.multi_processor_count
    def tiny_op():
        x = torch.arange(6, dtype=torch.float32, device=device).reshape(2, 3)
        return float((x @ x.T).sum().item())
    step("matmul_on_device", tiny_op)
print("PROBE-JSON: " + json.dumps(out, default=str))
"""
)

CT2_PROBE = (
    _PRELUDE
    + r"""
import ctypes
device, model_dir = sys.argv[1], sys.argv[2]
ct2 = step("import", lambda: __import__("ctranslate2"))
for lib in ("libcublas.so.12", "libcublas.so.13", "libcudnn.so.9", "libcuda.so.1"):
    step("dlopen " + lib, lambda lib=lib: bool(ctypes.CDLL(lib)))
if ct2 is not None:
    out["import"] = True
    out["version"] = ct2.__version__
    out["cuda_device_count"] = step("cuda_device_count", ct2.get_cuda_device_count)
    step("compute_types", lambda: sorted(ct2.get_supported_compute_types(device)))
    compute_type = "float16" if device.startswith("cuda") else "int8"
    out["model_dir"], out["compute_type"] = model_dir, compute_type
    if model_dir:
        model = step("load", lambda: ct2.models.Whisper(model_dir, device=device, compute_type=compute_type))
        if model is not None:
            out["load"] = True
            import numpy as np
            features = np.zeros((1, 80, 3000), dtype=np.float32)
            def encode():
                encoded = model.encode(ct2.StorageView.from_array(features), to_cpu=True)
                return list(encoded.shape)
            step("encode", encode)
            def generate():
                result = model.generate(
                    ct2.StorageView.from_array(features), [["<|startoftranscript|>"]], max_length=4
                )
                return result[0].sequences_ids
            step("generate", generate)
print("PROBE-JSON: " + json.dumps(out, default=str))
"""
)


def probe(code: str, *args: str, timeout: float = PROBE_TIMEOUT_S) -> dict:
    """Run ``code`` in a child Python with ``args``; its JSON answer, or what went wrong as text."""
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as exc:
        tail = (exc.stderr or b"")[-2000:]
        return {"error": f"timed out after {timeout:.0f} s", "stderr_tail": str(tail)}
    except OSError as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    wall = round(time.perf_counter() - t0, 3)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("PROBE-JSON: "):
            data = json.loads(line[len("PROBE-JSON: ") :])
            data["wall_s"] = wall
            if proc.returncode != 0:
                data["exit_status"] = proc.returncode
            return data
    return {
        "error": f"no answer (exit status {proc.returncode}: a crash in native code?)",
        "stderr_tail": proc.stderr[-3000:],
        "stdout_tail": proc.stdout[-1000:],
        "wall_s": wall,
    }


def nvml() -> dict:
    """The GPU as NVML sees it (orchestrator.gpu.nvml's reader, plus the driver's CUDA version)."""
    data: dict = {}
    try:
        from orchestrator.gpu.nvml import NvmlReader

        snapshot = NvmlReader().read()
        data["snapshot"] = snapshot.model_dump(mode="json")
    except Exception as exc:  # noqa: BLE001 - recorded: the report says why there is no reading
        data["snapshot_error"] = f"{type(exc).__name__}: {exc}"
    try:
        import pynvml

        pynvml.nvmlInit()
        data["driver"] = pynvml.nvmlSystemGetDriverVersion()
        cuda = pynvml.nvmlSystemGetCudaDriverVersion()
        data["cuda_driver"] = f"{cuda // 1000}.{cuda % 1000 // 10}"
        data["devices"] = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
            data["devices"].append(
                {
                    "index": index,
                    "name": pynvml.nvmlDeviceGetName(handle),
                    "total_mib": round(mem.total / 2**20),
                    "used_mib": round(mem.used / 2**20),
                }
            )
    except Exception as exc:  # noqa: BLE001 - recorded: no NVIDIA driver here is an answer too
        data["pynvml_error"] = f"{type(exc).__name__}: {exc}"
    return data


def packages() -> dict:
    """Each of :data:`PACKAGES`: its version and where it comes from, or that it is absent."""
    found = {}
    for name in PACKAGES:
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
            continue
        found[name] = {"version": dist.version, "at": str(dist.locate_file(""))}
    return found


def find_ct2_whisper(weights: Path) -> Path | None:
    """The tiny CTranslate2 Whisper prepare.py builds, else the smallest CTranslate2 Whisper under weights."""
    if (weights / TINY_CT2 / "model.bin").is_file():
        return weights / TINY_CT2
    found = []
    for config in weights.glob("*/config.json") if weights.is_dir() else []:
        model = config.with_name("model.bin")
        if model.is_file() and "alignment_heads" in config.read_text(errors="replace"):
            found.append((model.stat().st_size, config.parent))
    return min(found)[1] if found else None


def run(ctx: Context) -> dict:
    t0 = time.perf_counter()
    data: dict = {
        "device": ctx.device,
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "platform": platform.platform(),
        "libc": " ".join(platform.libc_ver()),
    }
    try:
        data["packages"] = packages()
    except Exception as exc:  # noqa: BLE001 - recorded, the other questions still get answered
        data["packages_error"] = f"{type(exc).__name__}: {exc}"
    data["nvml"] = nvml()
    data["torch"] = probe(TORCH_PROBE, ctx.device)
    model = find_ct2_whisper(ctx.weights)
    data["ctranslate2"] = probe(CT2_PROBE, ctx.device, str(model) if model else "")
    if model is None:
        data["ctranslate2"]["model_error"] = (
            f"no CTranslate2 Whisper under {ctx.weights} (prepare.py builds one)"
        )
    data["wall_s"] = round(time.perf_counter() - t0, 3)
    ctx.write("env", data)
    return data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, default=Path("/tmp/device-out"))
    parser.add_argument("--weights", type=Path, default=None, help="default: .kit/weights")
    args = parser.parse_args(argv)
    ctx = Context(out=args.out, device=args.device)
    if args.weights is not None:
        ctx.weights = args.weights
    print(json.dumps(run(ctx), indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
