"""The child's model clock: seconds spent inside model calls, apart from the host work around them.

A stage wraps each model call (a Whisper encode or generate, an encoder's forward, an embedder's
``encode``) in :func:`model_time`; the shared loop reads :func:`model_seconds` before and after the items
and reports the difference as ``StageResult.model_s``. Nested blocks count once (the outermost), so a
helper and its caller may both wrap. Calls that return before the device is done (torch on CUDA queues
kernels) are counted until they return; the device's remaining work lands in whatever next waits for it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_total = 0.0
_depth = threading.local()


@contextmanager
def model_time() -> Iterator[None]:
    """Count the block's wall seconds as model time (once, however deeply nested, per thread)."""
    depth = getattr(_depth, "n", 0)
    _depth.n = depth + 1
    started = time.perf_counter()
    try:
        yield
    finally:
        _depth.n = depth
        if depth == 0:
            spent = time.perf_counter() - started
            global _total
            with _lock:
                _total += spent


def model_seconds() -> float:
    """Model seconds counted so far in this process."""
    with _lock:
        return _total
