"""The one exit-code enum: for stage children and for the `pipeline` CLI."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    #: child: an unexpected Python error; CLI: at least one input failed, or a file of the output folder
    #: is damaged or cannot be read or written (``export``, ``speakers``: one line says which)
    FAILED = 1
    #: CLI: bad command line or settings (also: ``speakers name`` would replace another voice profile
    #: without ``--force``)
    USAGE = 2
    #: child: out of memory (CUDA, cuDNN, CPU allocator, MemoryError)
    OOM = 3
    #: child: its request file or an input artifact broke the contract
    CONTRACT_ERROR = 4
    #: child: a disk it writes to is full (it stopped; the parent stops the run);
    #: CLI: the run stopped because a disk was full (the report says where; rerun to resume)
    DISK_FULL = 5
    #: interrupted by the user (Ctrl-C)
    INTERRUPTED = 130
    #: CLI: stopped by SIGTERM (a service manager), after writing the report
    TERMINATED = 143
