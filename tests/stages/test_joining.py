"""Joining several inputs' speech into one Whisper window and splitting its words back (stages/joining.py)."""

from __future__ import annotations

from contracts import Word
from stages.joining import Joined, Joiner, doubted, doubts, split_words


def _parts(windows: list[Joined]) -> list[list[str]]:
    return [list(w.parts) for w in windows]


def test_short_windows_of_one_language_share_a_window_up_to_the_limit_with_gaps():
    joiner = Joiner(30.0, gap_s=1.0, min_room_s=2.0, open_windows=4)
    closed = []
    for name, seconds in [("a", 6.0), ("b", 9.0), ("c", 8.0), ("d", 7.0)]:
        closed += joiner.add(name, seconds, "en")
    # a 6 + 1 + b 9 + 1 + c 8 = 25 s; d (7 s) does not fit beside them: a new window
    assert closed == [] and _parts(joiner.open) == [["a", "b", "c"], ["d"]]
    assert joiner.open[0].offsets == [0.0, 7.0, 17.0] and joiner.open[0].length == 25.0
    assert joiner.open[0].spans == [(0.0, 6.0), (7.0, 16.0), (17.0, 25.0)]
    closed = joiner.add("e", 3.0, "en")  # 25 + 1 + 3 = 29 s: less than 2 s of room left, so it closes
    assert _parts(closed) == [["a", "b", "c", "e"]] and closed[0].length == 29.0
    assert _parts(joiner.flush()) == [["d"]] and joiner.open == []


def test_languages_never_share_and_long_or_unknown_windows_go_alone_at_once():
    joiner = Joiner(30.0)
    assert joiner.add("en1", 5.0, "en") == [] and joiner.add("de1", 5.0, "de") == []
    assert joiner.add("en2", 5.0, "en") == []
    long = joiner.add("long", 28.0, "en")  # no room for another input beside it
    unknown = joiner.add("x", 4.0, None)  # no language: never joined
    assert _parts(long) == [["long"]] and _parts(unknown) == [["x"]]
    assert sorted(_parts(joiner.flush())) == [["de1"], ["en1", "en2"]]


def test_the_oldest_open_window_is_closed_when_too_many_are_open():
    joiner = Joiner(10.0, gap_s=1.0, min_room_s=0.5, open_windows=2)
    assert joiner.add("a", 6.0, "en") == [] and joiner.add("b", 6.0, "en") == []
    assert _parts(joiner.add("c", 6.0, "en")) == [["a"]]  # three open: the oldest goes to be decoded
    assert _parts(joiner.flush()) == [["b"], ["c"]]


def test_dropped_parts_close_up():
    joiner = Joiner(30.0, gap_s=1.0)
    for name in "abc":
        joiner.add(name, 5.0, "en")
    joiner.keep(lambda part: part != "b")
    assert _parts(joiner.open) == [["a", "c"]] and joiner.open[0].offsets == [0.0, 6.0]
    joiner.keep(lambda part: False)
    assert joiner.open == []


def test_words_go_to_the_part_they_start_in_clamped_and_in_its_own_time():
    spans = [(0.0, 4.0), (5.0, 9.0), (10.0, 12.0)]  # three inputs, 1 s gaps
    words = [
        Word(word="one", start=0.2, end=1.0),
        Word(word="two", start=3.6, end=5.2),  # ends in the next part
        Word(word="three", start=4.6, end=5.5),  # starts in the gap, past its middle: the second's
        Word(word="four", start=5.4, end=6.0),
        Word(word="five", start=9.6, end=10.8),
        Word(word="six", start=10.1, end=13.0),
    ]
    first, second, third = split_words(words, spans)
    assert [(w.word, w.start, w.end) for w in first] == [("one", 0.2, 1.0), ("two", 3.6, 4.0)]
    assert [(w.word, w.start, w.end) for w in second] == [("three", 0.0, 0.5), ("four", 0.4, 1.0)]
    assert [(w.word, w.start, w.end) for w in third] == [("five", 0.0, 0.8), ("six", 0.1, 2.0)]
    assert split_words([], spans) == [[], [], []]


def _words(*timed: tuple[str, float, float]) -> list[Word]:
    return [Word(word=w, start=a, end=b) for w, a, b in timed]


def test_a_word_timed_into_the_gap_is_not_placed_with_certainty_and_its_neighbours_go_alone_too():
    spans = [(0.0, 4.0), (5.5, 9.5), (11.0, 14.0), (15.5, 18.5)]  # four inputs, 1.5 s gaps
    words = _words(
        ("the", 0.1, 0.5), ("quick", 0.6, 1.2), ("brown", 1.3, 2.0), ("fox", 2.1, 3.9),
        ("she", 5.6, 6.0), ("sells", 6.1, 7.0), ("sea", 7.1, 8.0), ("shells", 8.1, 10.2),  # 0.7 s into the gap
        ("please", 11.1, 11.8), ("call", 11.9, 12.6), ("stella", 12.7, 13.9),
        ("and", 15.6, 16.2), ("ask", 16.3, 17.0), ("her", 17.1, 18.4),
    )  # fmt: skip
    reasons = doubts(words, spans, margin_s=0.3)
    assert reasons[0] is None and reasons[2] is None and reasons[3] is None
    assert "shells" in reasons[1] and "outside" in reasons[1]
    # the second input, and the inputs on either side of it (the word came from or went to one of them)
    assert doubted(reasons) == {0, 1, 2}
    assert doubts(words, spans, margin_s=1.0) == [None, None, None, None]  # within the margin: placed


def test_a_share_without_words_or_with_more_or_fewer_than_its_speech_holds_is_doubted():
    spans = [(0.0, 1.5), (3.0, 7.0), (8.5, 12.5)]
    # the first 1.5 s take twelve words (a neighbour's sentence), the second none, the third 4 s only two
    first = [(f"w{n}", 0.1 * n, 0.1 * n + 0.1) for n in range(12)]
    words = _words(*first, ("late", 9.0, 9.5), ("word", 10.0, 10.5))
    reasons = doubts(words, spans)
    assert reasons[0] == "12 words in 1.5 s" and reasons[1] == "no words"
    assert reasons[2] == "only 2 word(s) in 4.0 s"
    # without the counts (languages written without spaces count characters as words): only the empty share
    assert doubts(words, spans, max_rate=None, min_rate=None) == [None, "no words", None]
    assert doubted([None, None, None]) == set()


def test_the_stage_reads_the_join_group_keys_the_orchestrator_writes():
    from orchestrator.run.groups import GROUP_KEY, MEMBERS_KEY
    from stages import asr

    assert (asr.GROUP_INPUT, asr.MEMBERS_INPUT) == (GROUP_KEY, MEMBERS_KEY)
