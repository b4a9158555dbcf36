"""The subtitle rules, checked on caption files as a viewer gets them (independent of the code that wrote them).

``check(path)`` returns one line per broken rule. The rules are the defaults of the ``caption_*`` settings
(``CaptionRules()``; Chinese, Japanese and Korean text gets its script's limits). Exceptions, i.e. what
the words allow:

- a line longer than the limit is allowed when it holds one word (no space) — that word cannot be cut;
- a cue shorter than the minimum duration is allowed when the next cue starts right after it (its end is
  the next start less the minimum gap), or it is the last and ends with the audio or after it
  (``duration_s`` of the ``transcript.json`` beside the file);
- reading speed above the limit is allowed when the cue could not stay longer: it ends at the next cue
  less the gap, or ends with the audio, or lasts the maximum, or (words known from the
  ``transcript.json`` beside the file, ``transcript.en.json`` for the translation's) it ends
  ``max_pause_s`` after its last word. Without a
  transcript beside it the reading speed is not checked (the file alone cannot tell);
- but where the notes are known (those the output folder's journal last recorded with the input's files,
  else ``run-report.json``, in the folder above the input's), the cues allowed by the next cue alone
  (too short, or too fast) are the notes' to own: they count them per track ("captions: N of M
  cue(s) ...", the English translation's "captions (English): ..."), and more than they count is a
  problem (none counted: none allowed);
- a line of a two-line cue may end with a weak word (article, preposition) or the next line start with
  punctuation only when no other break of the same words fits the line length; a two-speaker cue (each
  line starting with "- ") breaks where the speaker changes.

Checked always: lines per cue, characters per line, at most ``max_s`` on screen, at least the minimum gap
between cues (no overlap), at most one speaker label per cue and only at its start. With the words known:
no cue on screen over a pause longer than ``max_pause_s``.
"""

from __future__ import annotations

import json
import re
import unicodedata
from pathlib import Path

from orchestrator.corpus.captions import TIGHT_NOTE, WEAK_WORDS, CaptionRules

_TIME = re.compile(r"(\d+):(\d\d):(\d\d)[,.](\d\d\d)\s+-->\s+(\d+):(\d\d):(\d\d)[,.](\d\d\d)")
TOL = 0.0015


def _seconds(h, m, s, ms) -> float:
    return int(h) * 3600 + int(m) * 60 + int(s) + int(ms) / 1000


#: WebVTT's cue markup (``<lang de>``, ``</lang>``, ``<v Name>``): not shown, so not counted
_MARKUP = re.compile(r"</?[a-z][^>]*>")


def parse(text: str) -> list[tuple[float, float, list[str]]]:
    """(start, end, lines) of each cue of an SRT or WebVTT text, as shown (WebVTT's markup left out)."""
    out = []
    for block in re.split(r"\n\s*\n", text.replace("\r\n", "\n")):
        lines = block.strip("\n").split("\n")
        for n, line in enumerate(lines):
            found = _TIME.search(line)
            if found:
                g = found.groups()
                shown = [_MARKUP.sub("", x) for x in lines[n + 1 :]]
                out.append((_seconds(*g[:4]), _seconds(*g[4:]), [x for x in shown if x.strip()]))
                break
    return out


def _script_rules(lines: list[str], language: str | None) -> CaptionRules:
    rules = CaptionRules()
    if language:
        return rules.for_language(language)
    text = "".join(lines)
    if any("\u3040" <= c <= "\u30ff" for c in text):
        return rules.for_language("ja")
    if any("\uac00" <= c <= "\ud7af" for c in text):
        return rules.for_language("ko")
    if any(unicodedata.east_asian_width(c) == "W" and unicodedata.category(c) == "Lo" for c in text):
        return rules.for_language("zh")
    return rules


def _words(path: Path) -> tuple[list[tuple[float, float]], str | None, float | None]:
    """The timed words of the ``transcript.json`` beside ``path``, its language and the audio's duration."""
    transcript = path.with_name("transcript.en.json" if _english(path) else "transcript.json")
    if not transcript.exists():
        return [], None, None
    try:
        data = json.loads(transcript.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return [], None, None
    words = []
    for seg in data.get("segments", []):
        timed = [
            (w["start"], w["end"])
            for w in seg.get("words") or []
            if w.get("start") is not None and w.get("end") is not None and w["word"].strip()
        ]
        words += timed or [(seg["start"], seg["end"])]
    return sorted(words), data.get("language"), data.get("duration_s")


def _fits_otherwise(words: list[str], cut: int, rules: CaptionRules) -> bool:
    """Another two-line break of ``words`` than ``cut`` fits the line length without a weak-word end."""
    for k in range(1, len(words)):
        if k == cut:
            continue
        a, b = " ".join(words[:k]), " ".join(words[k:])
        if (
            len(a) <= rules.line_chars
            and len(b) <= rules.line_chars
            and words[k - 1].lower() not in WEAK_WORDS
            and not all(unicodedata.category(c).startswith("P") for c in words[k])
        ):
            return True
    return False


def _english(path: Path) -> bool:
    """The file is the English translation's (``transcript.en.srt``)."""
    return path.name.startswith("transcript.en.")


def _noted(path: Path) -> int | None:
    """How many cues the notes on this input say break the time rules in this file's track (0: none
    noted): the notes the output folder's journal last recorded with its files (``process``, ``export`` and
    ``speakers`` record what they wrote), else the run report's; None where neither lists the input (a
    file written outside a run)."""
    notes = None
    out, item_id = path.parent.parent, path.parent.name
    try:
        for line in (out / "journal.jsonl").read_text(encoding="utf-8").splitlines():
            event = json.loads(line) if f'"{item_id}"' in line and '"outputs"' in line else {}
            if (
                event.get("item") == item_id
                and event.get("stage") == "outputs"
                and event.get("status") == "ok"
            ):
                notes = [str(n) for n in (event.get("summary") or {}).get("notes") or []]
    except (OSError, ValueError):
        pass
    if notes is None:
        try:
            data = json.loads((out / "run-report.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        for item in data.get("inputs", []):
            if item.get("id") == item_id:
                notes = [str(n) for n in item.get("notes") or []]
    if notes is None:
        return None
    track = "English" if _english(path) else None
    for note in notes:
        found = TIGHT_NOTE.match(note)
        if found and found.group(1) == track:
            return int(found.group(2))
    return 0


def check(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    cues = parse(text)
    words, language, audio_s = _words(path)
    noted = _noted(path)
    owned = []  # cues too short or too fast, allowed only because the next cue follows right after
    problems = []
    for n, (start, end, lines) in enumerate(cues):
        rules = _script_rules(lines, language)
        where = f"{path.name} cue {n + 1} ({start:.3f}-{end:.3f})"
        nxt = cues[n + 1][0] if n + 1 < len(cues) else None
        duration = end - start
        # it could not stay longer: the next cue follows right after, or (the last) the audio ends
        up_to_next = (nxt is not None and abs(end - (nxt - rules.min_gap_s)) <= TOL) or (
            nxt is None
            and bool(audio_s)
            and end >= audio_s - TOL  # a segment's times may pass the audio's end
        )
        if not lines:
            problems.append(f"{where}: empty")
            continue
        if len(lines) > rules.lines:
            problems.append(f"{where}: {len(lines)} lines > {rules.lines}")
        for line in lines:
            if len(line) > rules.line_chars and " " in line.strip():
                problems.append(f"{where}: line of {len(line)} characters > {rules.line_chars}: {line!r}")
        if duration > rules.max_s + TOL:
            problems.append(f"{where}: {duration:.3f} s on screen > {rules.max_s}")
        if duration < rules.min_s - TOL:
            if not up_to_next:
                problems.append(f"{where}: {duration:.3f} s on screen < {rules.min_s}")
            else:
                owned.append(f"{where}: {duration:.3f} s on screen < {rules.min_s}")
        if nxt is not None and nxt - end < rules.min_gap_s - TOL:
            problems.append(f"{where}: gap {nxt - end:.3f} s to the next cue < {rules.min_gap_s:.3f}")
        labels = [k for k, line in enumerate(lines) for _ in re.finditer(r"(^|\s)\[[^\]]+\]", line)]
        dash = len(lines) == 2 and all(line.startswith("- ") for line in lines)
        if len(labels) > 1 or (labels and not lines[0].startswith("[")) or (labels and dash):
            problems.append(f"{where}: more than one speaker, or a label not at the start: {lines!r}")
        if len(lines) == 2 and not dash:
            first, second = lines[0].split(), lines[1].split()
            bad_end = first and first[-1].lower() in WEAK_WORDS
            bad_start = second and all(unicodedata.category(c).startswith("P") for c in second[0])
            if (bad_end or bad_start) and _fits_otherwise(first + second, len(first), rules):
                problems.append(f"{where}: unbalanced break {lines!r}")
        if words:
            inside = [w for w in words if w[0] < end - TOL and w[1] > start + TOL]
            chars = sum(len(line) for line in lines)
            # the last word spoken before the cue ends (a cue pushed later by the cues before it may start after
            # its own words ended: words crammed into less time than reading them needs)
            last = max((w[1] for w in words if w[0] < end - TOL), default=end)
            if chars / max(duration, 1e-3) > rules.max_cps + 0.05 and not (
                duration >= rules.max_s - TOL or end >= last + rules.max_pause_s - TOL
            ):
                fast = f"{where}: {chars / max(duration, 1e-3):.1f} characters a second > {rules.max_cps}"
                if not up_to_next:
                    problems.append(fast)
                elif duration >= rules.min_s - TOL:  # a short cue is owned once
                    owned.append(fast)
            at = start
            for w_start, w_end in inside:
                if w_start - at > rules.max_pause_s + TOL:
                    problems.append(f"{where}: on screen over a pause of {w_start - at:.2f} s")
                at = max(at, w_end)
            if inside and end - at > rules.max_pause_s + TOL:
                problems.append(f"{where}: stays {end - at:.2f} s after the last word")
    if noted is not None and len(owned) > noted:
        problems += [f"{line} (the run's notes count {noted} such cue(s))" for line in owned]
    return problems
