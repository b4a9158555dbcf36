"""The one exit-code enum: for stage children and for the `pipeline` CLI."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    #: child: an unexpected Python error; CLI: at least one input failed
    FAILED = 1
    #: CLI: bad command line or settings
    USAGE = 2
    #: child: out of memory (CUDA, cuDNN, CPU allocator, MemoryError)
    OOM = 3
    #: child: its request file or an input artifact broke the contract
    CONTRACT_ERROR = 4
    #: interrupted by the user (Ctrl-C)
    INTERRUPTED = 130
    #: CLI: stopped by SIGTERM (a service manager), after writing the report
    TERMINATED = 143
