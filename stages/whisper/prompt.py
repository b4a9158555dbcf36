"""The text Whisper is given before every window: the run's prompt, then the vocabulary's names and terms,
fitted within the decoder's prompt budget (pure functions; the ``asr`` stage counts tokens with its
tokenizer).
"""

from __future__ import annotations

from collections.abc import Callable


def vocabulary_text(prompt: str | None, terms: list[str]) -> str:
    """The text before every window: the prompt, then the names and terms, comma-separated."""
    return " ".join(p for p in (prompt, ", ".join(terms)) if p)


def fit_vocabulary(
    prompt: str | None, sources: list[list[str]], count: Callable[[str], int], budget: int
) -> tuple[str, int]:
    """The prompt and the terms of each source (general to specific: run, folder, input) within ``budget``
    tokens (``count`` counts a text's), joined in that order. The most specific source is kept first and the
    most general left out first (the prompt before any term); within a source its first terms are kept (a
    list's first lines are the names that matter most). An entry too long alone keeps its last words.
    Returns (the text, how many entries were left out)."""
    # (source, position) of each entry, in the order they are kept: specific source first, each in order
    order = [(n, i) for n in range(len(sources) - 1, -1, -1) for i in range(len(sources[n]))]
    entries = len(order) + (prompt is not None)

    def text(kept: set[tuple[int, int]], with_prompt: bool) -> str:
        return vocabulary_text(prompt if with_prompt else None, [sources[n][i] for n, i in sorted(kept)])

    kept: set[tuple[int, int]] = set()
    for at in order:
        if count(text(kept | {at}, False)) > budget:
            if not kept:  # the most specific entry alone is over the budget: its last words
                return _last_words(sources[at[0]][at[1]], count, budget), entries - 1
            return text(kept, False), entries - len(kept)
        kept.add(at)
    if prompt is None:
        return text(kept, False), 0
    if count(text(kept, True)) <= budget:
        return text(kept, True), 0
    if not kept:
        return _last_words(prompt, count, budget), 0
    return text(kept, False), 1


def _last_words(entry: str, count: Callable[[str], int], budget: int) -> str:
    """The last words of ``entry`` within ``budget`` tokens."""
    words: list[str] = []
    for word in reversed(entry.split()):
        if count(" ".join([word, *words])) > budget:
            break
        words.insert(0, word)
    return " ".join(words)
