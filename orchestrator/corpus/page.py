"""The transcript page (``OUT/<id>/transcript.html``) and the output folder's index (``OUT/index.html``).

Both are self-contained: styles and the few lines of script are inline, nothing is fetched. Each word of
the page is a button that plays the audio from its start (an ``<audio>`` element on the compressed copy
kept beside the page, :data:`orchestrator.layout.LISTEN`, so the folder can be moved; an input that has
none yet points at its source). Words the aligner scored below :data:`LOW_SCORE` are marked.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from html import escape
from urllib.parse import quote

from orchestrator import layout

#: words scored below this by the aligner are marked as doubtful on the page
LOW_SCORE = 0.5
#: speaker colours, in order of first appearance (readable on white, distinct for colour-blind readers)
COLOURS = ("#0072b2", "#d55e00", "#009e73", "#cc79a7", "#8a6d00", "#56b4e9", "#6a3d9a", "#b15928")

_STYLE = """
body{font:16px/1.6 system-ui,sans-serif;margin:0 auto;max-width:52rem;padding:1rem 1.5rem 6rem;color:#222}
h1{font-size:1.3rem;margin:.2rem 0}
.notes{background:#f6f6f2;border-left:4px solid #999;padding:.4rem 1rem;margin:.8rem 0;font-size:.9rem}
.notes li{margin:.1rem 0}
audio{position:sticky;top:0;width:100%;background:#fff;z-index:1;padding:.3rem 0}
.turn{margin:.9rem 0;padding-left:.8rem;border-left:4px solid var(--c)}
.who{font-weight:600;color:var(--c);font-size:.9rem}
.who time{color:#777;font-weight:400;margin-left:.5rem}
.w{cursor:pointer;border-radius:3px;padding:0 1px}
.w:hover{background:#eee}
.w.low{text-decoration:underline wavy #c00;text-underline-offset:3px}
.w.now{background:#ffe58a}
.legend{font-size:.85rem;color:#555}
.legend .w{cursor:default}
table{border-collapse:collapse;width:100%}td,th{text-align:left;padding:.3rem .6rem;border-bottom:1px solid #ddd}
.failed,.interrupted{color:#b00}.partial{color:#a60}
"""

_SCRIPT = """
const audio=document.getElementById('audio');const words=[...document.querySelectorAll('.w[data-s]')];
document.getElementById('text').addEventListener('click',e=>{const w=e.target.closest('.w[data-s]');
if(!w||!audio)return;audio.currentTime=parseFloat(w.dataset.s);const p=audio.play();if(p)p.catch(()=>{});});
let now=null;if(audio)audio.addEventListener('timeupdate',()=>{const t=audio.currentTime;
let lo=0,hi=words.length-1,hit=null;
while(lo<=hi){const m=(lo+hi)>>1;if(parseFloat(words[m].dataset.s)<=t){hit=words[m];lo=m+1}else hi=m-1}
if(hit!==now){if(now)now.classList.remove('now');if(hit)hit.classList.add('now');now=hit;}});
function seek(){const m=/^#t=([0-9.]+)$/.exec(location.hash);if(!m)return;const t=parseFloat(m[1]);
const w=words.find(x=>parseFloat(x.dataset.s)>=t-0.05)||words[words.length-1];if(!w)return;
if(now)now.classList.remove('now');w.classList.add('now');now=w;w.scrollIntoView({block:'center'});
if(audio)audio.currentTime=parseFloat(w.dataset.s);}
seek();window.addEventListener('hashchange',seek);
"""


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def notes(src) -> list[str]:
    """The run's notes for an input, as the page and the document show them atop the transcript."""
    t = src.transcript
    found = t.language_id
    if found and found.language and found.language != t.language:  # the English translation's page
        lines = [f"Language: {t.language} (translated from {found.language})"]
    elif found and found.status == "detected" and found.probability is not None:
        lines = [f"Language: {t.language} (detected, p={found.probability:.2f})"]
    elif found:
        lines = [f"Language: {t.language} ({found.status}{': ' + found.reason if found.reason else ''})"]
    else:
        lines = [f"Language: {t.language}"]
    lines.append(
        f"Transcribed by {t.model}"
        + (f"; words timed by {t.aligner}" if t.aligner else "")
        + (f"; speakers by {t.diarization}" if t.diarization else "")
    )
    if t.source_damage:
        lines.append(f"Damaged source: {t.source_damage}")
    lines += [
        n for n in (t.languages_note, t.source_track, t.speakers_note, t.speech_note, t.alignment_note) if n
    ]
    lines += [n for n in src.notes if n not in lines]
    return lines


def _colours(src) -> dict[str | None, str]:
    return {s: COLOURS[n % len(COLOURS)] for n, s in enumerate(src.speakers())} | {None: "#777"}


def transcript_page(src) -> str:
    """One input's transcript as a page: notes, the audio, speaker turns of clickable words."""
    from orchestrator.corpus.captions import spaced

    t = src.transcript
    colours = _colours(src)
    glue = " " if spaced(t.language) else ""
    turns: list[tuple[str | None, float, list[str]]] = []
    low = 0
    for seg in t.segments:
        timed = [w for w in seg.words or [] if w.start is not None and w.word.strip()]
        if timed:
            spans = []
            for w in timed:
                doubtful = w.score is not None and w.score < LOW_SCORE
                low += doubtful
                title = f"{_clock(w.start)}" + (f" · score {w.score:.2f}" if w.score is not None else "")
                spans.append(
                    f'<span class="w{" low" if doubtful else ""}" data-s="{w.start:.3f}" '
                    f'title="{title}">{escape(w.word.strip())}</span>'
                )
        else:  # no word times: the segment is one clickable span
            spans = [
                f'<span class="w" data-s="{seg.start:.3f}" title="{_clock(seg.start)}">'
                f"{escape(seg.text.strip())}</span>"
            ]
        if turns and turns[-1][0] == seg.speaker:
            turns[-1][2].extend(spans)
        else:
            turns.append((seg.speaker, seg.start, spans))
    body = "\n".join(
        f'<div class="turn" style="--c:{colours.get(who, "#777")}"><div class="who">{escape(who or "Speech")}'
        f"<time>{_clock(start)}</time></div><p>{glue.join(spans)}</p></div>"
        for who, start, spans in turns
    )
    audio = (
        f'<audio id="audio" controls preload="metadata" src="{escape(quote(src.audio))}"></audio>'
        if src.audio
        else '<p class="notes">No audio found for this input: the words cannot play.</p>'
    )
    items = "".join(f"<li>{escape(n)}</li>" for n in notes(src))
    switch = " · ".join(
        f'<a href="{escape(quote(href))}">{escape(name)}</a>' if href else f"<b>{escape(name)}</b>"
        for name, href in src.languages
    )
    switch = f'<nav class="languages">{switch}</nav>\n' if switch else ""
    legend = (
        f'<p class="legend">{len(src.speakers())} speaker(s); '
        f'<span class="w low">underlined</span> words ({low}) scored below {LOW_SCORE:.1f}; '
        "click a word to listen from there.</p>"
    )
    return (
        f'<!DOCTYPE html>\n<html lang="{escape(t.language or "und")}"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>{escape(src.item_id)}</title><style>{_STYLE}</style></head>\n<body>\n"
        f'<h1>{escape(src.item_id)}</h1>\n{switch}<ul class="notes">{items}</ul>\n{legend}\n{audio}\n'
        f'<main id="text">\n{body or "<p>No speech was transcribed.</p>"}\n</main>\n'
        f"<script>{_SCRIPT}</script>\n</body></html>\n"
    )


def index_page(rows: list[dict]) -> str:
    """The output folder's index: one row per input (id, status, duration, links to its files).

    ``rows``: ``{"id", "status", "source", "duration_s", "error", "files": [names in OUT/<id>/]}``."""
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["status"]] = counts.get(row["status"], 0) + 1
    return "".join(index_pieces(rows, counts))


def index_pieces(rows: Iterable[dict], counts: dict[str, int]) -> Iterator[str]:
    """:func:`index_page` a piece at a time (``counts``: status -> inputs, for the line above the table):
    the index of 100,000 inputs is written without being held whole."""
    summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    yield (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>Transcripts</title>'
        f"<style>{_STYLE}body{{max-width:80rem}}</style></head>\n<body>\n<h1>Transcripts</h1>\n"
        f"<p>{sum(counts.values())} inputs: {summary or 'none'}</p>\n"
        "<table><thead><tr><th>input</th><th>status</th><th>length</th><th>files</th><th>source</th></tr>"
        "</thead><tbody>\n"
    )
    for row in rows:
        yield index_row(row) + "\n"
    yield "</tbody></table>\n</body></html>\n"


def index_row(row: dict) -> str:
    """One input's row of the index."""
    base = quote(row["id"]) + "/"
    links = " ".join(
        f'<a href="{base}{quote(name)}">{escape(name.removeprefix("transcript."))}</a>'
        for name in row.get("files") or []
    )
    page = layout.FORMATS["html"]
    name = (
        f'<a href="{base}{page}">{escape(row["id"])}</a>'
        if page in (row.get("files") or [])
        else escape(row["id"])
    )
    duration = _clock(row["duration_s"]) if row.get("duration_s") else ""
    status = escape(row["status"]) + (f": {escape(row['error'])}" if row.get("error") else "")
    return (
        f'<tr><td>{name}</td><td class="{escape(row["status"])}">{status}</td><td>{duration}</td>'
        f"<td>{links}</td><td>{escape(row.get('source') or '')}</td></tr>"
    )
