"""SRT / VTT / TXT / JSONL writers."""

from __future__ import annotations

import json

import numpy as np
import pytest

from contracts import EmbeddingsArtifact, TranscriptArtifact
from orchestrator.corpus.captions import CaptionRules, cues
from orchestrator.corpus.outputs import Sources, timestamp, to_jsonl, to_srt, to_txt, to_vtt

T = TranscriptArtifact(
    item_id="a",
    fingerprint="f",
    source="/a.mp4",
    language="en",
    model="m",
    requested_model="embedded",
    device="cpu",
    compute_type="int8",
    batch_size=1,
    duration_s=3700.0,
    segments=[
        {"id": 0, "start": 0.0, "end": 1.25, "text": "Hello there."},
        {"id": 1, "start": 3599.9994, "end": 3601.5, "text": "Bye.", "speaker": "Host"},
    ],
)


def test_timestamps():
    assert timestamp(3661.5, ",") == "01:01:01,500"
    assert timestamp(3599.9996, ".") == "01:00:00.000"


def test_srt_and_vtt():
    src = Sources("a", T)
    assert (
        to_srt(src)
        == "1\n00:00:00,000 --> 00:00:01,250\nHello there.\n\n2\n00:59:59,999 --> 01:00:01,500\n[Host] Bye.\n"
    )
    assert to_vtt(src).startswith("WEBVTT\n\n00:00:00.000 --> 00:00:01.250\nHello there.\n")
    assert to_txt(src) == "Hello there.\n[Host] Bye.\n"


def test_jsonl_rows_match_embeddings():
    vectors = np.eye(2, 4, dtype=np.float32)
    emb = EmbeddingsArtifact(
        item_id="a",
        fingerprint="f",
        source="/a",
        sidecar="embeddings.npy",
        sha256="0" * 64,
        model="m",
        profile="speed",
        requested_model="m",
        dimension=4,
        count=2,
        normalized=True,
        device="cpu",
        batch_size=1,
    )
    lines = [json.loads(line) for line in to_jsonl(T, emb, vectors).splitlines()]
    assert [(line["embedding_row"], line["text"], line["embedding"]) for line in lines] == [
        (0, "Hello there.", [1.0, 0.0, 0.0, 0.0]),
        (1, "Bye.", [0.0, 1.0, 0.0, 0.0]),
    ]
    with pytest.raises(ValueError, match="1 embeddings for 2 segments"):
        to_jsonl(T, emb.model_copy(update={"count": 1}), vectors[:1])


def _with(segments) -> TranscriptArtifact:
    return TranscriptArtifact.model_validate({**T.model_dump(), "segments": segments})


def _words(spec):
    return [{"word": w, "start": s, "end": e} for w, s, e in spec]


def test_cues_split_at_sentence_ends_length_and_time_and_never_overlap():
    long_words = [(f"word{n:02d}", n * 0.5, n * 0.5 + 0.4) for n in range(30)]  # 15 s, ~200 characters
    t = _with(
        [
            {
                "id": 0,
                "start": 0.0,
                "end": 3.0,
                "text": "Hi. How are you?",
                "speaker": "Host",
                "words": _words(
                    [("Hi.", 0.0, 0.4), ("How", 0.5, 0.8), ("are", 0.8, 1.0), ("you?", 1.0, 3.2)]
                ),
            },
            {
                "id": 1,
                "start": 3.0,
                "end": 18.0,
                "text": " ".join(w for w, _, _ in long_words),
                "speaker": "Guest",
                "words": _words([(w, s + 3.0, e + 3.0) for w, s, e in long_words]),
            },
        ]
    )
    cs = cues(t)
    assert cs[0].text == "[Host] Hi. How are you?"  # one sentence after another, both fit one cue
    for a, b in zip(cs, cs[1:]):
        assert a.end <= b.start, (a, b)
    for c in cs:
        lines = c.text.split("\n")
        assert len(lines) <= 2 and all(len(line) <= 42 for line in lines), c
        assert c.end - c.start <= 7.0 and c.text.count("[") == 1, c
    assert " ".join(c.text.replace("[Guest] ", "").replace("\n", " ") for c in cs[1:]) == t.segments[1].text
    srt = to_srt(Sources("a", t, CaptionRules(line_chars=20, max_s=2.0)))
    assert "[Host] Hi." in srt and max(len(line) for line in srt.splitlines() if "-->" not in line) <= 20


def test_txt_is_one_line_per_speaker_turn():
    t = _with(
        [
            {"id": 0, "start": 0.0, "end": 1.0, "text": "Hello.", "speaker": "Host"},
            {"id": 1, "start": 1.0, "end": 2.0, "text": "Welcome.", "speaker": "Host"},
            {"id": 2, "start": 2.0, "end": 3.0, "text": "Thanks.", "speaker": "Guest"},
        ]
    )
    assert to_txt(Sources("a", t)) == "[Host] Hello. Welcome.\n[Guest] Thanks.\n"
