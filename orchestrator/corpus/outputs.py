"""User-facing files written from validated artifacts, one renderer per format.

``process`` writes the ``export_formats`` (default SRT, VTT, TXT and the transcript page) and
``segments.jsonl``; ``pipeline export`` writes any of :data:`orchestrator.layout.FORMATS` again from
the stored artifacts (``orchestrator.corpus.export``). Every renderer is a pure function of a
:class:`Sources`: the final transcript, the diarization turns when there are some, the names voice
profiles gave, the run's notes and where the page finds the audio.
"""

from __future__ import annotations

import io
import json
import logging
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from xml.sax.saxutils import escape, quoteattr

from contracts import DiarizationArtifact, EmbeddingsArtifact, TranscriptArtifact
from contracts.io import atomic_write_bytes, atomic_write_text, save_model
from orchestrator import layout
from orchestrator.corpus.captions import CaptionRules, Cue, cues, label, spaced

log = logging.getLogger(__name__)

FORMATS = tuple(layout.FORMATS)


def timestamp(seconds: float, separator: str) -> str:
    millis = max(0, round(seconds * 1000))
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    secs, millis = divmod(millis, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{separator}{millis:03d}"


@dataclass
class Sources:
    """What an input's files are made from."""

    item_id: str
    transcript: TranscriptArtifact
    rules: CaptionRules = field(default_factory=CaptionRules)
    #: who spoke when (None: speakers off, or the fast path went without)
    diarization: DiarizationArtifact | None = None
    #: diarization cluster -> the name a voice profile gave it
    names: dict[str, str] = field(default_factory=dict)
    #: diarization cluster -> (its corpus speaker's id, what the files show for it) (empty: no corpus)
    corpus: dict[str, tuple[str, str]] = field(default_factory=dict)
    #: per segment of ``transcript``: the input's own label and its corpus speaker's id
    #: (:func:`orchestrator.corpus.labels.label_transcript`; empty: ``transcript`` is shown as it is)
    file_speakers: list[str | None] = field(default_factory=list)
    corpus_speakers: list[str | None] = field(default_factory=list)
    #: the run's notes on this input (language, substitutions, damage, ...), shown atop the page
    notes: list[str] = field(default_factory=list)
    #: the audio the page plays, relative to the input's folder (None: none found)
    audio: str | None = None
    #: the input's status in the output folder's index
    status: str = "ok"
    source: str = ""
    #: the English translation's sources (``--translate``; None: none), written as ``transcript.en.*``
    translation: Sources | None = None
    #: the transcript page's language switch: (label, link; None for this page), empty: no switch
    languages: list[tuple[str, str | None]] = field(default_factory=list)

    @cached_property
    def cues(self) -> list[Cue]:
        """The caption cues; each labelled with the speaker its words have in the transcript, never with
        the other voices the diarization hears over them (``overlap``: in segments.jsonl and the JSON)."""
        return cues(self.transcript, self.rules)

    def speakers(self) -> list[str]:
        """Speakers in order of first appearance."""
        return list(dict.fromkeys(s.speaker for s in self.transcript.segments if s.speaker))


def to_srt(src: Sources) -> str:
    return "\n".join(
        f"{n}\n{timestamp(c.start, ',')} --> {timestamp(c.end, ',')}\n{c.text}\n"
        for n, c in enumerate(src.cues, start=1)
    )


def to_vtt(src: Sources) -> str:
    """WebVTT; in a transcript of several languages, a cue in another than the main one is marked
    ``<lang xx>...</lang>`` (its language: that of the segment its middle falls in)."""
    t = src.transcript

    def text(c: Cue) -> str:
        language = segment_language(t, (c.start + c.end) / 2) if t.languages_note else t.language
        return c.text if language == t.language else f"<lang {language}>{c.text}</lang>"

    blocks = [f"{timestamp(c.start, '.')} --> {timestamp(c.end, '.')}\n{text(c)}\n" for c in src.cues]
    return "WEBVTT\n\n" + "\n".join(blocks)


def segment_language(transcript: TranscriptArtifact, at: float) -> str:
    """The language of the segment nearest to time ``at`` (the transcript's own where none says)."""
    if not transcript.segments:
        return transcript.language
    nearest = min(
        transcript.segments,
        key=lambda s: 0.0 if s.start <= at <= s.end else min(abs(s.start - at), abs(s.end - at)),
    )
    return nearest.language or transcript.language


def turns(transcript: TranscriptArtifact) -> list[tuple[str | None, float, float, str]]:
    """Consecutive segments of one speaker joined: (speaker, start, end, text). In a transcript of several
    languages a turn also ends where the language changes, and a turn in another than the main one starts
    with ``[xx]``."""
    glue = " " if spaced(transcript.language) else ""
    several = transcript.languages_note is not None
    out: list[tuple[str | None, float, float, str]] = []
    last = transcript.language
    for seg in transcript.segments:
        text = seg.text.strip()
        language = seg.language or transcript.language
        if several and language != last:
            last = language
            out.append(
                (
                    seg.speaker,
                    seg.start,
                    seg.end,
                    text if language == transcript.language else f"[{language}] {text}",
                )
            )
            continue
        if out and out[-1][0] == seg.speaker:
            speaker, start, _, joined = out[-1]
            out[-1] = (speaker, start, seg.end, f"{joined}{glue}{text}")
        else:
            out.append((seg.speaker, seg.start, seg.end, text))
    return out


def to_txt(src: Sources) -> str:
    """One line per speaker turn."""
    return "".join(f"{label(s) + ' ' if s else ''}{text}\n" for s, _, _, text in turns(src.transcript))


def _cell(text: str) -> str:
    return " ".join(text.split())


def to_tsv(src: Sources) -> str:
    """One row per segment: start and end in seconds, speaker, text."""
    rows = ["start\tend\tspeaker\ttext"]
    rows += [
        f"{s.start:.3f}\t{s.end:.3f}\t{_cell(s.speaker or '')}\t{_cell(s.text)}"
        for s in src.transcript.segments
    ]
    return "\n".join(rows) + "\n"


def to_json(src: Sources) -> str:
    """The transcript without the run's bookkeeping: segments, words, speakers."""
    t = src.transcript
    doc = {
        "id": src.item_id,
        "source": t.source,
        "language": t.language,
        **({"languages": [s.model_dump() for s in t.languages or []]} if t.languages_note else {}),
        "duration_s": t.duration_s,
        "speakers": src.speakers(),
        "segments": [
            {
                "start": s.start,
                "end": s.end,
                "speaker": s.speaker,
                **({"language": s.language or t.language} if t.languages_note else {}),
                **_speaker_fields(src, n, s),
                "text": s.text.strip(),
                "words": [w.model_dump(exclude=set() if w.overlap else {"overlap"}) for w in s.words or []],
            }
            for n, s in enumerate(t.segments)
        ],
    }
    return json.dumps(doc, ensure_ascii=False, indent=1) + "\n"


def _speaker_fields(src: Sources, n: int, segment) -> dict:
    """The input's own label and the corpus speaker's id of segment ``n``, the voices heard with it, and its
    channel when the channels were separated."""
    fields: dict = {}
    if src.file_speakers:
        fields["file_speaker"] = src.file_speakers[n]
        fields["corpus_speaker"] = src.corpus_speakers[n]
    if segment.overlap:
        fields["overlap"] = segment.overlap
    if segment.channel is not None:  # separated channels (PIPELINE_CHANNELS): the source channel, 0-based
        fields["channel"] = segment.channel
    return fields


def _field(text: str) -> str:
    return "_".join(text.split()) or "NA"


def speaker_turns(src: Sources) -> list[tuple[float, float, str]]:
    """Who spoke when: the diarization's turns (named where a profile named them), else (or for separated
    channels, named after them) the segments'."""
    separated = any(s.channel is not None for s in src.transcript.segments)
    if src.diarization is not None and src.diarization.turns and not separated:
        return [
            (
                t.start,
                t.end,
                src.corpus[t.speaker][1] if t.speaker in src.corpus else src.names.get(t.speaker, t.speaker),
            )
            for t in src.diarization.turns
        ]
    return [(s.start, s.end, s.speaker) for s in src.transcript.segments if s.speaker and s.end > s.start]


def to_rttm(src: Sources) -> str:
    """NIST RTTM: one SPEAKER line per turn (names without spaces)."""
    uri = _field(src.item_id.replace("/", "_"))
    return "".join(
        f"SPEAKER {uri} 1 {start:.3f} {end - start:.3f} <NA> <NA> {_field(who)} <NA> <NA>\n"
        for start, end, who in speaker_turns(src)
    )


def _tiers(src: Sources) -> list[tuple[str, list[tuple[float, float, str]]]]:
    """Per speaker, a tier of its segments and one of its words (times clamped so that nothing overlaps)."""
    speakers = src.speakers() or [None]
    tiers = []
    for speaker in speakers:
        segs = [s for s in src.transcript.segments if s.speaker == speaker]
        words = [
            (w.start, w.end, w.word.strip())
            for s in segs
            for w in s.words or []
            if w.start is not None and w.end is not None and w.word.strip()
        ]
        name = speaker or "speech"
        tiers.append((name, _ordered([(s.start, s.end, s.text.strip()) for s in segs])))
        if words:
            tiers.append((f"{name} words", _ordered(words)))
    return tiers


def _ordered(spans: list[tuple[float, float, str]]) -> list[tuple[float, float, str]]:
    out: list[tuple[float, float, str]] = []
    for start, end, text in sorted(spans):
        start = round(max(start, out[-1][1] if out else 0.0), 3)
        end = round(end, 3)
        if end > start:
            out.append((start, end, text))
    return out


def to_textgrid(src: Sources) -> str:
    """Praat TextGrid (long text format): interval tiers per speaker, segments and words."""
    tiers = _tiers(src)
    xmax = max([src.transcript.duration_s] + [s[-1][1] for _, s in tiers if s])

    def q(text: str) -> str:
        return '"' + text.replace('"', '""') + '"'

    lines = [
        'File type = "ooTextFile"',
        'Object class = "TextGrid"',
        "",
        "xmin = 0",
        f"xmax = {xmax}",
        "tiers? <exists>",
        f"size = {len(tiers)}",
        "item []:",
    ]
    for n, (name, spans) in enumerate(tiers, start=1):
        filled: list[tuple[float, float, str]] = []
        at = 0.0
        for start, end, text in spans:
            if start > at:
                filled.append((at, start, ""))
            filled.append((start, end, text))
            at = end
        if at < xmax or not filled:
            filled.append((at, xmax, ""))
        lines += [
            f"    item [{n}]:",
            '        class = "IntervalTier"',
            f"        name = {q(name)}",
            "        xmin = 0",
            f"        xmax = {xmax}",
            f"        intervals: size = {len(filled)}",
        ]
        for k, (start, end, text) in enumerate(filled, start=1):
            lines += [
                f"        intervals [{k}]:",
                f"            xmin = {start}",
                f"            xmax = {end}",
                f"            text = {q(text)}",
            ]
    return "\n".join(lines) + "\n"


def to_eaf(src: Sources) -> str:
    """ELAN annotation document (EAF 3.0): a tier per speaker (its participant), and one of its words."""
    slots: list[int] = []
    tiers_xml = []
    ann = 0
    for name, spans in _tiers(src):
        speaker = name.removesuffix(" words")
        kind = "word" if name.endswith(" words") else "utterance"
        body = []
        for start, end, text in spans:
            slots += [round(start * 1000), round(end * 1000)]
            ann += 1
            body.append(
                f'    <ANNOTATION><ALIGNABLE_ANNOTATION ANNOTATION_ID="a{ann}" '
                f'TIME_SLOT_REF1="ts{len(slots) - 1}" TIME_SLOT_REF2="ts{len(slots)}">'
                f"<ANNOTATION_VALUE>{escape(text)}</ANNOTATION_VALUE></ALIGNABLE_ANNOTATION></ANNOTATION>"
            )
        tiers_xml.append(
            f'  <TIER LINGUISTIC_TYPE_REF="{kind}" PARTICIPANT={quoteattr(speaker)} '
            f"TIER_ID={quoteattr(name)}>\n" + "".join(b + "\n" for b in body) + "  </TIER>"
        )
    media = (
        (
            f'    <MEDIA_DESCRIPTOR MEDIA_URL={quoteattr(src.audio)} MIME_TYPE="audio/ogg" '
            f"RELATIVE_MEDIA_URL={quoteattr('./' + src.audio)}/>\n"
        )
        if src.audio
        else ""
    )
    time_order = "".join(
        f'    <TIME_SLOT TIME_SLOT_ID="ts{n}" TIME_VALUE="{v}"/>\n' for n, v in enumerate(slots, 1)
    )
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        '<ANNOTATION_DOCUMENT AUTHOR="isostage" DATE="'
        f'{src.transcript.created_at.strftime("%Y-%m-%dT%H:%M:%S+00:00")}" FORMAT="3.0" VERSION="3.0" '
        'xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" '
        'xsi:noNamespaceSchemaLocation="http://www.mpi.nl/tools/elan/EAFv3.0.xsd">\n'
        f'  <HEADER MEDIA_FILE="" TIME_UNITS="milliseconds">\n{media}'
        f'    <PROPERTY NAME="lastUsedAnnotationId">{ann}</PROPERTY>\n  </HEADER>\n'
        f"  <TIME_ORDER>\n{time_order}  </TIME_ORDER>\n" + "\n".join(tiers_xml) + "\n"
        '  <LINGUISTIC_TYPE GRAPHIC_REFERENCES="false" LINGUISTIC_TYPE_ID="utterance" TIME_ALIGNABLE="true"/>\n'
        '  <LINGUISTIC_TYPE GRAPHIC_REFERENCES="false" LINGUISTIC_TYPE_ID="word" TIME_ALIGNABLE="true"/>\n'
        "  <CONSTRAINT DESCRIPTION=\"Time subdivision of parent annotation's time interval, no time gaps allowed "
        'within this interval" STEREOTYPE="Time_Subdivision"/>\n'
        '  <CONSTRAINT DESCRIPTION="Symbolic subdivision of a parent annotation. Annotations refering to the same '
        'parent are ordered" STEREOTYPE="Symbolic_Subdivision"/>\n'
        '  <CONSTRAINT DESCRIPTION="1-1 association with a parent annotation" STEREOTYPE="Symbolic_Association"/>\n'
        "  <CONSTRAINT DESCRIPTION=\"Time alignable annotations within the parent annotation's time interval, gaps "
        'are allowed" STEREOTYPE="Included_In"/>\n'
        "</ANNOTATION_DOCUMENT>\n"
    )


def to_docx(src: Sources) -> bytes:
    """A Word document for editors: title, the run's notes, one paragraph per speaker turn."""
    import docx  # python-docx: imported when a document is written

    document = docx.Document()
    document.core_properties.title = src.item_id
    document.add_heading(src.item_id, level=1)
    for note in _page_notes(src):
        document.add_paragraph(note, style="List Bullet")
    for speaker, start, _, text in turns(src.transcript):
        paragraph = document.add_paragraph()
        head = paragraph.add_run(f"{speaker or 'Speech'}  {timestamp(start, '.')[:-4]}")
        head.bold = True
        paragraph.add_run("\n" + text)
    buffer = io.BytesIO()
    document.save(buffer)
    return buffer.getvalue()


def to_aud(src: Sources) -> str:
    """Audacity labels (File > Import > Labels): start, end (seconds), label; one per segment."""
    return "".join(
        f"{s.start:.6f}\t{s.end:.6f}\t{_cell((label(s.speaker) + ' ' if s.speaker else '') + s.text)}\n"
        for s in src.transcript.segments
    )


def _page_notes(src: Sources) -> list[str]:
    from orchestrator.corpus.page import notes

    return notes(src)


def to_html(src: Sources) -> str:
    from orchestrator.corpus.page import transcript_page

    return transcript_page(src)


RENDER = {
    "srt": to_srt,
    "vtt": to_vtt,
    "txt": to_txt,
    "tsv": to_tsv,
    "json": to_json,
    "rttm": to_rttm,
    "textgrid": to_textgrid,
    "eaf": to_eaf,
    "docx": to_docx,
    "html": to_html,
    "aud": to_aud,
}
assert set(RENDER) == set(FORMATS)


#: the formats also written for the English translation (``transcript.en.srt``, ...), with its JSON
TRANSLATED_FORMATS = ("srt", "vtt", "txt", "html")
#: the translation's files are the original's with this before their extensions
TRANSLATED = "en"


def translated_name(name: str) -> str:
    """``transcript.srt`` -> ``transcript.en.srt``: the English translation's file beside the original's."""
    return name.replace("transcript.", f"transcript.{TRANSLATED}.", 1)


def _remove_translation(directory: Path) -> None:
    """An earlier run's English track in ``directory`` removed (the transcript was rewritten without one)."""
    names = ["transcript.json", *(layout.FORMATS[f] for f in TRANSLATED_FORMATS)]
    stale = [p for p in (directory / translated_name(n) for n in names) if p.exists()]
    for path in stale:
        path.unlink(missing_ok=True)
    if stale:
        log.info(
            "%s: the English translation of an earlier run removed (this transcript has none)", directory.name
        )


def write_formats(directory: Path, src: Sources, formats: list[str] | tuple[str, ...]) -> dict[str, str]:
    """Write ``formats`` of ``src`` into ``directory`` (atomic writes), and of its English translation where
    there is one (``transcript.en.json`` and the formats of :data:`TRANSLATED_FORMATS`, same rules and
    speakers); return file name -> path. Where there is none, an earlier run's English files are removed:
    they are of a transcript that is no more."""
    written = {}
    tracks = [(src, formats, lambda name: name)]
    if src.translation is None:
        _remove_translation(directory)
    else:
        english = src.translation
        path = save_model(english.transcript, directory / translated_name("transcript.json"))
        written[path.name] = str(path)
        tracks.append((english, [f for f in formats if f in TRANSLATED_FORMATS], translated_name))
    for track, names, rename in tracks:
        for name in names:
            data = RENDER[name](track)
            path = directory / rename(layout.FORMATS[name])
            if isinstance(data, bytes):
                atomic_write_bytes(path, data)
            else:
                atomic_write_text(path, data)
            written[path.name] = str(path)
    return written


def to_jsonl(
    transcript: TranscriptArtifact, embeddings: EmbeddingsArtifact, vectors, src: Sources | None = None
) -> str:
    """One line per segment: text, times, speaker (with ``src``: the input's own label, the corpus speaker's
    id and the voices heard with it too), its row in embeddings.npy and the vector itself."""
    if embeddings.count != len(transcript.segments):
        raise ValueError(f"{embeddings.count} embeddings for {len(transcript.segments)} segments")
    lines = []
    for row, segment in enumerate(transcript.segments):
        record = {
            "id": segment.id,
            "start": segment.start,
            "end": segment.end,
            "text": segment.text,
            "speaker": segment.speaker,
            **(_speaker_fields(src, row, segment) if src is not None else {}),
            "embedding_row": row,
            "embedding": [round(float(x), 7) for x in vectors[row]],
        }
        lines.append(json.dumps(record, ensure_ascii=False))
    return "".join(line + "\n" for line in lines)


def write_outputs(
    directory: Path,
    src: Sources,
    embeddings: EmbeddingsArtifact,
    vectors,
    formats: list[str] | tuple[str, ...] = ("srt", "vtt", "txt", "html"),
) -> dict[str, str]:
    """What ``process`` writes next to transcript.json and embeddings.npy; return name -> path."""
    written = write_formats(directory, src, formats)
    written["segments.jsonl"] = str(
        atomic_write_text(directory / "segments.jsonl", to_jsonl(src.transcript, embeddings, vectors, src))
    )
    written["transcript.json"] = str(directory / "transcript.json")
    written["embeddings.npy"] = str(directory / embeddings.sidecar)
    written["embeddings.json"] = str(directory / "embeddings.json")
    return written
