"""Caption cues by subtitle rules: line length and count, reading speed, duration, gaps, breaks.

The rules (``CaptionRules``, from the ``caption_*`` settings) follow common broadcast guidelines:
at most 42 characters a line and 2 lines, at most 17 characters a second (20 for a faster profile),
0.833 s to 7 s on screen, 2 frames at 25 fps between cues. Cues end at sentence ends and speaker
changes in preference to anywhere else, a cue holds one speaker (two only in a rapid exchange: a dash
per speaker line), and a cue is never on screen over a pause longer than ``max_pause_s``. Chinese,
Japanese and Korean get their own line length and reading speed (:data:`SCRIPT_LIMITS`), and Chinese
and Japanese words are joined without spaces.

How: the words of each block (one speaker, no long pause inside) are cut into cues by dynamic
programming over the cut points (hard: the text fits the lines, the words fit ``max_s``; costs: a cut
that is not at a sentence end, reading speed above the limit, a cue shorter than the minimum), each
cue's text is broken into balanced lines, and its time on screen is stretched towards what reading
needs, within the next cue's start less the gap, ``max_pause_s`` after its last word, ``max_s`` and the
end of the audio. A cue still too short or too fast to read joins a neighbour (or the next cue's first
sentence) or appears earlier (:func:`cues`); one that cannot is :attr:`Cue.tight`, counted in one note
of the run (:func:`tight_note`).
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, replace

from contracts import TranscriptArtifact

SENTENCE_ENDS = (".", "?", "!", "…", "。", "？", "！")
CLAUSE_ENDS = (",", ";", ":", "—", "–", "、", "，", "；", "：")
#: a line never ends with one of these when another break fits (English, French, German, Spanish, Italian)
WEAK_WORDS = frozenset(
    "a an the of to and or but for in on at by with from as that "
    "le la les un une des du de et ou au aux "
    "der die das den dem des ein eine einen einem einer und oder "
    "el los las una unos unas y o del al "
    "il lo gli i uno e di da".split()
)
#: languages written without spaces between words (Whisper gives their words unspaced)
UNSPACED = frozenset({"zh", "ja", "yue", "th", "lo", "my", "km", "bo"})
#: per language: characters a line and characters a second (Netflix's timed-text guides for these
#: languages: Japanese 13 a line and 4 a second, Chinese 16 and 9, Korean 16 and 12)
SCRIPT_LIMITS: dict[str, tuple[int, float]] = {
    "ja": (13, 4.0),
    "zh": (16, 9.0),
    "yue": (16, 9.0),
    "ko": (16, 12.0),
}


@dataclass(frozen=True)
class CaptionRules:
    """Subtitle rules; the defaults are the ``caption_*`` settings' (documented in docs/settings.md)."""

    line_chars: int = 42
    lines: int = 2
    min_s: float = 0.833
    max_s: float = 7.0
    max_cps: float = 17.0
    min_gap_s: float = 2 / 25
    max_pause_s: float = 1.5
    lead_s: float = 0.5

    @classmethod
    def from_settings(cls, settings) -> CaptionRules:
        return cls(
            line_chars=settings.caption_line_chars,
            lines=settings.caption_lines,
            min_s=settings.caption_min_s,
            max_s=settings.caption_max_s,
            max_cps=settings.caption_max_cps,
            min_gap_s=settings.caption_min_gap_frames / settings.caption_fps,
            max_pause_s=settings.caption_max_pause_s,
            lead_s=settings.caption_lead_s,
        )

    def for_language(self, language: str | None) -> CaptionRules:
        """These rules with a script's own limits (never looser than the ones set)."""
        limits = SCRIPT_LIMITS.get((language or "").lower().split("-")[0])
        if limits is None:
            return self
        return replace(self, line_chars=min(self.line_chars, limits[0]), max_cps=min(self.max_cps, limits[1]))


@dataclass(frozen=True)
class Cue:
    start: float
    end: float
    speaker: str | None
    #: the lines as shown (the speaker label on the first; a two-speaker cue: "- " and no label on each
    #: speaker's line), joined with "\n"
    text: str
    #: shorter than the minimum or faster than the reading speed: its words and the gaps around it allow
    #: no better (counted in the run's notes)
    tight: bool = False


@dataclass(frozen=True)
class _Token:
    text: str
    start: float
    end: float
    #: who says it: the word's own speaker, else its segment's
    speaker: str | None = None


def label(speaker: str | None) -> str:
    return f"[{speaker}]" if speaker else ""


def spaced(language: str | None) -> bool:
    return (language or "").lower().split("-")[0] not in UNSPACED


def is_wide(char: str) -> bool:
    return unicodedata.east_asian_width(char) in ("W", "F")


def _is_punct(text: str) -> bool:
    return bool(text) and all(unicodedata.category(c).startswith("P") for c in text)


def _join(words: list[str], space: bool) -> str:
    if space:
        return " ".join(words)
    out = ""
    for word in words:  # unspaced scripts: a Latin word among them keeps its spaces
        if out and not (is_wide(out[-1]) or is_wide(word[0]) or _is_punct(word)):
            out += " "
        out += word
    return out


def _tokens(segment, space: bool, line_chars: int) -> list[_Token]:
    """A segment's words with times and speakers (a word's own, else the segment's); words without times
    share the segment's time by their length. An unspaced word longer than a line is cut (any cut is a
    valid break there)."""
    timed = [w for w in segment.words or [] if w.start is not None and w.end is not None and w.word.strip()]
    if segment.words and len(timed) == len([w for w in segment.words if w.word.strip()]):
        tokens = [
            _Token(w.word.strip(), w.start, max(w.start, w.end), w.speaker or segment.speaker) for w in timed
        ]
    else:
        texts = segment.text.split() if space else [segment.text.strip()]
        total = sum(len(t) for t in texts) or 1
        tokens, at = [], segment.start
        for text in texts:
            length = (segment.end - segment.start) * len(text) / total
            tokens.append(_Token(text, at, at + length, segment.speaker))
            at += length
    out: list[_Token] = []
    for tok in tokens:
        if space or len(tok.text) <= line_chars:
            out.append(tok)
            continue
        pieces = [tok.text[i : i + line_chars] for i in range(0, len(tok.text), line_chars)]
        step = (tok.end - tok.start) / len(pieces)
        out.extend(
            _Token(p, tok.start + n * step, tok.start + (n + 1) * step, tok.speaker)
            for n, p in enumerate(pieces)
        )
    return out


def break_lines(words: list[str], rules: CaptionRules, space: bool = True) -> list[str] | None:
    """``words`` on the fewest lines (at most ``rules.lines``) of at most ``rules.line_chars``, balanced:
    lines of near-equal length, no line ending with a weak word (article, preposition) nor starting with
    punctuation where another break fits. None when they do not fit. One word longer than a line is a
    line of its own."""
    n = len(words)
    if n == 0:
        return [""]
    for count in range(1, rules.lines + 1):
        best: dict[tuple[int, int], tuple[float, list[int]]] = {(0, 0): (0.0, [])}
        for lines_used in range(count):
            for (start, used), (cost, cuts) in list(best.items()):
                if used != lines_used:
                    continue
                for end in range(start + 1, n + 1):
                    text = _join(words[start:end], space)
                    if len(text) > rules.line_chars and end - start > 1:
                        break
                    if lines_used + 1 == count and end != n:
                        continue
                    penalty = 0.0
                    if end - start == 1 and words[start].startswith("[") and n > 1:
                        penalty += 50  # a speaker label alone on its line
                    if end < n and words[end - 1].lower().strip("'\"") in WEAK_WORDS:
                        penalty += 1000
                    if end < n and _is_punct(words[end]):
                        penalty += 10000
                    key = (end, lines_used + 1)
                    total = cost + penalty + (rules.line_chars - len(text)) ** 2
                    if key not in best or total < best[key][0]:
                        best[key] = (total, [*cuts, end])
        if (n, count) in best:
            cuts = best[(n, count)][1]
            return [_join(words[a:b], space) for a, b in zip([0, *cuts], cuts)]
    return None


def _break_cost(tok: _Token, last: bool) -> float:
    if last or tok.text.endswith(SENTENCE_ENDS):
        return 0.0
    if tok.text.endswith(CLAUSE_ENDS):
        return 1.5
    if tok.text.lower().strip("'\"") in WEAK_WORDS:
        return 6.0
    return 4.0


def _block_cues(
    block: list[_Token], speaker: str | None, rules: CaptionRules, space: bool, follows: float | None
) -> list[tuple[list[_Token], list[str]]]:
    """One block's cues: its words cut where the rules and the break costs are best."""
    prefix = [label(speaker)] if speaker else []
    n = len(block)
    best: list[tuple[float, int, list[str] | None]] = [(0.0, -1, None)] + [(float("inf"), -1, None)] * n
    budget = rules.line_chars * rules.lines
    for end in range(1, n + 1):
        for start in range(end - 1, -1, -1):
            words = [t.text for t in block[start:end]]
            chars = len(_join(prefix + words, space))
            if end - start > 1 and chars > budget + rules.line_chars:
                break
            span = block[end - 1].end - block[start].start
            if end - start > 1 and span > rules.max_s:
                break
            lines = break_lines(prefix + words, rules, space)
            if lines is None and end - start > 1:
                continue
            lines = lines or [*prefix, *words]
            # time it could stay: until the next cue (less the gap), a pause after the last word, max_s
            limit = (
                block[end].start - rules.min_gap_s
                if end < n
                else (
                    block[-1].end + rules.max_pause_s
                    if follows is None
                    else min(follows - rules.min_gap_s, block[-1].end + rules.max_pause_s)
                )
            )
            shown = max(min(limit, block[start].start + rules.max_s) - block[start].start, 1e-3)
            cps = chars / shown
            cost = best[start][0] + 1.0 + _break_cost(block[end - 1], end == n)
            if cps > rules.max_cps:
                cost += 20.0 * (cps / rules.max_cps - 1.0)
            if shown < rules.min_s:
                cost += 3.0
            if cost < best[end][0]:
                best[end] = (cost, start, lines)
    out = []
    end = n
    while end > 0:
        _, start, lines = best[end]
        out.append((block[start:end], lines))
        end = start
    return out[::-1]


@dataclass
class _Draft:
    """A cue before its time on screen is set: its words' span, speaker(s), text and lines."""

    start: float
    end: float
    speaker: str | None
    #: the words as spoken, without a label
    text: str
    lines: list[str]
    #: two speakers, a dash per line: joined no further
    dash: bool = False
    #: its words (one speaker's draft: where it may be cut to lend its first words to the cue before)
    tokens: tuple[_Token, ...] = ()

    @property
    def chars(self) -> int:
        return sum(map(len, self.lines))


def _joined(a: _Draft, b: _Draft, rules: CaptionRules, space: bool) -> _Draft | None:
    """``a`` and ``b`` (``b`` next) as one cue, or None where no cue can hold them: one speaker's words on
    the lines of one cue under that speaker's label, two speakers' as a dash per speaker line (the
    broadcast form of a two-speaker cue, each speaker's words on one line, no label)."""
    if a.dash or b.dash or b.end - a.start > rules.max_s or b.start - a.end > rules.max_pause_s:
        return None
    if a.speaker != b.speaker and (a.speaker is None or b.speaker is None):
        return None  # a labelled cue and an unlabelled one: no cue says who spoke
    if a.speaker == b.speaker:
        speaker = a.speaker
        text = _join([a.text, b.text], space)
        words = ([label(speaker)] if speaker else []) + (text.split(" ") if space else [text])
        lines = break_lines(words, rules, space)
        if lines is None or any(len(line) > rules.line_chars for line in lines):
            return None
        return _Draft(a.start, max(a.end, b.end), speaker, text, lines, tokens=a.tokens + b.tokens)
    lines = [f"- {a.text}", f"- {b.text}"]
    if rules.lines < 2 or any(len(line) > rules.line_chars for line in lines):
        return None
    return _Draft(a.start, max(a.end, b.end), f"{a.speaker} + {b.speaker}", "", lines, dash=True)


def _heads(draft: _Draft, rules: CaptionRules, space: bool):
    """``draft`` cut in two after a sentence or clause end, shortest head first: (head, rest) pairs whose
    rest still fits its lines. A cue too short to read may take the head of the cue after it (a rapid
    exchange's "Okay." before the same speaker goes on) where it cannot take the whole."""
    toks = draft.tokens
    prefix = [label(draft.speaker)] if draft.speaker else []
    cuts = [k for k in range(1, len(toks)) if toks[k - 1].text.endswith(SENTENCE_ENDS)]
    cuts += [
        k
        for k in range(1, len(toks))
        if toks[k - 1].text.endswith(CLAUSE_ENDS) and not toks[k - 1].text.endswith(SENTENCE_ENDS)
    ]
    for k in cuts:
        head, rest = toks[:k], toks[k:]
        lines = break_lines(prefix + [t.text for t in rest], rules, space)
        if lines is None or any(len(line) > rules.line_chars and " " in line for line in lines):
            continue
        text = _join([t.text for t in head], space)
        head_lines = break_lines(prefix + [t.text for t in head], rules, space) or [text]
        yield (
            _Draft(head[0].start, head[-1].end, draft.speaker, text, head_lines, tokens=head),
            _Draft(
                rest[0].start,
                rest[-1].end,
                draft.speaker,
                _join([t.text for t in rest], space),
                lines,
                tokens=rest,
            ),
        )


def _timed(
    draft: _Draft, prev_end: float | None, next_start: float | None, rules: CaptionRules
) -> tuple[float, float]:
    """The draft's time on screen: from its first word (after the previous cue and the gap) for as long
    as reading needs, within a pause after its last word, ``max_s`` and the next cue less the gap; a cue
    still too short or too fast for reading (:func:`_tight`) appears earlier, in the silence before its
    first word (``lead_s``)."""
    start = draft.start if prev_end is None else max(draft.start, prev_end + rules.min_gap_s)
    need = max(rules.min_s, draft.chars / rules.max_cps)
    end = max(draft.end, min(start + need, draft.end + rules.max_pause_s))
    end = min(end, start + rules.max_s)
    if next_start is not None:
        end = min(end, next_start - rules.min_gap_s)
    if _tight(draft, start, end, rules):
        floor = max(0.0, draft.start - rules.lead_s)
        if prev_end is not None:
            floor = max(floor, prev_end + rules.min_gap_s)
        start = min(start, max(end - need, floor))
    end = max(end, start + min(rules.min_s, 0.2))  # overlapping speech: the next cue moves instead
    return start, end


def _tight(draft: _Draft, start: float, end: float, rules: CaptionRules) -> bool:
    """Shorter than the minimum, or faster than the reading speed where it could have stayed longer
    (it ends before ``max_s`` and before a pause's length after its last word)."""
    shown = end - start
    if shown < rules.min_s - 1e-3:
        return True
    fast = draft.chars / max(shown, 1e-3) > rules.max_cps + 0.05
    return fast and shown < rules.max_s - 1e-3 and end < draft.end + rules.max_pause_s - 1e-3


def cues(transcript: TranscriptArtifact, rules: CaptionRules | None = None) -> list[Cue]:
    """The transcript's caption cues under ``rules`` (default: the defaults), in time order.

    A cue too short, or too fast to read, in the time its words and the cues around it leave (a rapid
    exchange, a word said over another voice) is joined with the next cue or the previous one where one
    cue can hold both (two speakers: a dash per speaker line), else with the next cue's first sentence or
    clause (the rest of it a cue of its own), else it appears earlier, in the silence before its words.
    Each cue is labelled with its words' speaker (a word's own, else its segment's), never with the
    ``overlap`` the files add from the diarization: captions show only what the transcript holds. One that
    still breaks the rules is :attr:`Cue.tight` (see :func:`tight_note`)."""
    rules = (rules or CaptionRules()).for_language(transcript.language)
    space = spaced(transcript.language)
    # blocks: one speaker (the words' own, as the transcript has them), no pause longer than max_pause_s
    blocks: list[tuple[str | None, list[_Token]]] = []
    for seg in transcript.segments:
        for tok in _tokens(seg, space, rules.line_chars):
            if (
                blocks
                and blocks[-1][0] == tok.speaker
                and tok.start - blocks[-1][1][-1].end <= rules.max_pause_s
            ):
                blocks[-1][1].append(tok)
            else:
                blocks.append((tok.speaker, [tok]))
    blocks.sort(key=lambda b: b[1][0].start)
    drafts: list[_Draft] = []
    for n, (speaker, block) in enumerate(blocks):
        follows = blocks[n + 1][1][0].start if n + 1 < len(blocks) else None
        for toks, lines in _block_cues(block, speaker, rules, space, follows):
            text = _join([t.text for t in toks], space)
            drafts.append(_Draft(toks[0].start, toks[-1].end, speaker, text, lines, tokens=tuple(toks)))
    drafts.sort(key=lambda d: (d.start, d.end))
    done: list[tuple[_Draft, float, float]] = []
    # the end of the audio: no cue stays on screen after it (as if a cue came there, less the gap), unless
    # its own words do (timing the audio's duration contradicts)
    ends = max((d.end for d in drafts), default=0.0)
    after = max(transcript.duration_s, ends) + rules.min_gap_s if transcript.duration_s else None

    def better(joined: _Draft | None, at: int, short: bool) -> bool:
        """``joined`` (in place of the drafts from ``at`` on) keeps the rules, or is no longer too short
        where the draft it replaces was."""
        if joined is None:
            return False
        later = next((d.start for d in drafts[at:] if d.start >= joined.end), after)
        before = round(done[-1][2], 3) if done else None
        start, end = _timed(joined, before, later, rules)
        return not _tight(joined, start, end, rules) or (short and end - start >= rules.min_s - 1e-3)

    n = 0
    while n < len(drafts):
        draft = drafts[n]
        prev_end = round(done[-1][2], 3) if done else None
        nxt = drafts[n + 1] if n + 1 < len(drafts) else None
        start, end = _timed(draft, prev_end, nxt.start if nxt else after, rules)
        if _tight(draft, start, end, rules):
            short = end - start < rules.min_s - 1e-3
            with_next = _joined(draft, nxt, rules, space) if nxt is not None else None
            if better(with_next, n + 2, short):
                drafts[n : n + 2] = [with_next]
                continue
            if done:
                last = done.pop()
                with_prev = _joined(last[0], draft, rules, space)
                if better(with_prev, n + 1, short):
                    drafts[n] = with_prev
                    continue
                done.append(last)
            # the next cue's first sentence or clause, where the whole of it is too long to join
            split = None
            for head, rest in _heads(nxt, rules, space) if nxt is not None and not nxt.dash else ():
                joined = _joined(draft, head, rules, space)
                if joined is not None and rest.start >= joined.end:
                    at, end_at = _timed(joined, prev_end, rest.start, rules)
                    if not _tight(joined, at, end_at, rules) or (short and end_at - at >= rules.min_s - 1e-3):
                        split = [joined, rest]
                        break
            if split is not None:
                drafts[n : n + 2] = split
                continue
        done.append((draft, start, end))
        n += 1
    out = []
    for d, start, end in done:
        if transcript.duration_s:
            end = min(end, max(transcript.duration_s, d.end))
            start = min(start, end)
        out.append(
            Cue(round(start, 3), round(end, 3), d.speaker, "\n".join(d.lines), _tight(d, start, end, rules))
        )
    return out


def tight_note(cues: list[Cue], rules: CaptionRules, track: str | None = None) -> str | None:
    """The note on the cues that break the time rules (:attr:`Cue.tight`), or None when none does;
    ``track``: which captions, where an input has more than one (``"English"``: its translation)."""
    count = sum(c.tight for c in cues)
    if not count:
        return None
    return (
        f"captions{f' ({track})' if track else ''}: {count} of {len(cues)} cue(s) shorter than "
        f"{rules.min_s:g} s or faster than {rules.max_cps:g} characters a second: the words come faster "
        "than that there, and no cue around them could hold them too"
    )


#: a note of :func:`tight_note` (group 1: its track or None, group 2: how many cues)
TIGHT_NOTE = re.compile(r"captions(?: \(([^)]*)\))?: (\d+) of \d+ cue")


def without_tight_notes(notes: list[str]) -> list[str]:
    """``notes`` less those of :func:`tight_note`: they count the cues of one rendering, and are made again
    with each (other caption settings, other speaker names)."""
    return [n for n in notes if not TIGHT_NOTE.match(n)]
