"""The vocabulary Whisper decodes after: the run's prompt and hotwords, then each input's vocabulary files."""

from __future__ import annotations

import pytest

from contracts.artifacts import VocabularyFile
from stages.asr import AsrStage
from stages.whisper.prompt import fit_vocabulary
from tests.conftest import MAX_WER, SPEECH_TEXT, wer
from tests.stages.test_asr import LOWER_CASE_PROMPT, decode_audio, run_asr_stage


def _words(text: str) -> int:
    return len(text.split())


def test_the_vocabulary_is_joined_general_to_specific_and_fits_the_budget_from_the_specific_end():
    # Given a prompt and terms that fit: all of them, in order (prompt, then terms comma-separated)
    assert fit_vocabulary("Minutes.", ["Stella", "Kowalczyk"], _words, 10) == (
        "Minutes. Stella, Kowalczyk",
        0,
    )
    # When they do not fit: the most general entries go first (the prompt before any term)
    assert fit_vocabulary("one two three", ["a", "b", "c"], _words, 3) == ("a, b, c", 1)
    assert fit_vocabulary("one two three", ["a", "b", "c"], _words, 2) == ("b, c", 2)
    # an entry too long alone keeps its last words
    assert fit_vocabulary("one two three four", [], _words, 2) == ("three four", 0)
    assert fit_vocabulary(None, [], _words, 5) == ("", 0)


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
    when it is transcribed (on either runtime), then Whisper writes in that style (the file's text was before
    every window), and the transcript records the file and what was applied."""
    own = VocabularyFile(level="input", path="/corpus/speech.wav.vocabulary.txt", terms=[LOWER_CASE_PROMPT])
    transcripts, _ = _run(
        tmp_path, {"speech": clips["speech"]}, {"speech": [own]}, model="embedded", runtime=runtime
    )
    assert transcripts["speech"].runtime == runtime
    transcript = transcripts["speech"]
    text = " ".join(s.text for s in transcript.segments)
    assert wer(SPEECH_TEXT, text) < MAX_WER, text
    assert text == text.lower() and not set(".,?!") & set(text), text
    use = transcript.vocabulary
    assert use is not None and use.files == [own] and use.applied == LOWER_CASE_PROMPT
    assert use.prompt is None and use.hotwords == [] and use.note is None and 0 < use.tokens < 40


@pytest.mark.slow
def test_run_folder_and_input_vocabulary_join_in_that_order_and_the_general_end_is_cut(tmp_path, clips):
    """Given a run prompt, run hotwords, a folder vocabulary of 150 terms and an input's own term, over
    Whisper's 224-token budget: the input's term ends the applied text, the run's prompt is left out, the
    text fits the budget, and a note says so; the input is still transcribed."""
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
    assert (
        use.prompt == "Minutes of the meeting." and use.hotwords == ["Stella"] and use.files == [folder, own]
    )
    assert use.applied.endswith("Term149x, Kowalczyk") and "Minutes" not in use.applied
    assert "Stella" not in use.applied and "Term0x," not in use.applied
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
