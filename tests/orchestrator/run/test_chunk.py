"""One chunk's steps over hand-made run states: which inputs run a stage, and each outcome recorded."""

from __future__ import annotations

from pathlib import Path

from orchestrator import Settings
from orchestrator.planning.fingerprints import chain_fingerprints
from orchestrator.planning.inputs import Input
from orchestrator.planning.needs import REUSED, Resume
from orchestrator.planning.state import InputState
from orchestrator.registry import process_specs
from orchestrator.run.chunk import (
    RunContext,
    drop_partners,
    fetch_sources,
    partners,
    record,
    select,
    warm_next,
)
from orchestrator.run.runner import ItemOutcome

SETTINGS = Settings(_env_file=None)
SPECS = process_specs(SETTINGS)  # audio, asr, diarization, alignment, embeddings


class Journal:
    def __init__(self) -> None:
        self.events: list[tuple] = []

    def record(self, item: str, stage: str, status: str, **extra) -> None:
        self.events.append((item, stage, status, extra))


class Runner:
    def __init__(self) -> None:
        self.warmed: list[tuple[str, int]] = []

    def warm_up(self, spec, chunk):
        self.warmed.append((spec.name, chunk))
        return f"warm {spec.name}"


def _context(settings: Settings = SETTINGS, stopping: bool = False) -> RunContext:
    return RunContext(
        settings=settings,
        specs=SPECS,
        runner=Runner(),  # type: ignore[arg-type]
        journal=Journal(),  # type: ignore[arg-type]
        progress=None,  # type: ignore[arg-type]
        resume=Resume(settings, {}),
        stopping=lambda: stopping,
    )


def _chunk(tmp_path: Path, *ids: str) -> list[InputState]:
    chunk = [InputState(Input(id=i, source=tmp_path / f"{i}.wav", directory=tmp_path / i)) for i in ids]
    for state in chunk:
        chain_fingerprints(state, SPECS)
    return chunk


def test_select_runs_a_stage_for_the_live_inputs_that_need_it_and_marks_the_others_reused(tmp_path):
    a, b, c = _chunk(tmp_path, "a", "b", "c")
    c.error = "decoding failed"
    needed = {i: dict.fromkeys((s.name for s in SPECS), i == "a") for i in ("a", "b", "c")}
    assert select(_context(), [a, b, c], 1, needed) == [a]
    assert b.stages == {"asr": REUSED} and c.stages == {}, "a failed input is left as it is"


def test_record_puts_each_outcome_in_the_run_state_and_the_journal(tmp_path):
    chunk = _chunk(tmp_path, "ok", "reused", "failed", "interrupted")
    ctx = _context()
    asr = SPECS[1]
    outcomes = {
        "ok": ItemOutcome(ok=True, seconds=2.0, batch_size=4),
        "reused": ItemOutcome(ok=True, reused=True),
        "failed": ItemOutcome(ok=False, error="decoding failed", retries=1),
        "interrupted": ItemOutcome(ok=False, interrupted=True),
    }
    record(ctx, asr, chunk, outcomes)
    ok, reused, failed, interrupted = chunk
    assert [i.stages["asr"].status for i in chunk] == ["ok", "reused", "failed", "interrupted"]
    assert (ok.worked, reused.worked, ok.stages["asr"].batch_size) == (True, False, 4)
    assert (failed.error, failed.failed_stage, failed.stages["asr"].retries) == ("decoding failed", "asr", 1)
    assert interrupted.interrupted and interrupted.status == "interrupted"
    assert [(e[0], e[1], e[2]) for e in ctx.journal.events] == [
        ("ok", "asr", "ok"),
        ("reused", "asr", "reused"),
        ("failed", "asr", "failed"),
        ("interrupted", "asr", "interrupted"),
    ]
    assert ctx.journal.events[0][3] == {"fingerprint": ok.fingerprints["asr"], "error": None}


def test_a_fast_path_skip_goes_on_without_the_artifact_and_changes_what_depends_on_it(tmp_path):
    [state] = _chunk(tmp_path, "a")
    before = dict(state.fingerprints)
    diarization = SPECS[2]
    ctx = _context()
    record(ctx, diarization, [state], {"a": ItemOutcome(ok=False, skipped=True, error="out of memory at 1")})
    assert state.alive and state.skipped == {"diarization"}
    assert state.stages["diarization"].status == "skipped"
    assert state.notes == ["no speakers from diarization: out of memory at 1"]
    assert state.fingerprints["diarization"] == before["diarization"]
    assert state.fingerprints["alignment"] != before["alignment"], "a rerun redoes what went without it"


def test_the_next_stage_is_warmed_only_with_prefetch_and_when_a_live_input_needs_it(tmp_path):
    a, b = _chunk(tmp_path, "a", "b")
    needed = {
        "a": {s.name: s.name != "diarization" for s in SPECS},
        "b": dict.fromkeys((s.name for s in SPECS), True),
    }
    ctx = _context(SETTINGS.replace(prefetch=True))
    assert warm_next(ctx, 3, 0, [a, b], needed) == {1: "warm asr"}
    b.error = "failed"
    assert warm_next(ctx, 3, 1, [a, b], needed) == {}, "only b needed diarization, and it failed"
    assert warm_next(ctx, 3, len(SPECS) - 1, [a, b], needed) == {}, "no stage after the last"
    assert ctx.runner.warmed == [("asr", 3)]
    assert warm_next(_context(SETTINGS.replace(prefetch=False)), 3, 0, [a], needed) == {}


def test_prefetch_all_warms_every_later_stage_a_live_input_needs_once(tmp_path):
    a, b = _chunk(tmp_path, "a", "b")
    needed = {
        "a": {s.name: s.name != "diarization" for s in SPECS},
        "b": {s.name: s.name != "diarization" for s in SPECS},
    }
    ctx = _context(SETTINGS.replace(prefetch="all"))
    warm = warm_next(ctx, 3, 0, [a, b], needed)
    later = [s.name for s in SPECS[1:] if s.name != "diarization"]
    assert sorted(warm.values()) == sorted(f"warm {name}" for name in later)
    assert warm_next(ctx, 3, 1, [a, b], needed, warm) == {}, "each stage is warmed once"
    assert [name for name, _ in ctx.runner.warmed] == later


def test_a_stop_before_fetching_leaves_the_chunk_as_it_is(tmp_path):
    [state] = _chunk(tmp_path, "a")
    needed = {"a": dict.fromkeys((s.name for s in SPECS), True)}
    assert fetch_sources(_context(stopping=False), [state], needed)
    assert not fetch_sources(_context(stopping=True), [state], needed)
    assert state.alive and state.stages == {}


def _needs(asr: set[str], audio: set[str], ids: tuple[str, ...]) -> dict[str, dict[str, bool]]:
    return {i: {s.name: (i in audio if s.name == "audio" else i in asr) for s in SPECS} for i in ids}


def test_the_audio_stage_decodes_again_the_finished_partners_of_an_input_whose_asr_is_redone(tmp_path):
    # Given a join group whose input b is redone (its audio and ASR), a and c finished (their scratch
    # gone), d failed before, and e of another group with nothing to do
    a, b, c, d, e = _chunk(tmp_path, "a", "b", "c", "d", "e")
    for inp in (a, b, c, d):
        inp.group = "g1"
    e.group = "g2"
    d.error = "not a readable media file"
    needed = _needs({"b"}, {"b"}, ("a", "b", "c", "d", "e"))
    ctx = _context()
    # When the audio stage's inputs are chosen
    todo = select(ctx, [a, b, c, d, e], 0, needed)
    # Then b runs it, and a and c are decoded as its partners; not d (it failed: absent, as it was), not e
    assert todo == [b]
    assert partners(ctx, [a, b, c, d, e], 0, needed, todo) == [a, c]
    # nothing for another stage, nor without joining
    assert partners(ctx, [a, b, c, d, e], 1, needed, todo) == []
    alone = _context(SETTINGS.model_copy(update={"asr_join_inputs": False}))
    assert partners(alone, [a, b, c, d, e], 0, needed, todo) == []


def test_a_partner_whose_decoded_audio_is_current_is_not_decoded_again_and_is_removed_after(tmp_path):
    import numpy as np

    from contracts import AudioArtifact, save_model
    from contracts.io import sha256_file

    a, b = _chunk(tmp_path, "a", "b")
    a.group = b.group = "g1"
    audio = a.artifact("audio")
    audio.parent.mkdir(parents=True)
    np.save(audio.with_suffix(".npy"), np.zeros(16000, np.float32))
    art = AudioArtifact(
        item_id="a",
        fingerprint=a.fingerprints["audio"],
        source="a.wav",
        source_size=10,
        sidecar="audio.npy",
        sha256=sha256_file(audio.with_suffix(".npy")),
        num_samples=16000,
        duration_s=1.0,
        source_codec="pcm_s16le",
        source_sample_rate=16000,
        source_channels=1,
    )
    save_model(art, audio)
    needed = _needs({"b"}, {"b"}, ("a", "b"))
    ctx = _context()
    assert partners(ctx, [a, b], 0, needed, [b]) == []
    # a finished before this run: its scratch goes again once the chunk's stages ran; b's stays for finish
    b.artifact("audio").parent.mkdir(parents=True)
    drop_partners(ctx, [a, b], {"a"})
    assert not audio.parent.exists() and b.artifact("audio").parent.exists()
