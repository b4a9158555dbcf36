"""Out-of-memory errors are recognised from their type or message, without torch."""

from __future__ import annotations

import pytest

from stages.memory import is_oom


class OutOfMemoryError(RuntimeError):
    """Same name as torch.OutOfMemoryError (torch.cuda.OutOfMemoryError)."""


@pytest.mark.parametrize(
    "exc",
    [
        MemoryError(),
        OutOfMemoryError("CUDA out of memory. Tried to allocate 7.50 GiB"),
        RuntimeError("CUDA out of memory. Tried to allocate 2.00 MiB (GPU 0; 14.75 GiB total capacity)"),
        RuntimeError("cuDNN error: CUDNN_STATUS_NOT_ENOUGH_MEMORY"),
        RuntimeError("[enforce fail at alloc_cpu.cpp:124] data. DefaultCPUAllocator: can't allocate memory: you tried to allocate 17179869184 bytes"),
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


@pytest.mark.parametrize("exc", [
    __import__("contracts").InputError("decoder: out of memory while reading frame 12"),
    ValueError("the file says: out of memory"),
    type("DecoderError", (RuntimeError,), {})("av: out of memory"),
])
def test_an_input_whose_error_merely_says_out_of_memory_is_not_oom(exc):
    assert not is_oom(exc)
