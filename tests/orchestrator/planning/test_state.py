"""An input's plan stays as planned; its run state says how the run went for it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from orchestrator.planning.inputs import Input
from orchestrator.planning.state import InputState


def _plan(tmp_path: Path, notes: tuple[str, ...] = ()) -> Input:
    return Input(
        id="talks/a", source=tmp_path / "a.wav", directory=tmp_path / "out" / "talks" / "a", notes=notes
    )


def test_the_plan_is_immutable_and_the_state_starts_with_its_notes(tmp_path):
    plan = _plan(tmp_path, notes=("given 2 times (also as x.wav); processed once",))
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.id = "other"  # type: ignore[misc]
    state = InputState(plan)
    state.notes.append("no speakers from diarization: out of memory")
    assert plan.notes == ("given 2 times (also as x.wav); processed once",), (
        "the run's notes stay in the state"
    )
    assert state.notes == [*plan.notes, "no speakers from diarization: out of memory"]


def test_the_state_reads_the_plan_through(tmp_path):
    state = InputState(_plan(tmp_path))
    assert (state.id, state.source, state.directory, state.url) == (
        "talks/a",
        tmp_path / "a.wav",
        tmp_path / "out" / "talks" / "a",
        None,
    )
    assert state.shown == str(tmp_path / "a.wav")
    assert state.artifact("transcript") == state.directory / "transcript.json"
    assert state.artifact("audio") == state.directory / ".work" / "audio.json", "decoded audio is scratch"


def test_a_url_is_shown_without_its_password(tmp_path):
    plan = dataclasses.replace(_plan(tmp_path), url="sftp://alice:secret@host/talks/a.wav")
    assert InputState(plan).shown == "sftp://alice:***@host/talks/a.wav"


@pytest.mark.parametrize(
    ("change", "status", "alive"),
    [
        ({}, "failed", True),  # not complete (yet): a run that ends here reports it failed
        ({"complete": True}, "ok", True),
        ({"complete": True, "damage": "decoded 12.0 s of 30.0 s"}, "partial", True),
        ({"error": "decoding failed", "failed_stage": "audio"}, "failed", False),
        ({"interrupted": True}, "interrupted", False),
        ({"interrupted": True, "complete": True}, "interrupted", False),
    ],
)
def test_status_and_alive(tmp_path, change, status, alive):
    state = InputState(_plan(tmp_path))
    for name, value in change.items():
        setattr(state, name, value)
    assert (state.status, state.alive) == (status, alive)
