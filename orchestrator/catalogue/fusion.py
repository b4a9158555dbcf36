"""Hybrid ranking and the text of a hit: pure functions.

Reciprocal rank fusion (Cormack, Clarke and Büttcher, 2009): each list gives a hit ``1 / (k + rank)``; a
hit's score is the sum over the lists it is in. Ranks, not scores, are fused, so BM25's and cosine's
scales never meet. ``k`` = 60, the paper's (and most engines') choice.
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Sequence

RRF_K = 60


def fuse(rankings: Sequence[Sequence[Hashable]], k: int = RRF_K) -> list[tuple[Hashable, float]]:
    """The keys of ``rankings`` (each best first) ordered by their fused score, best first; ties keep the
    order of first appearance (the first list's order first)."""
    scores: dict[Hashable, float] = {}
    for ranking in rankings:
        for rank, key in enumerate(ranking, start=1):
            scores[key] = scores.get(key, 0.0) + 1.0 / (k + rank)
    order = {key: n for n, key in enumerate(scores)}
    return sorted(scores.items(), key=lambda kv: (-kv[1], order[kv[0]]))


_WORD = re.compile(r"\w+", re.UNICODE)
#: words too common to mark in a hit (the full-text index ranks them low anyway)
COMMON = frozenset(
    "a an and are as at be but by for from had has have he her his i in is it its of on or our she so that "
    "the their them there they this to was we were what when where which who will with you your".split()
)


def query_terms(query: str) -> list[str]:
    """The query's words worth marking, lower case, in order, once each (not the most common English ones)."""
    return list(dict.fromkeys(w.lower() for w in _WORD.findall(query) if w.lower() not in COMMON))


#: the share of the query's words a full-text hit must hold to count in a hybrid ranking
MIN_COVER = 0.5


def cover(text: str, query: str) -> float:
    """The share of the query's words (:func:`query_terms`) that ``text`` holds (1.0: a query of common
    words only). A full-text hit that shares one word of a long paraphrase is noise that the vectors rank
    better; with rank fusion, a hit in both rankings beats one first in only one, so such hits are left out
    of the hybrid's full-text ranking (bench/search.py, quality)."""
    terms = query_terms(query)
    if not terms:
        return 1.0
    words = {w.lower() for w in _WORD.findall(text)}
    return sum(any(_matches(w, t) for w in words) for t in terms) / len(terms)


def _matches(word: str, term: str) -> bool:
    return word == term or (len(term) >= 4 and word.startswith(term))


def mark(text: str, query: str, before: str = "[", after: str = "]") -> str:
    """``text`` with each word that is one of the query's words (or starts with it, for words of four
    letters or more: "fund" marks "funding") between ``before`` and ``after``."""
    terms = query_terms(query)
    if not terms:
        return text

    def matches(word: str) -> bool:
        return any(_matches(word.lower(), t) for t in terms)

    return _WORD.sub(lambda m: f"{before}{m.group(0)}{after}" if matches(m.group(0)) else m.group(0), text)
