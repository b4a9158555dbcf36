"""Out-of-memory errors are recognised from their type or message, without torch."""

from __future__ import annotations

import pytest

from stages.runtime.memory import is_oom


class OutOfMemoryError(RuntimeError):
    """Same name as torch.OutOfMemoryError (torch.cuda.OutOfMemoryError)."""


@pytest.mark.parametrize(
    "exc",
    [
        MemoryError(),
        OutOfMemoryError("CUDA out of memory. Tried to allocate 7.50 GiB"),
        RuntimeError("CUDA out of memory. Tried to allocate 2.00 MiB (GPU 0; 14.75 GiB total capacity)"),
        RuntimeError("cuDNN error: CUDNN_STATUS_NOT_ENOUGH_MEMORY"),
        RuntimeError(
            "[enforce fail at alloc_cpu.cpp:124] data. DefaultCPUAllocator: can't allocate memory: "
            "you tried to allocate 17179869184 bytes"
        ),
        RuntimeError("CUDA failed with error out of memory"),  # CTranslate2
    ],
)
def test_oom_errors_are_recognised(exc):
    assert is_oom(exc)


def test_oom_wrapped_in_another_error_is_recognised():
    try:
        try:
            raise MemoryError()
        except MemoryError as inner:
            raise ValueError("batch failed") from inner
    except ValueError as outer:
        assert is_oom(outer)


@pytest.mark.parametrize("exc", [RuntimeError("shape mismatch"), ValueError("bad input"), KeyError("x")])
def test_other_errors_are_not_oom(exc):
    assert not is_oom(exc)


@pytest.mark.parametrize(
    "exc",
    [
        __import__("contracts").InputError("decoder: out of memory while reading frame 12"),
        ValueError("the file says: out of memory"),
        type("DecoderError", (RuntimeError,), {})("av: out of memory"),
    ],
)
def test_an_input_whose_error_merely_says_out_of_memory_is_not_oom(exc):
    assert not is_oom(exc)


USAGE_PROBE = r"""
import time
from stages.runtime.memory import cpu_counters, cpu_usage_since
before = cpu_counters()
t0 = time.process_time()
while time.process_time() - t0 < 0.3:  # 0.3 s of CPU
    pass
block = bytearray(64 * 1024 * 1024)  # 64 MiB of fresh memory, every page written
block[::4096] = b"x" * len(block[::4096])
time.sleep(0.05)  # gives the CPU up once
print(cpu_usage_since(before).model_dump_json())
"""


def test_cpu_usage_counts_this_process_work_and_the_pages_it_touches():
    import subprocess
    import sys

    from contracts.report import CpuUsage

    # Given a fresh process (an earlier test's freed pages in this one would be handed back without a fault)
    # When it spins for 0.3 s of CPU, writes to 64 MiB of fresh memory and sleeps once
    out = subprocess.run([sys.executable, "-c", USAGE_PROBE], capture_output=True, text=True, check=True)
    usage = CpuUsage.model_validate_json(out.stdout)
    # Then its CPU seconds include the spin, a fault per fresh 4 KiB page (at least half of them), and the
    # sleep is a voluntary switch
    assert usage.cpu_s >= 0.29 and usage.user_s > 0, usage
    assert usage.minor_faults >= 64 * 1024 // 4 // 2, usage
    assert usage.voluntary_switches >= 1, usage


HEAP_PROBE = r"""
import resource, sys
from stages.runtime.memory import configure_heap
applied = configure_heap(sys.argv[1])
faults = []
for _ in range(5):  # allocate, write every page of, and free 64 MiB, five times
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block = bytearray(64 << 20)
    block[::4096] = b"x" * len(block[::4096])
    del block
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(applied, *faults)
"""


@pytest.mark.parametrize("policy", ["keep", "system"])
def test_the_keep_heap_reuses_freed_memory_instead_of_faulting_in_fresh_pages(policy):
    import subprocess
    import sys

    # a fresh process each: the policy holds for the whole process
    out = subprocess.run(
        [sys.executable, "-c", HEAP_PROBE, policy], capture_output=True, text=True, check=True
    )
    applied, *faults = out.stdout.split()
    later = sum(map(int, faults[1:]))
    pages = 4 * (64 << 20) // 4096
    assert applied == policy
    if policy == "keep":
        # the first block faults its pages in; the next four reuse them
        assert int(faults[0]) > pages // 8 and later < pages // 20, faults
    else:
        # the C library's default maps every block this large anew, and every page faults again
        assert later > pages // 2, faults
