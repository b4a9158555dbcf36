"""The "no hallucinated fragments" policy (pure functions, no model)."""

from __future__ import annotations

from stages.whisper.speech import (
    Decoded,
    better_loop,
    clean_pieces,
    compression_ratio,
    is_speech,
    keep_segments,
    repeats_itself,
)


def test_a_tail_cut_at_the_chunk_boundary_joins_the_piece_it_touches():
    # an utterance of 6.05 s cut by a 6 s chunk: a 50 ms tail right after the first piece
    assert clean_pieces([(1.0, 7.0), (7.0, 7.05)]) == [(1.0, 7.05)]
    # a short piece before a touching one joins that one
    assert clean_pieces([(2.0, 2.08), (2.1, 5.0)]) == [(2.0, 5.0)]


def test_an_isolated_or_unjoinable_short_piece_is_dropped():
    assert clean_pieces([(1.0, 4.0), (9.0, 9.05), (12.0, 14.0)]) == [(1.0, 4.0), (12.0, 14.0)]
    # joining would make a window longer than Whisper's 30 s: dropped instead
    assert clean_pieces([(0.0, 30.0), (30.0, 30.05)]) == [(0.0, 30.0)]
    assert clean_pieces([(3.0, 3.05)]) == []
    assert clean_pieces([]) == []


def test_real_short_words_are_kept():
    assert clean_pieces([(1.0, 1.25), (5.0, 8.0)]) == [(1.0, 1.25), (5.0, 8.0)], (
        "a lone 'yes' of 0.25 s stays"
    )


def test_segments_outside_speech_or_scored_as_non_speech_are_dropped():
    speech = [(0.0, 5.0), (10.0, 12.0)]
    inside = Decoded(0.5, 4.0, word_spans=((0.5, 1.0), (1.2, 4.0)), confidence=0.8)
    outside = Decoded(6.0, 7.0, word_spans=((6.0, 6.5), (6.5, 7.0)), confidence=0.9)
    improbable = Decoded(10.0, 11.0, confidence=0.05)
    whisper_says_silence = Decoded(10.0, 11.0, no_speech_prob=0.9, avg_logprob=-1.5)
    confident_despite_no_speech = Decoded(10.0, 11.0, no_speech_prob=0.9, avg_logprob=-0.2)
    assert not is_speech(outside, speech) and not is_speech(improbable, speech)
    assert not is_speech(whisper_says_silence, speech) and is_speech(confident_despite_no_speech, speech)
    assert keep_segments([inside, outside, improbable, confident_despite_no_speech], speech) == ([0, 3], 2)
    assert keep_segments([outside], None) == ([0], 0), "no recorded speech: only the scores decide"


def test_whisper_silence_needs_both_of_its_signals():
    from stages.whisper.speech import whisper_says_silence

    assert whisper_says_silence(0.9, -1.5)  # likely no speech, and the words it found are improbable
    assert not whisper_says_silence(0.9, -0.3)  # confident words: keep, whatever the no-speech token says
    assert not whisper_says_silence(0.2, -1.5)  # speech, badly recognised: keep
    assert not whisper_says_silence(None, -1.5) and not whisper_says_silence(0.9, None)


def test_a_decoder_loop_repeats_itself_and_real_sentences_do_not():
    loop = "tell her, " * 66  # what whisper-tiny.en wrote for 1.5 s of a clip in a joined window
    assert compression_ratio(loop) > 10 and repeats_itself(loop)
    for sentence in (
        "for completing these things.",
        "The birch canoe slid on the smooth planks. Glue the sheet "
        "to the dark blue background. It's easy to tell the depth of a well.",
        "Der Hund läuft über die Straße, und die Katze schläft auf dem warmen Sofa.",
        "今日は天気がいいので、公園へ散歩に行きました。",
    ):
        assert not repeats_itself(sentence), sentence
    assert not repeats_itself("") and not repeats_itself(None) and compression_ratio("") == 0.0
    assert not repeats_itself(loop, None), "no threshold: the guard is off"


def test_of_two_looping_decodes_the_one_that_loops_clearly_less_wins_else_the_likelier():
    # bench/batch.py's repeated fixture sentences: greedy 2.7 at log-prob -0.2; a sample caught in a loop 6.0 at
    # -0.1 (likelier, as loops are) must not replace it; a sample of 2.6 at -0.6 (errors) must not either
    assert not better_loop(6.0, -0.1, 2.7, -0.2)
    assert not better_loop(2.6, -0.6, 2.7, -0.2)
    assert better_loop(2.6, -0.1, 2.7, -0.2), "as looped, likelier"
    assert better_loop(3.0, -0.9, 26.4, -0.05), "clearly less looped wins, however unlikely"
    assert better_loop(2.7, -0.3, 2.7, None) and not better_loop(2.7, None, 2.7, -0.3)
