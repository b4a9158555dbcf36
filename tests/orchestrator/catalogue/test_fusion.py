"""Rank fusion and the marking of a hit's words, as pure functions."""

from __future__ import annotations

from orchestrator.catalogue.fusion import RRF_K, cover, fuse, mark, query_terms


def test_a_hit_in_both_rankings_beats_one_first_in_only_one():
    fused = fuse([["a", "b", "c"], ["b", "d"]])
    assert [key for key, _ in fused] == ["b", "a", "d", "c"]
    scores = dict(fused)
    assert scores["b"] == 1 / (RRF_K + 2) + 1 / (RRF_K + 1)
    assert scores["a"] == 1 / (RRF_K + 1)


def test_ties_keep_the_order_of_first_appearance_and_empty_rankings_fuse_to_nothing():
    assert [key for key, _ in fuse([["x"], ["y"]])] == ["x", "y"]
    assert fuse([[], []]) == []
    assert [key for key, _ in fuse([[], ["q", "r"]])] == ["q", "r"]


def test_the_query_words_are_marked_whole_or_as_the_start_of_a_longer_word_but_not_common_ones():
    assert query_terms("The funding of the Harbour") == ["funding", "harbour"]
    assert mark("Funding for the harbour in Kirkenes.", "the harbour funding") == (
        "[Funding] for the [harbour] in Kirkenes."
    )
    assert mark("We talked about fundraising.", "fund") == "We talked about [fundraising]."
    assert mark("a cat and a catalogue", "cat") == "a [cat] and a catalogue"  # short: whole words only
    assert mark("Grüße aus München", "münchen") == "Grüße aus [München]"
    assert mark("nothing here", "") == "nothing here"


def test_a_text_covers_the_share_of_the_query_words_it_holds():
    assert cover("Please send the minutes to Siobhan Kowalczyk", "Kowalczyk") == 1.0
    assert cover("Our next caller has a question", "the caller did not put any covering on them") == 1 / 6
    assert cover("the funding of the harbour", "harbour fund") == 1.0  # "fund" starts "funding"
    assert cover("the funding of the harbour", "harbour funds") == 0.5
    assert cover("anything", "the of and") == 1.0  # common words only: nothing to hold
