"""The vocabulary Whisper decodes after: the run's prompt and hotwords, then each input's vocabulary files."""

from __future__ import annotations

import json

import pytest

from contracts.artifacts import VocabularyFile, terms_sha256
from stages.asr import AsrStage
from stages.whisper.prompt import fit_vocabulary
from tests.conftest import MAX_WER, SPEECH_TEXT, wer
from tests.stages.test_asr import LOWER_CASE_PROMPT, decode_audio, run_asr_stage


def _by_reference(tmp, path: str, terms: list[str]) -> VocabularyFile:
    """A vocabulary file as the parent sends it: its terms in the run's file of them, named by sha256."""
    digest = terms_sha256(terms)
    stored = tmp / f"{digest}.json"
    stored.write_text(json.dumps(terms))
    return VocabularyFile(level="input", path=path, count=len(terms), sha256=digest, terms_file=str(stored))


def _words(text: str) -> int:
    return len(text.split())


def test_the_vocabulary_is_joined_general_to_specific_and_fits_the_budget_from_the_specific_end():
    # Given a prompt and terms (run, folder, input) that fit: all of them, in order (prompt, then terms
    # comma-separated)
    assert fit_vocabulary("Minutes.", [["Stella"], ["Kowalczyk"]], _words, 10) == (
        "Minutes. Stella, Kowalczyk",
        0,
    )
    # When they do not fit: the most general entries go first (the prompt before any term, the run's terms
    # before a file's)
    assert fit_vocabulary("one two three", [["a", "b", "c"]], _words, 3) == ("a, b, c", 1)
    assert fit_vocabulary("one two three", [["r"], ["f1", "f2"], ["i"]], _words, 3) == ("f1, f2, i", 2)
    # an entry too long alone keeps its last words
    assert fit_vocabulary("one two three four", [], _words, 2) == ("three four", 0)
    assert fit_vocabulary(None, [], _words, 5) == ("", 0)


def test_within_one_source_the_first_terms_are_kept():
    """Given a folder vocabulary of 10,000 names, its first lines (the names that matter most) are the ones
    Whisper gets, in file order; the last ones are left out."""
    names = ["Ferreira", "Okonkwo", *(f"Name{n}" for n in range(9_998))]
    assert fit_vocabulary(None, [names], _words, 3) == ("Ferreira, Okonkwo, Name0", 9_997)
    assert fit_vocabulary("one two three", [["a", "b", "c"]], _words, 2) == ("a, b", 2)
    # the input's own terms still come before the folder's
    assert fit_vocabulary(None, [names, ["Kowalczyk"]], _words, 3) == ("Ferreira, Okonkwo, Kowalczyk", 9_998)


@pytest.fixture(scope="module")
def clips(tmp_path_factory, media):
    """Three short inputs (the enrollment clips) and the speech sentence, decoded."""
    speakers = media / "speakers"
    return decode_audio(
        tmp_path_factory.mktemp("vocab-audio"),
        {
            "speech": media / "speech.wav",
            "a": speakers / "host_enroll_1.wav",
            "b": speakers / "host_enroll_2.wav",
            "c": speakers / "guest_enroll_1.wav",
        },
    )


def _run(tmp, audio: dict, vocabulary: dict, **settings):
    """The stage over ``audio`` with each input's ``vocabulary``: its transcripts, and the inputs of each
    window decoded."""
    seen: list[list[str]] = []

    def spy(stage: AsrStage) -> None:
        generate = stage._generate

        def generating(batch, temperature=0.0):
            seen.extend([[job.item.id for job, _ in window.parts] for window in batch])
            return generate(batch, temperature)

        stage._generate = generating

    result, transcripts, _ = run_asr_stage(tmp, audio, 4, settings, vocabulary=vocabulary, spy=spy)
    assert all(r.ok for r in result.items), result.items
    return transcripts, seen


@pytest.mark.slow
@pytest.mark.parametrize("runtime", ["ctranslate2", "torch"])
def test_an_input_vocabulary_file_reaches_the_decoder_and_is_recorded(tmp_path, clips, runtime):
    """Given an input's own vocabulary file whose one entry is a sentence in lower case without punctuation,
    sent by reference (the run's file of its terms, as the parent sends it), when it is transcribed (on either
    runtime), then Whisper writes in that style (the file's text was before every window), and the transcript
    records the file (its terms' sha256 and count, not the terms) and what was applied."""
    own = _by_reference(tmp_path, "/corpus/speech.wav.vocabulary.txt", [LOWER_CASE_PROMPT])
    transcripts, _ = _run(
        tmp_path, {"speech": clips["speech"]}, {"speech": [own]}, model="embedded", runtime=runtime
    )
    assert transcripts["speech"].runtime == runtime
    transcript = transcripts["speech"]
    text = " ".join(s.text for s in transcript.segments)
    assert wer(SPEECH_TEXT, text) < MAX_WER, text
    assert text == text.lower() and not set(".,?!") & set(text), text
    use = transcript.vocabulary
    recorded = VocabularyFile(level="input", path=own.path, count=1, sha256=terms_sha256([LOWER_CASE_PROMPT]))
    assert use is not None and use.files == [recorded] and use.applied == LOWER_CASE_PROMPT
    assert use.prompt is None and use.hotwords == [] and use.note is None and 0 < use.tokens < 40


@pytest.mark.slow
def test_run_folder_and_input_vocabulary_join_in_that_order_and_the_general_end_is_cut(tmp_path, clips):
    """Given a run prompt, run hotwords, a folder vocabulary of 150 terms and an input's own term, over
    Whisper's 224-token budget: the input's term ends the applied text, the run's prompt and terms are left
    out, the folder's first terms are kept (its last left out), the text fits the budget, and a note says
    so; the input is still transcribed."""
    folder = VocabularyFile(level="folder", path="/c/vocabulary.txt", terms=[f"Term{n}x" for n in range(150)])
    own = VocabularyFile(level="input", path="/c/speech.vocabulary.txt", terms=["Kowalczyk"])
    transcripts, _ = _run(
        tmp_path,
        {"speech": clips["speech"]},
        {"speech": [folder, own]},
        model="embedded",
        prompt="Minutes of the meeting.",
        hotwords=["Stella"],
    )
    use = transcripts["speech"].vocabulary
    assert use.prompt == "Minutes of the meeting." and use.hotwords == ["Stella"]
    assert [(f.path, f.count, f.sha256, f.terms) for f in use.files] == [
        (folder.path, 150, terms_sha256(folder.terms), []),
        (own.path, 1, terms_sha256(own.terms), []),
    ]
    # the terms are not stored again in the transcript: only what was applied
    assert "Term149x" not in (tmp_path / "speech.json").read_text()
    assert use.applied.startswith("Term0x, Term1x,") and use.applied.endswith(", Kowalczyk")
    assert "Minutes" not in use.applied and "Stella" not in use.applied and "Term149x" not in use.applied
    assert 200 < use.tokens <= 223 and use.note and "left out" in use.note, use
    assert wer(SPEECH_TEXT, " ".join(s.text for s in transcripts["speech"].segments)) < 0.5


@pytest.mark.slow
def test_joined_windows_join_only_inputs_with_the_same_vocabulary(tmp_path, clips):
    """Given three short clips, two with one folder vocabulary and one with its own, joined windows hold the
    two alike together and the third alone; each transcript records its own vocabulary."""
    folder = VocabularyFile(level="folder", path="/c/vocabulary.txt", terms=["harbour", "attic"])
    other = VocabularyFile(level="input", path="/c/c.vocabulary.txt", terms=["grandmother"])
    short = {k: clips[k] for k in ("a", "b", "c")}
    transcripts, seen = _run(
        tmp_path, short, {"a": [folder], "b": [folder], "c": [other]}, model="embedded", join_inputs=True
    )
    assert ["a", "b"] in seen and ["c"] in seen, seen
    assert not any("c" in ids and len(ids) > 1 for ids in seen), seen
    assert transcripts["a"].vocabulary.applied == "harbour, attic"
    assert transcripts["c"].vocabulary.applied == "grandmother"


@pytest.mark.slow
def test_terms_by_reference_that_are_not_the_ones_planned_fail_their_input_alone(tmp_path, clips):
    """Given two inputs whose vocabulary is sent by reference, one's file of terms changed since the parent
    wrote it: that input fails with the reason naming its vocabulary file; the other is transcribed."""
    good = _by_reference(tmp_path, "/c/a.vocabulary.txt", ["harbour"])
    bad = _by_reference(tmp_path, "/c/b.vocabulary.txt", ["attic"])
    (tmp_path / f"{bad.sha256}.json").write_text(json.dumps(["something else"]))
    result, transcripts, _ = run_asr_stage(
        tmp_path,
        {"a": clips["a"], "b": clips["b"]},
        2,
        {"model": "embedded"},
        vocabulary={"a": [good], "b": [bad]},
    )
    outcome = {r.id: r for r in result.items}
    assert outcome["a"].ok and transcripts["a"].vocabulary.applied == "harbour"
    assert not outcome["b"].ok and "/c/b.vocabulary.txt" in outcome["b"].error, outcome["b"]
