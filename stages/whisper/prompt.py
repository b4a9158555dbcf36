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
    prompt: str | None, terms: list[str], count: Callable[[str], int], budget: int
) -> tuple[str, int]:
    """The prompt and terms (general to specific) within ``budget`` tokens (``count`` counts a text's): the
    most specific entries are kept, the most general left out first; an entry too long alone keeps its last
    words. Returns (the text, how many entries were left out)."""
    entries = ([prompt] if prompt else []) + list(terms)
    kept: list[str] = []
    for entry in reversed(entries):
        candidate = [entry, *kept]
        has_prompt = prompt is not None and len(candidate) == len(entries)
        if count(vocabulary_text(candidate[0] if has_prompt else None, candidate[has_prompt:])) <= budget:
            kept = candidate
            continue
        if not kept:  # the most specific entry alone is over the budget: its last words
            words: list[str] = []
            for word in reversed(entry.split()):
                if count(" ".join([word, *words])) > budget:
                    break
                words.insert(0, word)
            kept = [" ".join(words)] if words else []
        break
    has_prompt = prompt is not None and len(kept) == len(entries) and kept[0] == prompt
    return vocabulary_text(kept[0] if has_prompt else None, kept[has_prompt:]), len(entries) - len(kept)
