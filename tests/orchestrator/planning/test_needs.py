"""What each input needs: the stages to run (with the dry run's reasons), and the journal's fast resume."""

from __future__ import annotations

import os
import time
from pathlib import Path

from contracts.artifacts import LanguageId
from orchestrator import Settings
from orchestrator.books.journal import Journal
from orchestrator.planning.fingerprints import chain_fingerprints
from orchestrator.planning.inputs import Input
from orchestrator.planning.needs import REUSED, Resume, completion, dry_run, needs, work_item
from orchestrator.planning.state import InputState
from orchestrator.registry import process_specs

SETTINGS = Settings(_env_file=None, speakers=False)
SPECS = process_specs(SETTINGS)  # audio (scratch), asr, alignment, embeddings


def _state(tmp_path: Path) -> InputState:
    state = InputState(Input(id="a", source=tmp_path / "a.wav", directory=tmp_path / "out" / "a"))
    chain_fingerprints(state, SPECS)
    return state


def test_an_input_with_no_artifacts_needs_every_stage_and_the_dry_run_says_why(tmp_path):
    state = _state(tmp_path)
    reasons: dict[str, str] = {}
    assert needs(state, SPECS, force=False, reasons=reasons) == dict.fromkeys((s.name for s in SPECS), True)
    assert reasons == {
        "audio": "scratch, needed by a stage that runs",
        "asr": "missing",
        "alignment": "missing",
        "embeddings": "missing",
    }
    forced: dict[str, str] = {}
    needs(state, SPECS, force=True, reasons=forced)
    assert set(forced.values()) == {"forced (--force)"}


def test_a_work_item_reads_the_source_first_then_the_artifacts_not_skipped(tmp_path):
    (tmp_path / "a.wav").write_bytes(b"RIFF")
    state = _state(tmp_path)
    first = work_item(SPECS[0], state, None)
    assert first.inputs == {"source": str(tmp_path / "a.wav")}
    assert first.source_version is not None and first.source_version.size == 4
    assert first.fingerprint == state.fingerprints["audio"]
    alignment = SPECS[2]
    state.skipped.add("audio")
    item = work_item(alignment, state, SPECS[1])
    assert "audio" not in item.inputs and item.inputs["asr"] == str(state.artifact("asr"))
    assert item.output == str(state.artifact(alignment.kind)) and item.source_version is None


def test_the_outputs_fingerprint_follows_the_stages_and_the_settings_that_shape_the_files(tmp_path):
    state = _state(tmp_path)
    base = Resume(SETTINGS, {}).outputs_fingerprint(state)
    assert Resume(SETTINGS.replace(chunk_size=7), {}).outputs_fingerprint(state) == base
    assert Resume(SETTINGS.replace(caption_max_s=5.0), {}).outputs_fingerprint(state) != base
    assert Resume(SETTINGS.replace(langid_only=True), {}).outputs_fingerprint(state) != base
    state.fingerprints["asr"] = "another"
    assert Resume(SETTINGS, {}).outputs_fingerprint(state) != base


def _completed_run(tmp_path: Path) -> tuple[Journal, InputState]:
    """An input that finished: its kept artifacts and outputs on disk, its "outputs ok" event journalled."""
    state = _state(tmp_path)
    state.directory.mkdir(parents=True)
    for spec in SPECS:
        if spec.keep:
            state.artifact(spec.kind).write_text("{}")
    (state.directory / "transcript.txt").write_text("1\n")
    state.outputs = {"txt": str(state.directory / "transcript.txt")}
    state.duration_s, state.overlap_s, state.complete = 12.5, None, True
    state.language = LanguageId(status="detected", language="en", probability=0.9)
    state.substitutions = ["embeddings: asked for ..."]
    state.notes.append("a note")
    journal = Journal(tmp_path / "out" / "journal.jsonl", "run-1")
    fingerprint = Resume(SETTINGS, {}).outputs_fingerprint(state)
    journal.record(state.id, "outputs", "ok", fingerprint=fingerprint, **completion(state, SPECS))
    return journal, state


def test_an_input_the_journal_saw_completed_is_reused_from_it_alone(tmp_path):
    journal, was = _completed_run(tmp_path)
    resume = Resume(SETTINGS, journal.completed())
    again = _state(tmp_path)
    assert resume.resumed(again)
    assert resume.complete(again, SPECS)
    assert (again.complete, again.status, again.duration_s, again.outputs) == (True, "ok", 12.5, was.outputs)
    assert again.language == was.language and again.substitutions == was.substitutions
    assert again.notes == ["a note"]
    assert again.stages == {s.name: REUSED for s in SPECS if s.keep}
    assert resume.fast_resumed == 1
    assert not resume.complete(_state(tmp_path), SPECS), "each input is checked once a run"


def test_a_changed_file_or_setting_means_checking_the_artifacts_themselves(tmp_path):
    journal, was = _completed_run(tmp_path)
    transcript = was.artifact("transcript")
    os.utime(transcript, ns=(0, transcript.stat().st_mtime_ns + 1))
    resume = Resume(SETTINGS, journal.completed())
    assert not resume.complete(_state(tmp_path), SPECS) and resume.fast_resumed == 0
    captions = Resume(SETTINGS.replace(caption_max_s=5.0), journal.completed())
    assert not captions.resumed(_state(tmp_path)) and not captions.complete(_state(tmp_path), SPECS)
    remote = Resume(SETTINGS.replace(output_url="memory://out"), journal.completed())
    assert not remote.complete(_state(tmp_path), SPECS), "outputs at a URL are uploaded again"


def test_the_dry_run_counts_what_each_stage_would_redo_and_why_and_writes_nothing(tmp_path):
    for name in ("a.wav", "b.wav"):
        (tmp_path / name).write_bytes(b"RIFF")
    out = tmp_path / "out"
    settings = SETTINGS.replace(output_dir=out)
    paths = [tmp_path / "a.wav", tmp_path / "a.wav", tmp_path / "b.wav"]
    plan = dry_run(settings, SPECS, paths, time.monotonic())
    assert (plan.inputs, plan.duplicates, plan.complete) == (2, 1, 0)
    assert {s.stage: (s.reuse, s.redo, s.reasons) for s in plan.stages} == {
        "audio": (0, 2, {"scratch, needed by a stage that runs": 2}),
        "asr": (0, 2, {"missing": 2}),
        "alignment": (0, 2, {"missing": 2}),
        "embeddings": (0, 2, {"missing": 2}),
    }
    assert not out.exists(), "a dry run writes nothing"


def test_a_fingerprint_hashes_the_same_text_as_ever_with_the_specs_part_made_once():
    """The fingerprint is sha256 of ``json.dumps`` of six sorted keys: what a folder made by an earlier
    version holds must stay current (a changed hash would redo every input of every corpus)."""
    import hashlib
    import json

    from orchestrator.planning.fingerprints import fingerprint

    for spec in SPECS:
        for upstream, model in [("src:1:2", None), ('quo"te|ü\\x', "wav2vec2:x"), ("", "")]:
            blob = json.dumps(
                {
                    "stage": spec.name,
                    "module": spec.module,
                    "version": spec.version,
                    "settings": spec.settings.identity(),
                    "model": model or spec.model,
                    "upstream": upstream,
                },
                sort_keys=True,
            )
            assert fingerprint(spec, upstream, model) == hashlib.sha256(blob.encode()).hexdigest()[:32]


def test_a_new_aligner_chains_again_from_the_alignment_as_a_whole_chain_would(tmp_path):
    import dataclasses

    from contracts.models import ALIGNER_BY_LANGUAGE
    from orchestrator.planning.fingerprints import plan_aligner

    specs = [dataclasses.replace(s, model=ALIGNER_BY_LANGUAGE) if s.name == "alignment" else s for s in SPECS]
    (tmp_path / "a.wav").write_bytes(b"RIFF")
    state = InputState(Input(id="a", source=tmp_path / "a.wav", directory=tmp_path / "out" / "a"))
    chain_fingerprints(state, specs)
    before = dict(state.fingerprints)
    assert plan_aligner(state, specs, "en", ran="wav2vec2:someone/else")
    whole = InputState(state.plan, models=dict(state.models))
    chain_fingerprints(whole, specs)
    assert state.fingerprints == whole.fingerprints
    assert state.fingerprints["asr"] == before["asr"]
    assert state.fingerprints["alignment"] != before["alignment"]
    assert state.fingerprints["embeddings"] != before["embeddings"]


def test_the_resumed_count_plans_the_aligner_for_the_journalled_language_first(tmp_path):
    from orchestrator import Orchestrator
    from orchestrator.planning.fingerprints import plan_aligner

    # Given the run's stages with the aligner chosen per transcript language, and an input completed in English
    specs = Orchestrator(SETTINGS).stage_specs()
    state = _state(tmp_path)
    chain_fingerprints(state, specs)
    assert plan_aligner(state, specs, "en"), "the alignment stage chooses its aligner per language"
    journal = Journal(tmp_path / "out" / "journal.jsonl", "run-1")
    resume = Resume(SETTINGS, {})
    journal.record(
        state.id, "outputs", "ok", fingerprint=resume.outputs_fingerprint(state), **completion(state, specs)
    )
    # When the next run counts what is already complete (its input planned without a language yet)
    again = InputState(state.plan)
    chain_fingerprints(again, specs)
    resume = Resume(SETTINGS, journal.completed())
    # Then the input counts as resumed: its aligner is planned for English, as the fast resume plans it
    assert resume.outputs_fingerprint(again) != resume.outputs_fingerprint(state)
    assert resume.resumed(again, specs)
    assert again.models["alignment"] == state.models["alignment"]
