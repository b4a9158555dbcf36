"""Joining several inputs' speech into one Whisper window and splitting its words back (stages/whisper/joining.py)."""

from __future__ import annotations

from contracts import Word
from stages.whisper.joining import Joined, Joiner, doubts, split_words


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


def test_a_word_timed_across_the_middle_of_a_gap_doubts_both_inputs_of_that_boundary():
    spans = [
        (0.0, 3.5),
        (5.5, 8.0),
        (10.0, 13.0),
        (15.0, 18.0),
    ]  # four inputs, 2 s gaps: middles 4.5, 9.0, 14.0
    words = _words(
        ("welcome", 0.1, 0.8), ("back", 0.9, 1.5), ("rivers", 1.6, 2.6), ("and", 2.64, 4.62),  # runs on
        ("bridges", 4.62, 4.62), ("my", 5.6, 5.8), ("grandmother", 5.8, 6.6), ("kept", 6.6, 7.0), ("maps", 7.0, 8.4),
        ("the", 10.1, 10.4), ("quick", 10.4, 11.0), ("brown", 11.0, 11.6), ("dog", 11.6, 13.5),  # 0.5 s on: fine
        ("she", 15.1, 15.6), ("sells", 15.6, 16.4), ("sea", 16.4, 17.0), ("shells", 17.0, 17.9),
    )  # fmt: skip
    reasons = doubts(words, spans, margin_s=0.25)
    # "and" reaches the first gap's middle (and "bridges" starts in that gap): the first two inputs go alone
    assert "'and'" in reasons[0] and "middle of the gap" in reasons[0]
    assert reasons[1] is not None and reasons[2] is None and reasons[3] is None
    # a last word timed half a second into the silence after it is its own input's
    assert doubts(words[9:], spans[2:], margin_s=0.25) == [None, None]
    # "bridges" alone (no "and" before it): it starts in the gap before the second input's stretch
    late = doubts(words[4:9], spans[:2], margin_s=0.25, min_rate=None)
    assert all("'bridges' at 4.62-4.62 s starts in the gap before 5.50 s" == reason for reason in late), late


def test_a_share_without_words_or_with_more_or_fewer_than_its_speech_holds_is_doubted_with_its_neighbours():
    spans = [(0.0, 1.5), (3.5, 7.5), (9.5, 13.5), (15.5, 17.5)]
    # the first 1.5 s take twelve words (a neighbour's sentence), the second none, the third 4 s only two
    first = [(f"w{n}", 0.1 * n, 0.1 * n + 0.1) for n in range(12)]
    words = _words(
        *first, ("late", 10.0, 10.5), ("word", 11.0, 11.5), ("fine", 15.6, 16.0), ("end", 16.1, 17.0)
    )
    reasons = doubts(words, spans)
    assert reasons[0] == "12 words in 1.5 s" and reasons[1] == "no words"
    assert (
        reasons[2] == "only 2 word(s) in 4.0 s"
        and reasons[3] == "beside a share with only 2 word(s) in 4.0 s"
    )
    # without the counts (languages written without spaces count characters as words): the empty share, beside it
    assert doubts(words, spans, max_rate=None, min_rate=None) == [
        "beside a share with no words",
        "no words",
        "beside a share with no words",
        None,
    ]
    assert doubts(_words(("a", 0.1, 0.5), ("b", 0.6, 1.2)), [(0.0, 1.5)]) == [None]


def test_the_stage_reads_the_join_group_keys_the_orchestrator_writes():
    from orchestrator.planning.groups import GROUP_KEY, MEMBERS_KEY
    from stages.whisper import windows

    assert (windows.GROUP_INPUT, windows.MEMBERS_INPUT) == (GROUP_KEY, MEMBERS_KEY)
