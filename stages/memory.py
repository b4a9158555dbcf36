"""Recognising out-of-memory errors without importing torch."""

from __future__ import annotations

import resource
import sys

# Messages raised by torch (CUDA and CPU allocators), cuDNN, cuBLAS and
# CTranslate2 when an allocation fails.
_OOM_MARKERS = (
    "out of memory",
    "cudnn_status_not_enough_memory",
    "cudnn_status_alloc_failed",
    "cublas_status_alloc_failed",
    "defaultcpuallocator: can't allocate memory",
    "can't allocate memory",
    "std::bad_alloc",
)


def is_oom(exc: BaseException) -> bool:
    """True for CUDA OOM, cuDNN OOM, CPU allocator OOM and MemoryError (also when chained)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, MemoryError):
            return True
        if type(current).__name__ == "OutOfMemoryError":  # torch.OutOfMemoryError
            return True
        message = str(current).lower()
        if any(marker in message for marker in _OOM_MARKERS):
            return True
        current = current.__cause__ or current.__context__
    return False


def peak_rss_mb() -> float:
    """Peak resident set size of this process, in MiB."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports KiB, macOS bytes
    return peak / 1024 / 1024 if sys.platform == "darwin" else peak / 1024
