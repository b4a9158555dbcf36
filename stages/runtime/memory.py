"""Memory inside a stage child: recognising out-of-memory, and checkpoints in the seeds' log format.

:func:`is_oom` tells an allocation failure (CUDA, cuDNN, cuBLAS, CTranslate2, the CPU allocator,
``MemoryError``) from any other error, without importing torch.

On a CUDA device (torch already imported by the stage)::

    [GPU Memory] asr model loaded: Allocated: 1.52GB (6.3%) | Reserved: 1.75GB (7.3%) | Free: 20.10GB | Total: 23.99GB
    NOTICE: GPU memory usage is elevated (72.4%). Monitor for potential OOM conditions.
    WARNING: GPU memory usage is critically high (88.0%). Consider reducing batch size or using a smaller model.

On the CPU (no CUDA, or a stage without torch such as ``audio``)::

    [CPU Memory] audio model loaded: RSS: 0.21GB | Peak RSS: 0.21GB (CPU run: process RSS, not VRAM)

"GB" is 1024**3 bytes, as torch and the seeds' logs count it. Allocated and
Reserved are torch's caching allocator; memory that other libraries allocate
themselves (CTranslate2 in the ``asr`` stage) shows only in Free, and in the
parent's NVML per-process readings. Torch is never imported here just to take
a reading: a stage that did not import it is measured by its RSS.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import resource
import sys
import time

from contracts import StageRequest
from contracts.perf import PERF_LOG_ENV, CheckpointEvent, MemoryCheckpoint, append_event
from contracts.report import CpuUsage
from contracts.stage_settings import HEAP_ENV
from contracts.units import MIB, gib

log = logging.getLogger(__name__)

# What the allocators of torch (CUDA and CPU), cuDNN, cuBLAS and CTranslate2 put in the plain RuntimeError they
# raise when an allocation fails. Only a RuntimeError itself (not a subclass, not another type) is read this way:
# an error about an input that merely says "out of memory" (a decoder's, ours) is not an allocation failure.
_ALLOCATOR_MARKERS = (
    "cuda out of memory",
    "cuda failed with error out of memory",  # CTranslate2
    "cudnn_status_not_enough_memory",
    "cudnn_status_alloc_failed",
    "cublas_status_alloc_failed",
    "defaultcpuallocator: can't allocate memory",
    "std::bad_alloc",
)


def is_oom(exc: BaseException) -> bool:
    """True for an allocation failure: ``MemoryError``, torch's ``OutOfMemoryError`` (CUDA), and the
    RuntimeError of the CUDA / CPU allocators, cuDNN, cuBLAS and CTranslate2 (also when chained)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, MemoryError):
            return True
        # torch.OutOfMemoryError (torch.cuda.OutOfMemoryError)
        if type(current).__name__ == "OutOfMemoryError":
            return True
        if type(current) is RuntimeError:
            message = str(current).lower()
            if any(marker in message for marker in _ALLOCATOR_MARKERS):
                return True
        current = current.__cause__ or current.__context__
    return False


def peak_rss_mb() -> float:
    """Peak resident set size of this process, in MiB."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports KiB, macOS bytes
    return peak / 1024 / 1024 if sys.platform == "darwin" else peak / 1024


# glibc's mallopt parameters (<malloc.h>)
_M_TRIM_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -4, -8
#: the heap policy this process applied (configure_heap runs once per process)
_heap_policy: str | None = None


def configure_heap(policy: str | None = None) -> str:
    """Apply the heap policy (``HEAP_ENV`` when ``policy`` is None) to this process, once; return what holds.

    ``keep`` (the default): glibc's malloc gets one arena, no ``mmap`` for large blocks and no
    trimming, so a block a stage frees is reused by its next allocation instead of going back
    to the kernel. The C library's defaults give every thread of a stage (CTranslate2's and
    OpenMP's) an arena of its own, unmap a thread arena's whole heap when it empties and
    ``mmap`` every block over 32 MiB; each new activation tensor then faults in fresh zeroed
    pages: 36 million page faults, and 72 of the ASR stage's 198 CPU seconds spent in the kernel,
    on ``bench/batch.py``'s 28-minute batch (the two compared: CHANGELOG.md). The trim
    threshold is an int, so "no trimming" means none below 2 GiB free. The cost is that a child's memory
    stays at its peak until it exits, which a stage child does after its chunk. Call it
    before the stage's libraries start their threads (a thread keeps the arena it has).

    ``system`` leaves the C library as it is; so does a C library without ``mallopt`` (not glibc).
    """
    global _heap_policy
    if _heap_policy is not None:
        return _heap_policy
    wanted = policy if policy is not None else os.environ.get(HEAP_ENV, "keep")
    _heap_policy = "system"
    if wanted == "system":
        return _heap_policy
    if wanted != "keep":
        log.warning(
            "%s=%r is not a heap policy (keep or system); keeping the C library's defaults", HEAP_ENV, wanted
        )
        return _heap_policy
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        log.info("heap: this C library has no mallopt; its defaults stay")
        return _heap_policy
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    # mallopt returns 1 on success; the trim threshold is an int, so "never" is its largest value
    if all(
        mallopt(param, value) == 1
        for param, value in ((_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, 2**31 - 1))
    ):
        _heap_policy = "keep"
    else:
        log.warning("heap: glibc refused a mallopt setting; freed memory may still go back to the kernel")
    return _heap_policy


def heap_policy() -> str | None:
    """The heap policy :func:`configure_heap` applied to this process (None: not called yet)."""
    return _heap_policy


def cpu_counters() -> resource.struct_rusage:
    """The kernel's counters for this process (all its threads) now."""
    return resource.getrusage(resource.RUSAGE_SELF)


def cpu_usage_since(before: resource.struct_rusage) -> CpuUsage:
    """What this process used between ``before`` (from :func:`cpu_counters`) and now."""
    now = cpu_counters()
    return CpuUsage(
        user_s=round(now.ru_utime - before.ru_utime, 3),
        system_s=round(now.ru_stime - before.ru_stime, 3),
        minor_faults=now.ru_minflt - before.ru_minflt,
        major_faults=now.ru_majflt - before.ru_majflt,
        voluntary_switches=now.ru_nvcsw - before.ru_nvcsw,
        involuntary_switches=now.ru_nivcsw - before.ru_nivcsw,
    )


def _gb(mib: float | None) -> str:
    return gib(mib, unit="GB")


def _pct(part: float | None, total: float | None) -> float:
    return 100.0 * (part or 0.0) / total if total else 0.0


def format_checkpoint(stage: str, checkpoint: MemoryCheckpoint) -> str:
    """The checkpoint's log line (pure)."""
    head = f"{stage} {checkpoint.point}"
    if checkpoint.kind == "gpu":
        total = checkpoint.total_mb
        return (
            f"[GPU Memory] {head}: Allocated: {_gb(checkpoint.allocated_mb)}"
            f" ({_pct(checkpoint.allocated_mb, total):.1f}%)"
            f" | Reserved: {_gb(checkpoint.reserved_mb)} ({_pct(checkpoint.reserved_mb, total):.1f}%)"
            f" | Free: {_gb(checkpoint.free_mb)} | Total: {_gb(total)}"
        )
    return (
        f"[CPU Memory] {head}: RSS: {_gb(checkpoint.rss_mb)} | Peak RSS: {_gb(checkpoint.peak_rss_mb)}"
        " (CPU run: process RSS, not VRAM)"
    )


def pressure(
    allocated_pct: float, notice_pct: float = 70.0, warning_pct: float = 85.0
) -> tuple[int, str] | None:
    """(log level, message) when allocated memory is above a threshold, else None (pure)."""
    if allocated_pct > warning_pct:
        return logging.WARNING, (
            f"WARNING: GPU memory usage is critically high ({allocated_pct:.1f}%). "
            "Consider reducing batch size or using a smaller model."
        )
    if allocated_pct > notice_pct:
        return logging.INFO, (
            f"NOTICE: GPU memory usage is elevated ({allocated_pct:.1f}%). Monitor for potential OOM conditions."
        )
    return None


def cuda_torch(device: str):
    """torch, when the stage already imported it and runs on an available CUDA device; else None."""
    torch = sys.modules.get("torch")
    if torch is None or not device.startswith("cuda"):
        return None
    try:
        return torch if torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001 - a broken driver must not stop the stage; measure RSS instead
        return None


def read_checkpoint(point: str, device: str) -> MemoryCheckpoint:
    """Measure memory now: torch's allocator and the device on CUDA, the process's RSS otherwise."""
    now = time.time()
    torch = cuda_torch(device)
    if torch is not None:
        dev = torch.device(device)
        free, total = torch.cuda.mem_get_info(dev)
        return MemoryCheckpoint(
            point=point,
            t=now,
            kind="gpu",
            allocated_mb=torch.cuda.memory_allocated(dev) / MIB,
            reserved_mb=torch.cuda.memory_reserved(dev) / MIB,
            free_mb=free / MIB,
            total_mb=total / MIB,
        )
    import psutil

    rss = psutil.Process().memory_info().rss / MIB
    # the kernel updates the high-water mark lazily: never report a peak below the current value
    return MemoryCheckpoint(point=point, t=now, kind="cpu", rss_mb=rss, peak_rss_mb=max(rss, peak_rss_mb()))


def configure_cuda(device: str, tf32: bool) -> bool:
    """Turn TF32 on where the GPU has it (Ampere and newer); return whether it is on."""
    torch = cuda_torch(device)
    if torch is None:
        return False
    major, _ = torch.cuda.get_device_capability(torch.device(device))
    enabled = tf32 and major >= 8
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled
    log.info(
        "TF32: %s (%s, compute capability %d.x)",
        enabled,
        torch.cuda.get_device_name(torch.device(device)),
        major,
    )
    return enabled


#: the fraction this process was told to ignore (it runs on the CPU), once said
_fraction_ignored: float | None = None


def limit_gpu_memory(device: str, fraction: float | None) -> float | None:
    """Cap this process's torch allocator on ``device`` at ``fraction`` of the card's memory (beyond it an
    allocation raises torch's ``OutOfMemoryError``, which :func:`is_oom` knows); return the fraction applied.

    None when there is nothing to cap: no ``fraction``, or the stage does not run torch on a CUDA device
    (the CPU, or a stage without torch), which is logged once per process. Call it before the model loads.
    Memory that other libraries allocate themselves (CTranslate2) is not under the cap.
    """
    global _fraction_ignored
    if fraction is None:
        return None
    torch = cuda_torch(device)
    if torch is None:
        if _fraction_ignored is None:
            _fraction_ignored = fraction
            log.info(
                "gpu_memory_fraction %g ignored: this child does not run torch on a CUDA device (device %s)",
                fraction,
                device,
            )
        return None
    dev = torch.device(device)
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    torch.cuda.set_per_process_memory_fraction(fraction, index)
    total = torch.cuda.get_device_properties(index).total_memory / MIB
    log.info(
        "GPU memory cap: this child's torch allocator may take %g of cuda:%d, %s of %s",
        fraction,
        index,
        _gb(fraction * total),
        _gb(total),
    )
    return fraction


class MemoryCheckpoints:
    """The checkpoints of one stage child: logged, kept for the StageResult, appended to the performance log."""

    def __init__(self, stage: str, device: str, request: StageRequest) -> None:
        self.stage = stage
        self.device = device
        self.attempt = request.attempt
        self.options = request.memory
        self.perf_log = request.env.get(PERF_LOG_ENV) or None
        self.taken: list[MemoryCheckpoint] = []
        self._perf_failed = False
        self.tf32 = configure_cuda(device, self.options.tf32)
        #: the cap on this child's GPU memory, as applied (None: none)
        self.fraction = limit_gpu_memory(device, self.options.gpu_memory_fraction)

    def check(self, point: str) -> MemoryCheckpoint:
        checkpoint = read_checkpoint(point, self.device)
        self.taken.append(checkpoint)
        log.info("%s", format_checkpoint(self.stage, checkpoint))
        if checkpoint.kind == "gpu":
            warned = pressure(
                checkpoint.allocated_pct or 0.0, self.options.notice_pct, self.options.warning_pct
            )
            if warned is not None:
                log.log(*warned)
        self._append(checkpoint)
        return checkpoint

    def check_quietly(self, point: str) -> None:
        """A checkpoint on the way out of a failure: never replaces the error being raised."""
        try:
            self.check(point)
        except Exception as exc:  # noqa: BLE001 - a checkpoint must not hide the failure under way
            log.debug("no %r checkpoint: %s", point, exc)

    def after_item(self, number: int, total: int) -> None:
        if self.options.every_item:
            self.check(f"after item {number}/{total}")

    def peaks(self) -> dict[str, float | None]:
        """Peak allocated / reserved VRAM of this child in MiB (None when it ran without CUDA)."""
        torch = cuda_torch(self.device)
        if torch is None:
            return {"peak_vram_mb": None, "peak_vram_reserved_mb": None}
        dev = torch.device(self.device)
        return {
            "peak_vram_mb": torch.cuda.max_memory_allocated(dev) / MIB,
            "peak_vram_reserved_mb": torch.cuda.max_memory_reserved(dev) / MIB,
        }

    def result_fields(self) -> dict:
        """Fields for the StageResult: peaks and every checkpoint taken."""
        return {**self.peaks(), "checkpoints": list(self.taken)}

    def _append(self, checkpoint: MemoryCheckpoint) -> None:
        if not self.perf_log or self._perf_failed:
            return
        try:
            append_event(
                self.perf_log,
                CheckpointEvent.of_checkpoint(checkpoint, self.stage, self.attempt, os.getpid()),
            )
        except OSError as exc:
            self._perf_failed = True
            log.warning("cannot append to performance log %s: %s", self.perf_log, exc)
