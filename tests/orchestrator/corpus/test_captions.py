"""The subtitle rules and ``cues()``: line length, lines per cue, time on screen, reading speed, gaps,
pauses, speakers and per-script limits, checked on the cues themselves."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from contracts import TranscriptArtifact
from orchestrator.corpus.captions import (
    WEAK_WORDS,
    CaptionRules,
    Cue,
    break_lines,
    cues,
    label,
    spaced,
    tight_note,
)

RULES = CaptionRules()


def _transcript(segments, language="en") -> TranscriptArtifact:
    return TranscriptArtifact(
        item_id="a",
        fingerprint="f",
        source="/a.wav",
        language=language,
        model="m",
        requested_model="embedded",
        device="cpu",
        compute_type="int8",
        batch_size=1,
        duration_s=600.0,
        segments=segments,
    )


def _segment(n, words, speaker=None, text=None):
    """A segment of timed words: ``words`` is [(word, start, end), ...]."""
    return {
        "id": n,
        "start": words[0][1],
        "end": words[-1][2],
        "text": text if text is not None else " ".join(w for w, _, _ in words),
        "speaker": speaker,
        "words": [{"word": w, "start": s, "end": e} for w, s, e in words],
    }


def _steady(count, start=0.0, step=0.4, word="word"):
    """``count`` words one after another, ``step`` seconds each, no pause."""
    return [(f"{word}{n:02d}", start + n * step, start + n * step + step * 0.9) for n in range(count)]


def _check_rules(out: list[Cue], rules: CaptionRules = RULES) -> None:
    for cue in out:
        lines = cue.text.split("\n")
        assert len(lines) <= rules.lines, cue
        assert all(len(line) <= rules.line_chars for line in lines), cue
        assert cue.end - cue.start <= rules.max_s + 1e-9, cue
        assert cue.end > cue.start, cue
    for a, b in zip(out, out[1:]):
        assert b.start - a.end >= rules.min_gap_s - 1e-3, (a, b)


# -- the rules ------------------------------------------------------------------------------------------


def test_defaults_are_the_broadcast_guidelines():
    assert (RULES.line_chars, RULES.lines, RULES.min_s, RULES.max_s, RULES.max_cps) == (
        42,
        2,
        0.833,
        7.0,
        17.0,
    )
    assert RULES.min_gap_s == pytest.approx(0.08)  # 2 frames at 25 fps


def test_rules_from_settings_turn_frames_into_seconds():
    settings = SimpleNamespace(
        caption_line_chars=37,
        caption_lines=3,
        caption_min_s=1.0,
        caption_max_s=6.0,
        caption_max_cps=20.0,
        caption_min_gap_frames=3,
        caption_fps=30.0,
        caption_max_pause_s=2.0,
        caption_lead_s=0.25,
    )
    assert CaptionRules.from_settings(settings) == CaptionRules(37, 3, 1.0, 6.0, 20.0, 0.1, 2.0, 0.25)


def test_the_real_settings_give_the_default_rules():
    from orchestrator.settings import Settings

    assert CaptionRules.from_settings(Settings()) == RULES


@pytest.mark.parametrize(
    ("language", "line_chars", "max_cps"),
    [("ja", 13, 4.0), ("zh", 16, 9.0), ("zh-Hant", 16, 9.0), ("yue", 16, 9.0), ("KO", 16, 12.0)],
)
def test_scripts_get_their_own_line_length_and_reading_speed(language, line_chars, max_cps):
    rules = RULES.for_language(language)
    assert (rules.line_chars, rules.max_cps) == (line_chars, max_cps)
    assert (rules.lines, rules.max_s) == (RULES.lines, RULES.max_s)


def test_script_limits_are_never_looser_than_the_rules_set():
    tight = CaptionRules(line_chars=10, max_cps=3.0)
    assert tight.for_language("ja") == tight
    assert RULES.for_language("en") is RULES and RULES.for_language(None) is RULES


def test_which_languages_are_written_without_spaces():
    assert not spaced("ja") and not spaced("zh-CN") and not spaced("th")
    assert spaced("en") and spaced("ko") and spaced(None)
    assert label("Host") == "[Host]" and label(None) == ""


# -- line breaks ---------------------------------------------------------------------------------------


def test_a_short_text_stays_on_one_line():
    assert break_lines("Hello there".split(), RULES) == ["Hello there"]
    assert break_lines([], RULES) == [""]


def test_two_lines_are_balanced():
    words = "one two three four five six seven eight nine ten eleven twelve".split()  # 61 characters
    lines = break_lines(words, RULES)
    assert len(lines) == 2 and " ".join(lines) == " ".join(words)
    assert abs(len(lines[0]) - len(lines[1])) <= 8, lines


def test_a_line_does_not_end_with_a_weak_word_when_another_break_fits():
    # the most balanced break would end the first line with "of"; the next best one is taken
    words = ["x" * 18, "of", "y" * 18, "z" * 5]
    assert break_lines(words, RULES) == ["x" * 18, "of " + "y" * 18 + " " + "z" * 5]
    prose = "we walked all the way along the river to the old mill".split()
    first, _ = break_lines(prose, RULES)
    assert first.split()[-1] not in WEAK_WORDS


def test_a_line_does_not_start_with_punctuation():
    words = ["a" * 20, "b" * 19, "—", "c" * 10]
    lines = break_lines(words, RULES)
    assert not lines[1].startswith("—"), lines


def test_too_much_text_does_not_fit():
    assert break_lines(["word"] * 30, RULES) is None  # 149 characters, 2 lines of 42
    assert break_lines(["word"] * 30, CaptionRules(lines=4)) is not None


def test_one_word_longer_than_a_line_is_a_line_of_its_own():
    assert break_lines(["x" * 50], RULES) == ["x" * 50]


# -- cues ----------------------------------------------------------------------------------------------


def test_a_long_monologue_is_cut_into_cues_that_keep_every_rule():
    words = _steady(80)  # 32 s, about 550 characters
    out = cues(_transcript([_segment(0, words, speaker="Host")]))
    _check_rules(out)
    assert len(out) >= 6
    assert " ".join(c.text.replace("[Host] ", "").replace("\n", " ") for c in out) == " ".join(
        w for w, _, _ in words
    ), "every word once, in order"
    assert all(c.text.startswith("[Host] ") and c.text.count("[") == 1 for c in out)


def test_tighter_rules_are_kept_too():
    rules = CaptionRules(line_chars=20, lines=1, max_s=3.0, max_cps=12.0)
    out = cues(_transcript([_segment(0, _steady(40))]), rules)
    _check_rules(out, rules)
    assert all("\n" not in c.text for c in out)


def test_a_short_cue_stays_the_minimum_time():
    out = cues(_transcript([_segment(0, [("Hi.", 1.0, 1.2)])]))
    assert out == [Cue(1.0, 1.833, None, "Hi.")]


def test_a_cue_stays_long_enough_to_read_within_the_pause_after_it():
    text = "This sentence has exactly fifty-two characters in it."
    words = text.split()
    spoken = [(w, n * 0.1, n * 0.1 + 0.1) for n, w in enumerate(words)]  # said in 0.8 s
    (cue,) = cues(_transcript([_segment(0, spoken)]))
    assert cue.start == 0.0
    # reading it at 17 characters a second needs ~3.1 s, more than the pause allows: it ends
    # max_pause_s after the last word
    assert cue.end == pytest.approx(spoken[-1][2] + RULES.max_pause_s)
    # with a faster reading speed it stays what reading needs: characters / max_cps
    slow = cues(_transcript([_segment(0, spoken)]), CaptionRules(max_cps=40.0))[0]
    chars = sum(len(line) for line in slow.text.split("\n"))
    assert slow.end == pytest.approx(chars / 40.0, abs=1e-3)
    assert slow.end < cue.end


def test_cues_prefer_to_end_at_a_sentence_end():
    first = "The meeting starts now."
    second = "Please take your seats and switch off your phones before we begin."
    words = (first + " " + second).split()
    spoken = [(w, n * 0.3, n * 0.3 + 0.25) for n, w in enumerate(words)]
    out = cues(_transcript([_segment(0, spoken)]))
    assert out[0].text.replace("\n", " ") == first


def test_a_cue_never_holds_two_speakers_and_the_next_one_keeps_the_gap():
    # Given a host whose words leave time enough to read them before the guest speaks
    host = _segment(0, [("Hello,", 0.0, 0.5), ("welcome.", 0.5, 1.3)], speaker="Host")
    guest = _segment(
        1, [("Thanks", 1.38, 1.8), ("for", 1.8, 2.0), ("having", 2.0, 2.3), ("me.", 2.3, 2.6)], "Guest"
    )
    out = cues(_transcript([host, guest]))
    assert [c.speaker for c in out] == ["Host", "Guest"]
    assert out[0].text == "[Host] Hello, welcome." and out[1].text == "[Guest] Thanks for having me."
    assert out[1].start - out[0].end == pytest.approx(RULES.min_gap_s, abs=1e-3)


def test_a_long_pause_ends_the_cue_and_it_does_not_stay_over_it():
    words = [("Before", 0.0, 0.5), ("pause.", 0.5, 1.0), ("After", 10.0, 10.5), ("pause.", 10.5, 11.0)]
    out = cues(_transcript([_segment(0, words)]))
    assert [c.text for c in out] == ["Before pause.", "After pause."]
    assert out[0].end <= 1.0 + RULES.max_pause_s + 1e-9
    assert out[1].start == 10.0


def test_overlapping_speech_moves_the_next_cue_instead_of_overlapping():
    a = _segment(0, [("Talking", 0.0, 1.0), ("over.", 1.0, 2.0)], speaker="A")
    b = _segment(1, [("Me", 0.5, 1.0), ("too.", 1.0, 1.5)], speaker="B")
    out = cues(_transcript([a, b]))
    _check_rules(out)
    # B's words, said over A's, leave A's cue no time: one two-speaker cue, a dash per speaker line
    assert [(c.speaker, c.text) for c in out] == [("A + B", "- Talking over.\n- Me too.")]


def test_words_without_times_share_the_segment_time_by_their_length():
    seg = {"id": 0, "start": 2.0, "end": 4.0, "text": "aaaa bbbb"}
    (cue,) = cues(_transcript([seg]))
    assert cue.start == 2.0 and cue.text == "aaaa bbbb"
    assert cue.end >= 4.0


def test_japanese_gets_its_line_length_and_no_spaces_between_words():
    words = [
        (w, n * 0.5, n * 0.5 + 0.45)
        for n, w in enumerate(["今日", "は", "とても", "良い", "天気", "です", "ね。"] * 3)
    ]
    out = cues(_transcript([_segment(0, words, text="".join(w for w, _, _ in words))], language="ja"))
    ja = RULES.for_language("ja")
    _check_rules(out, ja)
    assert all(" " not in c.text for c in out)
    assert "".join(c.text.replace("\n", "") for c in out) == "今日はとても良い天気ですね。" * 3


def test_an_unspaced_word_longer_than_a_line_is_cut():
    long_word = "あ" * 30
    seg = {"id": 0, "start": 0.0, "end": 6.0, "text": long_word}
    out = cues(_transcript([seg], language="ja"))
    assert "".join(c.text.replace("\n", "") for c in out) == long_word
    assert all(len(line) <= 13 for c in out for line in c.text.split("\n"))


# -- rapid exchanges ------------------------------------------------------------------------------------


def test_a_rapid_exchange_becomes_one_two_speaker_cue_with_a_dash_per_speaker():
    # Given the real sample's exchange: "Neither did I." said in 0.36 s, "Okay," right after by the other
    a = _segment(0, [("Neither", 9.84, 10.0), ("did", 10.0, 10.1), ("I.", 10.1, 10.2)], speaker="S0001")
    b = _segment(1, [("Okay,", 10.25, 10.6)], speaker="S0002")
    c = _segment(2, [("then", 12.6, 12.8), ("I", 12.8, 12.9), ("thought.", 12.9, 13.4)], speaker="S0002")
    out = cues(_transcript([a, b, c]))
    _check_rules(out)
    # Then the two short turns share a cue, each speaker's words on a dashed line, long enough to read
    assert out[0].text == "- Neither did I.\n- Okay," and out[0].speaker == "S0001 + S0002"
    assert out[0].end - out[0].start >= RULES.min_s
    assert all(not c.tight for c in out) and tight_note(out, RULES) is None


def test_a_cue_too_short_that_nothing_can_hold_appears_earlier_or_is_counted_in_one_note():
    # Given a short turn between two long, fast ones that no cue could share with it
    long_a = [(f"alpha{n}", n * 0.25, n * 0.25 + 0.2) for n in range(12)]
    long_b = [(f"bravo{n}", 3.5 + n * 0.25, 3.5 + n * 0.25 + 0.2) for n in range(12)]
    out = cues(
        _transcript(
            [
                _segment(0, long_a, speaker="A"),
                _segment(1, [("Yes.", 3.1, 3.3)], speaker="B"),
                _segment(2, long_b, speaker="A"),
            ]
        )
    )
    _check_rules(out)
    tight = [c for c in out if c.tight]
    assert tight, out
    for c in out:
        if not c.tight:
            assert c.end - c.start >= RULES.min_s - 1e-3
    note = tight_note(out, RULES)
    assert note.startswith(f"captions: {len(tight)} of {len(out)} cue(s) shorter than 0.833 s")


def test_a_short_cue_appears_earlier_in_the_silence_before_its_words():
    # Given one short word after a silence, then another speaker with more than a dashed line holds
    hi = _segment(0, [("Hi.", 5.0, 5.2)], speaker="A")
    long = "Good morning to you all, and welcome to the show tonight.".split()
    reply = _segment(1, [(w, 5.6 + n * 0.3, 5.85 + n * 0.3) for n, w in enumerate(long)], speaker="B")
    out = cues(_transcript([hi, reply]))
    _check_rules(out)
    # Then "Hi." cannot share a cue, and cannot stay 0.833 s before B speaks: it appears before its word
    assert out[0].text == "[A] Hi."
    assert out[0].start < 5.0 and out[0].end - out[0].start >= RULES.min_s - 1e-3, out
    assert not out[0].tight


def test_the_last_cue_ends_with_the_audio():
    t = _transcript([_segment(0, [("Goodbye.", 9.5, 9.9)])]).model_copy(update={"duration_s": 10.0})
    (cue,) = cues(t)
    assert cue.end == 10.0 and cue.start <= 9.5


def test_a_labelled_cue_and_an_unlabelled_one_are_not_joined():
    a = _segment(0, [("Neither", 9.84, 10.0), ("did", 10.0, 10.1), ("I.", 10.1, 10.2)], speaker="S0001")
    b = _segment(1, [("Okay,", 10.25, 10.6)])
    out = cues(_transcript([a, b]))
    assert [c.speaker for c in out] == ["S0001", None]
    assert not any(c.text.startswith("- ") for c in out)


# -- speaker labels: only what the transcript holds -----------------------------------------------------


def _said(n, words, speaker, overlap=()):
    """A segment of ``speaker``'s timed words, as the files get it: ``overlap`` (indexes) are the words the
    diarization hears another voice over (``Word.overlap``: the diarization's, not the transcript's)."""
    seg = _segment(n, words, speaker=speaker)
    other = "S0002" if speaker == "S0001" else "S0001"
    for k, word in enumerate(seg["words"]):
        word["speaker"] = speaker
        if k in overlap:
            word["overlap"] = [other]
    seg["overlap"] = [other] if overlap else None
    return seg


def _labels(srt: str) -> list[str]:
    import re

    return re.findall(r"^\[([^\]]+)\]", srt, flags=re.M)


def _srt(segments) -> str:
    from orchestrator.corpus.outputs import Sources, to_srt

    return to_srt(Sources("sample", _transcript(segments)))


def test_a_cue_names_its_words_speaker_not_a_voice_the_diarization_hears_over_them():
    # Given pyannote.audio's sample as the files get it: S0001's "design. Okay." said while the diarization
    # also has S0002 (the words' overlap), the transcript giving every word one speaker
    segments = [
        _said(
            0,
            [("I", 9.993, 10.053), ("need", 10.053, 10.133), ("to", 10.133, 10.313)]
            + [("design.", 10.313, 10.633), ("Okay.", 10.913, 10.973)],
            "S0001",
            overlap={3, 4},
        ),
        _said(1, [("I", 11.233, 11.293), ("thought,", 11.293, 11.513), ("you", 11.613, 11.793)], "S0002"),
    ]
    srt = _srt(segments)
    # Then every cue's label is a speaker the words have: none says "S0001 + S0002"
    assert set(_labels(srt)) <= {"S0001", "S0002"}, srt
    assert "design. Okay." in srt, srt


def test_a_rapid_exchange_keeps_each_speaker_s_words_under_their_own_speaker():
    # Given the sample's "Chicago. Oh," (S0001, over S0002) then "I'm originally ..." (S0002, over S0001)
    a = [
        ("And", 14.373, 14.493),
        ("I'm", 14.493, 14.753),
        ("Sheila", 14.753, 15.093),
        ("and", 15.093, 15.493),
    ]
    a += [("Texas", 15.493, 16.013), ("originally", 16.013, 16.713), ("from", 16.713, 17.073)]
    a += [("Chicago.", 17.073, 17.513), ("Oh,", 18.093, 18.253)]
    b = [("I'm", 18.473, 18.613), ("originally", 18.613, 18.813), ("from", 18.813, 19.153)]
    b += [("Chicago", 19.153, 19.513), ("also.", 19.513, 19.993)]
    srt = _srt([_said(0, a, "S0001", overlap={0, 1, 8}), _said(1, b, "S0002", overlap={0})])
    assert set(_labels(srt)) <= {"S0001", "S0002"}, srt
    # Then S0002's "I'm" is never in a cue labelled S0001's: a cue of S0001 ends before it
    for block in srt.split("\n\n"):
        if "[S0001]" in block:
            assert "Oh, I'm" not in block.replace("\n", " "), srt


def test_a_cue_takes_its_words_own_speaker_where_the_segment_says_otherwise():
    seg = _segment(0, [("Yes.", 1.0, 1.4), ("No.", 3.5, 3.9)], speaker="A")
    seg["words"][1]["speaker"] = "B"
    assert [c.speaker for c in cues(_transcript([seg]))] == ["A", "B"]


def test_a_short_turn_takes_the_first_sentence_of_a_long_answer_as_a_two_speaker_cue():
    # Given pyannote.audio's sample as the torch runtime times it: "Neither did I." in 0.62 s between a
    # two-speaker cue and the other speaker's "Okay." that starts a long answer, too long for a dashed line
    hello = [("Hello.", 6.713, 6.933), ("Hello.", 7.493, 7.893)]
    oh = "Oh, hello. I didn't know you were there.".split()
    oh_at = [8.293, 8.473, 8.893, 8.933, 9.133, 9.273, 9.393, 9.473, 9.713]
    neither = [("Neither", 10.013, 10.193), ("did", 10.193, 10.433), ("I.", 10.433, 10.633)]
    answer = "Okay. I thought, you know, I heard of deep. This is Diane in New Jersey.".split()
    answer_at = [10.893, 10.993, 11.293, 11.513, 11.793, 11.893, 11.993, 12.133, 12.253, 12.373]
    answer_at += [12.613, 12.833, 13.133, 13.373, 13.533, 13.973]
    segments = [
        _segment(0, hello, speaker="S0001"),
        _segment(1, [(w, oh_at[k], oh_at[k + 1]) for k, w in enumerate(oh)], speaker="S0002"),
        _segment(2, neither, speaker="S0001"),
        _segment(3, [(w, answer_at[k], answer_at[k + 1]) for k, w in enumerate(answer)], speaker="S0002"),
    ]
    out = cues(_transcript(segments))
    _check_rules(out)
    # Then "Neither did I." shares a cue with "Okay.", long enough to read, and the answer goes on alone
    assert "- Neither did I.\n- Okay." in [c.text for c in out], out
    assert min(c.end - c.start for c in out) >= RULES.min_s - 1e-3, out
    assert out[-1].text.startswith("[S0002] I thought,"), out
