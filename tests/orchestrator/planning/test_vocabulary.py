"""Vocabulary files beside a corpus: which apply to an input, never inputs themselves, part of the ASR
fingerprint of exactly the inputs they apply to."""

from __future__ import annotations

import os
from pathlib import Path

from orchestrator import Settings
from orchestrator.planning.fingerprints import chain_fingerprints
from orchestrator.planning.inputs import plan_inputs
from orchestrator.planning.needs import work_item
from orchestrator.planning.state import InputState
from orchestrator.planning.vocabulary import MAX_BYTES, MAX_TERMS, read_terms, vocabulary_files
from orchestrator.registry import process_specs

SETTINGS = Settings(_env_file=None, speakers=False)


def _corpus(root: Path) -> Path:
    """corpus/{a/x.wav, a/y.wav, a/deep/z.wav, b/w.wav} with vocabulary at the top, in a/ and for x.wav."""
    for name in ("a/x.wav", "a/y.wav", "a/deep/z.wav", "b/w.wav"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(b"RIFF")
    (root / "vocabulary.txt").write_text("# the corpus\nStella\n\nDr. Lee\nStella\n")
    (root / "a" / "vocabulary.txt").write_text("Kowalczyk\nNguyen\n")
    (root / "a" / "x.wav.vocabulary.txt").write_text("Ferreira\n")
    return root


def test_a_vocabulary_file_is_one_term_a_line_without_blanks_comments_or_repeats(tmp_path):
    corpus = _corpus(tmp_path / "corpus")
    assert read_terms(corpus / "vocabulary.txt") == (["Stella", "Dr. Lee"], 0)


def test_the_nearest_folder_wins_and_an_input_adds_its_own(tmp_path):
    corpus = _corpus(tmp_path / "corpus")

    def terms(name: str) -> list[tuple[str, list[str]]]:
        return [(f.level, f.terms) for f in vocabulary_files(corpus / name, corpus)]

    assert terms("a/x.wav") == [("folder", ["Kowalczyk", "Nguyen"]), ("input", ["Ferreira"])]
    assert terms("a/y.wav") == [("folder", ["Kowalczyk", "Nguyen"])]
    assert terms("a/deep/z.wav") == [("folder", ["Kowalczyk", "Nguyen"])]  # the nearest folder above
    assert terms("b/w.wav") == [("folder", ["Stella", "Dr. Lee"])]
    # the stem's file serves too
    (corpus / "b" / "w.vocabulary.txt").write_text("Okonkwo\n")
    assert terms("b/w.wav")[-1] == ("input", ["Okonkwo"])
    # a loose file: its own folder only, nothing above it
    assert [f.terms for f in vocabulary_files(corpus / "b" / "w.wav")] == [["Okonkwo"]]
    assert vocabulary_files(corpus / "a" / "deep" / "z.wav", corpus / "a" / "deep") == ()


def test_the_walk_never_takes_a_vocabulary_file_and_each_input_carries_its_own(tmp_path):
    corpus = _corpus(tmp_path / "corpus")
    inputs = plan_inputs([corpus], tmp_path / "out", dry=True)
    assert sorted(i.id for i in inputs) == ["corpus/a/deep/z", "corpus/a/x", "corpus/a/y", "corpus/b/w"]
    by_id = {i.id: i for i in inputs}
    assert [f.terms for f in by_id["corpus/a/x"].vocabulary] == [["Kowalczyk", "Nguyen"], ["Ferreira"]]
    assert [f.terms for f in by_id["corpus/b/w"].vocabulary] == [["Stella", "Dr. Lee"]]


def _fingerprints(corpus: Path, out: Path, settings: Settings = SETTINGS) -> dict[str, dict[str, str]]:
    specs = process_specs(settings)
    states = [InputState(i) for i in plan_inputs([corpus], out, dry=True)]
    for state in states:
        chain_fingerprints(state, specs)
    return {s.id: dict(s.fingerprints) for s in states}


def test_changing_a_folders_vocabulary_redoes_exactly_that_folders_inputs(tmp_path):
    corpus = _corpus(tmp_path / "corpus")
    before = _fingerprints(corpus, tmp_path / "out")
    # When a/'s vocabulary changes (its mtime too, as an editor would leave it)
    (corpus / "a" / "vocabulary.txt").write_text("Kowalczyk\nNguyen\nAbernathy\n")
    os.utime(corpus / "a" / "vocabulary.txt", (1, 1))
    after = _fingerprints(corpus, tmp_path / "out")
    # Then a/'s inputs (those it applies to) need ASR and everything after it again; the others nothing
    changed = {i for i in before if before[i] != after[i]}
    assert changed == {"corpus/a/x", "corpus/a/y", "corpus/a/deep/z"}
    for i in changed:
        assert before[i]["audio"] == after[i]["audio"]
        assert all(before[i][s] != after[i][s] for s in ("asr", "alignment", "embeddings"))
    # an input's own file changes only that input
    (corpus / "a" / "x.wav.vocabulary.txt").write_text("Ferreira\nAlvarez\n")
    again = _fingerprints(corpus, tmp_path / "out")
    assert {i for i in after if after[i] != again[i]} == {"corpus/a/x"}
    # the run's hotwords change every input
    hot = _fingerprints(corpus, tmp_path / "out", SETTINGS.replace(asr_hotwords=["Stella"]))
    assert all(hot[i]["asr"] != again[i]["asr"] for i in again)


def test_only_the_asr_stage_gets_the_vocabulary_files(tmp_path):
    corpus = _corpus(tmp_path / "corpus")
    specs = process_specs(SETTINGS)
    state = InputState(
        next(i for i in plan_inputs([corpus], tmp_path / "out", dry=True) if i.id.endswith("x"))
    )
    chain_fingerprints(state, specs)
    items = {spec.name: work_item(spec, state, specs[n - 1] if n else None) for n, spec in enumerate(specs)}
    assert [f.terms for f in items["asr"].vocabulary] == [["Kowalczyk", "Nguyen"], ["Ferreira"]]
    assert all(not item.vocabulary for name, item in items.items() if name != "asr")


def test_hotwords_are_read_as_a_comma_list_in_order(monkeypatch):
    monkeypatch.setenv("ASR_HOTWORDS", "Stella, Dr. Lee,,Stella, Kowalczyk")
    assert Settings(_env_file=None).asr_hotwords == ["Stella", "Dr. Lee", "Kowalczyk"]


def test_an_empty_vocabulary_file_in_the_nearest_folder_switches_the_ones_above_off(tmp_path):
    corpus = _corpus(tmp_path / "corpus")
    before = _fingerprints(corpus, tmp_path / "out")
    # Given an empty vocabulary.txt in a/ (the corpus's above it names Stella), and one of comments only in b/
    (corpus / "a" / "vocabulary.txt").write_text("")
    (corpus / "b" / "vocabulary.txt").write_text("# nothing for b\n")
    # Then the nearest file wins: a/'s and b/'s inputs get no folder terms, x.wav still its own
    assert [(f.level, f.terms) for f in vocabulary_files(corpus / "a" / "y.wav", corpus)] == [("folder", [])]
    assert [(f.level, f.terms) for f in vocabulary_files(corpus / "a/x.wav", corpus)] == [
        ("folder", []),
        ("input", ["Ferreira"]),
    ]
    assert [f.terms for f in vocabulary_files(corpus / "b" / "w.wav", corpus)] == [[]]
    # and their ASR is redone (their terms changed)
    after = _fingerprints(corpus, tmp_path / "out")
    assert {i for i in before if before[i]["asr"] != after[i]["asr"]} == {
        "corpus/a/x",
        "corpus/a/y",
        "corpus/a/deep/z",
        "corpus/b/w",
    }


def test_an_empty_vocabulary_file_with_nothing_above_it_changes_no_fingerprint(tmp_path):
    corpus = tmp_path / "corpus"
    (corpus / "a").mkdir(parents=True)
    (corpus / "a" / "x.wav").write_bytes(b"RIFF")
    before = _fingerprints(corpus, tmp_path / "out")
    (corpus / "a" / "vocabulary.txt").write_text("\n# no terms yet\n")
    assert _fingerprints(corpus, tmp_path / "out") == before  # no terms before, none now


def _failed(inputs) -> dict[str, str]:
    return {i.id: i.error for i in inputs if i.error}


def test_a_vocabulary_file_that_is_not_utf8_text_fails_only_the_inputs_it_applies_to(tmp_path):
    corpus = _corpus(tmp_path / "corpus")
    # Given a binary file as b/'s vocabulary and a Latin-1 file as y.wav's own
    (corpus / "b" / "vocabulary.txt").write_bytes(bytes(range(256)) * 4)
    (corpus / "a" / "y.wav.vocabulary.txt").write_bytes("Müller\nJosé\n".encode("latin-1"))
    inputs = plan_inputs([corpus], tmp_path / "out", dry=True)
    failed = _failed(inputs)
    # Then those inputs fail, each with a one-line reason naming the file; the others are planned as before
    assert set(failed) == {"corpus/b/w", "corpus/a/y"}
    assert all("\n" not in reason for reason in failed.values())
    assert str(corpus / "b" / "vocabulary.txt") in failed["corpus/b/w"]
    assert "not UTF-8 text" in failed["corpus/b/w"] or "not text" in failed["corpus/b/w"]
    assert str(corpus / "a" / "y.wav.vocabulary.txt") in failed["corpus/a/y"]
    assert "not UTF-8 text (byte 0xfc at offset 1)" in failed["corpus/a/y"]
    by_id = {i.id: i for i in inputs}
    assert [f.terms for f in by_id["corpus/a/x"].vocabulary] == [["Kowalczyk", "Nguyen"], ["Ferreira"]]
    # and a run state of such an input is failed at the vocabulary, never run
    state = InputState(by_id["corpus/b/w"])
    assert not state.alive and state.failed_stage == "vocabulary" and state.error == failed["corpus/b/w"]


def test_utf8_with_a_byte_order_mark_is_text(tmp_path):
    (tmp_path / "vocabulary.txt").write_bytes("\ufeffMüller\nJosé\n".encode())
    assert read_terms(tmp_path / "vocabulary.txt") == (["Müller", "José"], 0)


def test_a_vocabulary_file_over_the_size_cap_fails_its_inputs_with_its_size(tmp_path):
    corpus = _corpus(tmp_path / "corpus")
    (corpus / "b" / "vocabulary.txt").write_text("Name\n" * (MAX_BYTES // 5 + 1))
    failed = _failed(plan_inputs([corpus], tmp_path / "out", dry=True))
    assert set(failed) == {"corpus/b/w"}
    assert str(corpus / "b" / "vocabulary.txt") in failed["corpus/b/w"] and "MiB" in failed["corpus/b/w"]


def test_only_the_first_terms_of_a_long_vocabulary_file_are_read_and_the_rest_is_said(tmp_path, caplog):
    corpus = _corpus(tmp_path / "corpus")
    # Given a folder vocabulary of 10,000 names, the guests' first
    names = ["Ferreira", "Okonkwo", *(f"Name{n}" for n in range(9_998))]
    (corpus / "b" / "vocabulary.txt").write_text("\n".join(names) + "\n")
    with caplog.at_level("WARNING"):
        inputs = plan_inputs([corpus], tmp_path / "out", dry=True)
    w = next(i for i in inputs if i.id == "corpus/b/w")
    # Then the first MAX_TERMS are read, in file order, and how many were left out is said
    (folder,) = w.vocabulary
    assert folder.terms == names[:MAX_TERMS] and folder.left_out == 10_000 - MAX_TERMS
    left = f"{10_000 - MAX_TERMS} of its 10000 terms left out"
    assert any(left in note and str(corpus / "b" / "vocabulary.txt") in note for note in w.notes), w.notes
    assert sum(left in r.getMessage() for r in caplog.records) == 1
    assert not any(i.notes for i in inputs if i.id != "corpus/b/w")
