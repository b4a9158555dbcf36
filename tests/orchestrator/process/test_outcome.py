"""A child's exit status read as one outcome, as a pure function."""

from __future__ import annotations

import signal

import pytest

from contracts import ExitCode
from orchestrator.process.outcome import Outcome, outcome_of, signal_name


@pytest.mark.parametrize(
    ("exitcode", "expected"),
    [
        (0, (Outcome.OK, None)),
        (ExitCode.FAILED, (Outcome.ERROR, None)),
        (ExitCode.OOM, (Outcome.OOM, None)),
        (ExitCode.CONTRACT_ERROR, (Outcome.CONTRACT_ERROR, None)),
        (ExitCode.INTERRUPTED, (Outcome.INTERRUPTED, None)),
        (ExitCode.DISK_FULL, (Outcome.DISK_FULL, None)),
        (-signal.SIGKILL, (Outcome.KILLED, 9)),
        (-signal.SIGSEGV, (Outcome.KILLED, 11)),
        (77, (Outcome.ERROR, None)),
    ],
)
def test_outcome_of_exit_status(exitcode, expected):
    assert outcome_of(int(exitcode)) == expected


def test_a_child_still_running_has_no_outcome():
    with pytest.raises(ValueError, match="not exited"):
        outcome_of(None)


def test_outcomes_print_as_their_values():
    # the value is what reports and logs show (str, Enum: not StrEnum)
    assert Outcome.DISK_FULL.value == "disk_full" and Outcome("oom") is Outcome.OOM


def test_signal_names():
    assert signal_name(9) == "SIGKILL" and signal_name(11) == "SIGSEGV"
    assert signal_name(999) == "signal 999"
