"""SRT / VTT / TXT / JSONL writers."""

from __future__ import annotations

import json

import numpy as np
import pytest

from contracts import EmbeddingsArtifact, TranscriptArtifact
from orchestrator.run.outputs import timestamp, to_jsonl, to_srt, to_txt, to_vtt

T = TranscriptArtifact(
    item_id="a", fingerprint="f", source="/a.mp4", language="en", model="m", requested_model="embedded",
    device="cpu", compute_type="int8", batch_size=1, duration_s=3700.0,
    segments=[{"id": 0, "start": 0.0, "end": 1.25, "text": "Hello there."},
              {"id": 1, "start": 3599.9994, "end": 3601.5, "text": "Bye.", "speaker": "Host"}],
)


def test_timestamps():
    assert timestamp(3661.5, ",") == "01:01:01,500"
    assert timestamp(3599.9996, ".") == "01:00:00.000"


def test_srt_and_vtt():
    assert to_srt(T) == "1\n00:00:00,000 --> 00:00:01,250\nHello there.\n\n2\n00:59:59,999 --> 01:00:01,500\n[Host] Bye.\n"
    assert to_vtt(T).startswith("WEBVTT\n\n00:00:00.000 --> 00:00:01.250\nHello there.\n")
    assert to_txt(T) == "Hello there.\n[Host] Bye.\n"


def test_jsonl_rows_match_embeddings():
    vectors = np.eye(2, 4, dtype=np.float32)
    emb = EmbeddingsArtifact(item_id="a", fingerprint="f", source="/a", sidecar="embeddings.npy", sha256="0" * 64,
                             model="m", profile="speed", requested_model="m", dimension=4, count=2, normalized=True,
                             device="cpu", batch_size=1)
    lines = [json.loads(line) for line in to_jsonl(T, emb, vectors).splitlines()]
    assert [(line["embedding_row"], line["text"], line["embedding"]) for line in lines] == [
        (0, "Hello there.", [1.0, 0.0, 0.0, 0.0]), (1, "Bye.", [0.0, 1.0, 0.0, 0.0])]
    with pytest.raises(ValueError, match="1 embeddings for 2 segments"):
        to_jsonl(T, emb.model_copy(update={"count": 1}), vectors[:1])
