"""How a stage child ended: its exit status read as one :class:`Outcome` (and, when killed, the signal).

A fact about the process, so it lives beside the executor that watches the child; what to do next
(the one retry policy) is the run's (``orchestrator.run.outcome``). Pure, tested without processes.
"""

from __future__ import annotations

import signal as _signal
from enum import Enum

from contracts import ExitCode


class Outcome(str, Enum):  # noqa: UP042 - StrEnum would change what str() of a member prints
    OK = "ok"
    #: an unexpected Python error inside the child
    ERROR = "error"
    OOM = "oom"
    CONTRACT_ERROR = "contract_error"
    #: killed by a signal (SIGKILL from the kernel's OOM killer or a user, SIGSEGV, ...)
    KILLED = "killed"
    INTERRUPTED = "interrupted"
    #: never started: a hook refused it (e.g. its GPU lacks the free memory the stage needs)
    REFUSED = "refused"
    #: a disk the child writes to is full: the run stops (nothing fails; a rerun resumes)
    DISK_FULL = "disk_full"


def outcome_of(exitcode: int | None) -> tuple[Outcome, int | None]:
    """Map a child's exit status to an outcome and, when killed, the signal number."""
    if exitcode is None:
        raise ValueError("the child has not exited")
    if exitcode < 0:
        return Outcome.KILLED, -exitcode
    try:
        code = ExitCode(exitcode)
    except ValueError:
        return Outcome.ERROR, None
    return {
        ExitCode.OK: Outcome.OK,
        ExitCode.OOM: Outcome.OOM,
        ExitCode.CONTRACT_ERROR: Outcome.CONTRACT_ERROR,
        ExitCode.INTERRUPTED: Outcome.INTERRUPTED,
        ExitCode.DISK_FULL: Outcome.DISK_FULL,
    }.get(code, Outcome.ERROR), None


def signal_name(number: int) -> str:
    """``SIGKILL`` for 9; ``signal 99`` for a number Python does not name."""
    try:
        return _signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
