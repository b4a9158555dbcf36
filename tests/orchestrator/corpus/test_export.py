"""`pipeline export`: every format written again from stored artifacts, read back by the library its users use."""

from __future__ import annotations

import html
import json
import re
import time
from pathlib import Path

import pytest

from contracts import DiarizationArtifact, TranscriptArtifact, save_model
from orchestrator import layout
from orchestrator.corpus.captions import CaptionRules, cues
from orchestrator.planning.inputs import save_ids
from tests.caption_rules import check
from tests.conftest import MEDIA, pipeline

SENTENCES = [
    ("Host", "Thanks for joining us. What got you interested in mapping the old roads of the county?"),
    ("Guest", "It started on long walks with my father, who could name every hill we passed."),
    ("Host", "And how do you find a road that nobody has used for a century?"),
]


def transcript(item_id: str = "talk") -> TranscriptArtifact:
    """Two named speakers, timed and scored words (one doubtful), as the alignment stage writes them."""
    segments, at = [], 0.2
    for n, (speaker, text) in enumerate(SENTENCES):
        words, start = [], at
        for k, word in enumerate(text.split()):
            words.append(
                {
                    "word": word,
                    "start": round(at, 3),
                    "end": round(at + 0.3, 3),
                    "score": 0.2 if (n, k) == (1, 8) else 0.9,
                    "speaker": speaker,
                }
            )
            at += 0.34
        segments.append(
            {
                "id": n,
                "start": round(start, 3),
                "end": round(at, 3),
                "text": " " + text,
                "words": words,
                "speaker": speaker,
            }
        )
        at += 0.6
    return TranscriptArtifact(
        item_id=item_id,
        fingerprint="f",
        source=str(MEDIA / "speech.wav"),
        language="en",
        model="tiny.en",
        requested_model="embedded",
        device="cpu",
        compute_type="int8",
        batch_size=1,
        aligned=True,
        aligner="whisper-cross-attention",
        duration_s=at + 1,
        segments=segments,
        diarization="embedded",
        source_damage="decoded 9.0 s of 10.0 s",
    )


@pytest.fixture(scope="module")
def out(tmp_path_factory) -> Path:
    """An output folder with one processed input, as `process` leaves it (artifacts, index, journal)."""
    out = tmp_path_factory.mktemp("export") / "out"
    t = transcript()
    save_model(t, out / "talk" / "transcript.json")
    turns = [
        {"start": s.start, "end": s.end, "speaker": f"SPEAKER_0{n % 2}"} for n, s in enumerate(t.segments)
    ]
    save_model(
        DiarizationArtifact(
            item_id="talk",
            fingerprint="f",
            source=t.source,
            turns=turns,
            model="embedded",
            requested_model="auto",
            device="cpu",
            duration_s=t.duration_s,
        ),
        out / "talk" / "diarization.json",
    )
    save_ids(out, {str(MEDIA / "speech.wav"): "talk"})
    (out / layout.JOURNAL).write_text(
        json.dumps(
            {
                "item": "talk",
                "stage": "outputs",
                "status": "ok",
                "summary": {
                    "notes": ["embeddings: asked for 'speed', used the embedded all-MiniLM-L6-v2"],
                    "duration_s": 12.0,
                },
            }
        )
        + "\n"
    )
    result = pipeline("export", str(out), "--format", "all", timeout=120)
    assert result.returncode == 0, result.stderr
    assert "1 inputs, 11 files" in result.stderr
    return out


def test_srt_read_by_srt_and_vtt_by_webvtt_py(out):
    import srt
    import webvtt

    subs = list(srt.parse((out / "talk" / "transcript.srt").read_text()))
    assert subs[0].content.startswith("[Host] Thanks for joining us.")
    assert {s.content.split("]")[0] for s in subs} == {"[Host", "[Guest"}
    vtt = webvtt.read(str(out / "talk" / "transcript.vtt"))
    assert [c.text for c in vtt] == [s.content for s in subs]
    assert check(out / "talk" / "transcript.srt") == [] and check(out / "talk" / "transcript.vtt") == []


def test_rttm_read_by_pyannote_database(out):
    from pyannote.database.util import load_rttm

    annotation = load_rttm(str(out / "talk" / "transcript.rttm"))["talk"]
    assert sorted(annotation.labels()) == ["SPEAKER_00", "SPEAKER_01"]  # the diarization's turns
    assert abs(annotation.get_timeline().extent().end - transcript().segments[-1].end) < 0.01


def test_textgrid_read_by_praatio_with_speaker_tiers(out):
    from praatio import textgrid

    tg = textgrid.openTextgrid(str(out / "talk" / "transcript.TextGrid"), includeEmptyIntervals=False)
    assert tg.tierNames == ("Host", "Host words", "Guest", "Guest words")
    assert [e.label for e in tg.getTier("Guest words").entries][:3] == ["It", "started", "on"]
    assert tg.getTier("Host").entries[0].label.startswith("Thanks for joining us.")


def test_eaf_read_by_pympi_with_a_tier_per_speaker(out):
    import pympi

    eaf = pympi.Elan.Eaf(str(out / "talk" / "transcript.eaf"))
    assert set(eaf.get_tier_names()) == {"Host", "Host words", "Guest", "Guest words"}
    assert eaf.tiers["Guest"][2]["PARTICIPANT"] == "Guest"
    first = sorted(eaf.get_annotation_data_for_tier("Host"))[0]
    assert first[0] == 200 and first[2].startswith("Thanks for joining us.")
    assert len(eaf.get_annotation_data_for_tier("Guest words")) == len(SENTENCES[1][1].split())


def test_docx_read_by_python_docx(out):
    import docx

    document = docx.Document(str(out / "talk" / "transcript.docx"))
    text = [p.text for p in document.paragraphs]
    assert text[0] == "talk" and any("Damaged source" in line for line in text)
    turns = [p for p in document.paragraphs if p.runs and p.runs[0].bold]
    assert [p.runs[0].text.split()[0] for p in turns] == ["Host", "Guest", "Host"]
    assert turns[1].text.endswith(SENTENCES[1][1])


def test_audacity_labels_tsv_and_json_follow_their_layout(out):
    labels = [line.split("\t") for line in (out / "talk" / "transcript.labels.txt").read_text().splitlines()]
    assert len(labels) == 3 and all(len(row) == 3 for row in labels)
    assert float(labels[0][0]) == 0.2 and labels[1][2].startswith("[Guest] It started")
    rows = (out / "talk" / "transcript.tsv").read_text().splitlines()
    assert rows[0] == "start\tend\tspeaker\ttext" and rows[2].split("\t")[2] == "Guest"
    doc = json.loads((out / "talk" / "transcript.words.json").read_text())
    assert doc["speakers"] == ["Host", "Guest"] and doc["segments"][1]["words"][8]["score"] == 0.2


def test_index_lists_every_input_with_status_and_links(out):
    page = (out / layout.INDEX).read_text()
    assert 'href="talk/transcript.html"' in page and 'href="talk/transcript.eaf"' in page
    assert "1 inputs: 1 ok" in page and "speech.wav" in page  # status from the journal, source from the ids


def test_export_rerenders_with_current_caption_settings_and_refuses_unknown_inputs(out, tmp_path):
    env = {"CAPTION_LINE_CHARS": "20", "CAPTION_LINES": "3", "PATH": "/usr/bin:/bin"}
    result = pipeline(
        "export", str(out), "-f", "srt", "--inputs", "talk", "--inputs", str(MEDIA / "speech.wav"), env=env
    )
    assert result.returncode == 0, result.stderr
    lines = [
        x
        for x in (out / "talk" / "transcript.srt").read_text().splitlines()
        if x and "-->" not in x and not x.isdigit()
    ]
    assert max(map(len, lines)) <= 20
    result = pipeline("export", str(out), "--inputs", "nope", timeout=120)
    assert result.returncode == 2 and "UNKNOWN nope" in result.stderr
    # back to the defaults, so the session's caption check sees files of the default rules
    assert pipeline("export", str(out), "-f", "srt", timeout=120).returncode == 0


def fast_speech() -> TranscriptArtifact:
    """3 minutes of fast speech: 4 words a second, pauses, speaker changes."""
    import random

    rng = random.Random(3)
    vocab = "the a of we it road county field summer father walk hill century map track line pale dry".split()
    segments, at = [], 0.0
    for n in range(40):
        words = []
        start = at
        for _ in range(rng.randint(3, 25)):
            word = rng.choice(vocab) + ("." if rng.random() < 0.12 else "")
            words.append({"word": word, "start": round(at, 3), "end": round(at + 0.2, 3)})
            at += 0.25 + (rng.random() < 0.05) * 2.5
        segments.append(
            {
                "id": n,
                "start": round(start, 3),
                "end": round(at, 3),
                "speaker": f"S{n % 3}",
                "text": " ".join(w["word"] for w in words),
                "words": words,
            }
        )
        at += rng.choice([0.0, 0.3, 3.0])
    return transcript().model_copy(
        update={
            "segments": TranscriptArtifact.model_validate(
                {**transcript().model_dump(), "segments": segments}
            ).segments,
            "duration_s": round(at, 3),  # the audio lasts as long as its words
        }
    )


def test_caption_rules_hold_on_long_fast_speech():
    """Given 3 minutes of fast speech, when captioned, then every cue keeps the rules the words allow
    (checked on the SRT as a viewer gets it)."""
    from orchestrator.corpus.outputs import Sources, to_srt

    t = fast_speech()

    started = time.perf_counter()
    text = to_srt(Sources("fast", t))
    assert time.perf_counter() - started < 2.0
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "transcript.srt").write_text(text)
        save_model(t, Path(tmp) / "transcript.json")
        assert check(Path(tmp) / "transcript.srt") == []
    # one label per cue, or two speakers' words as a dash per line (a rapid exchange)
    assert all(
        c.text.count("[") == 1
        or (c.text.count("[") == 0 and c.text.count("\n- ") == 1 and c.text[:2] == "- ")
        for c in cues(t, CaptionRules())
    )


def test_cjk_captions_use_their_script_limits():
    """Given a Japanese transcript (words without spaces), then lines hold at most 13 characters, unspaced."""
    words = [
        {"word": w, "start": n * 0.5, "end": n * 0.5 + 0.4}
        for n, w in enumerate(
            ["今日は", "とても", "いい", "天気", "ですね。", "散歩に", "行きましょう", "か。"]
        )
    ]
    t = TranscriptArtifact.model_validate(
        {
            **transcript().model_dump(),
            "language": "ja",
            "segments": [
                {"id": 0, "start": 0.0, "end": 4.0, "text": "".join(w["word"] for w in words), "words": words}
            ],
        }
    )
    lines = [line for c in cues(t) for line in c.text.split("\n")]
    assert all(len(line) <= 13 for line in lines) and " " not in "".join(lines)
    assert "".join(lines) == "今日はとてもいい天気ですね。散歩に行きましょうか。"


def test_each_export_counts_its_own_tight_cues_on_the_page_and_in_the_journal(tmp_path):
    """Given an output folder whose journal notes a count of tight cues from an earlier rendering, when
    exported with narrower lines (more, shorter cues), then the page and the journal count the cues of the
    files written now, once, and the caption check (which reads the page) finds nothing unowned."""
    out = tmp_path / "out"
    t = fast_speech()
    save_model(t, out / "talk" / "transcript.json")
    save_ids(out, {str(MEDIA / "speech.wav"): "talk"})
    stale = "captions: 99 of 99 cue(s) shorter than 0.833 s or faster than 17 characters a second: old"
    event = {
        "item": "talk",
        "stage": "outputs",
        "status": "ok",
        "files": {},
        "summary": {"notes": ["a note of the run", stale], "duration_s": t.duration_s},
    }
    (out / layout.JOURNAL).write_text(json.dumps(event) + "\n")
    counts = []
    for chars in ("16", "42"):  # the defaults last: the session's caption check sees files of the defaults
        result = pipeline(
            "export", str(out), "-f", "srt,html", env={"CAPTION_LINE_CHARS": chars, "PATH": "/usr/bin:/bin"}
        )
        assert result.returncode == 0, result.stderr
        page = (out / "talk" / "transcript.html").read_text()
        noted = re.findall(r"<li>(captions: (\d+) of (\d+) cue[^<]*)</li>", page)
        assert len(noted) == 1 and stale not in page and "a note of the run" in page, noted
        cues_in_file = (out / "talk" / "transcript.srt").read_text().count(" --> ")
        assert int(noted[0][2]) == cues_in_file
        if chars == "42":  # the check knows the default rules only
            assert check(out / "talk" / "transcript.srt") == []
        last = json.loads((out / layout.JOURNAL).read_text().splitlines()[-1])
        assert last["summary"]["notes"] == ["a note of the run", html.unescape(noted[0][0])]
        counts.append(int(noted[0][1]))
    assert counts[0] > counts[1], counts  # the narrow lines leave more cues no time to be read


def test_the_index_of_a_large_folder_is_written_a_row_at_a_time(tmp_path):
    """A corpus's index has a row per input: the page is streamed to disk, never held whole."""
    import tracemalloc

    from orchestrator.corpus.export import write_index

    out = tmp_path / "out"
    count, error = 2000, "could not decode: " + "x" * 5000
    save_ids(out, {f"/corpus/{n:04d}/audio.wav": f"corpus/{n:04d}/audio" for n in range(count)})
    with layout.path(out, layout.JOURNAL).open("w") as fh:
        for n in range(count):
            event = {"item": f"corpus/{n:04d}/audio", "stage": "outputs", "status": "failed", "error": error}
            fh.write(json.dumps(event) + "\n")
    tracemalloc.start()
    try:
        write_index(out)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    page = layout.path(out, layout.INDEX).read_text()
    # Then every input has its row and the count above the table, and the peak holds the errors about once
    # (the journal's), not again as rows, the page and its bytes
    assert page.count("<tr><td>") == count and f"<p>{count} inputs: {count} failed</p>" in page
    assert peak < 1.6 * count * len(error), (peak, count * len(error))
