"""The production ASR model and English aligner, cached as a download leaves them, run offline by the pipeline.

Stand-ins of ``Systran/faster-distil-whisper-large-v3`` (in the Hugging Face cache) and of whisperX's English
wav2vec2 aligner (in torch hub's checkpoints), built from their real configurations with random weights
(``tests.fixtures.hub_audio_standins``), are loaded through the same code a cached real model takes: real
children (``bin/pipeline process``), the hub closed (``HF_HUB_OFFLINE=1``). Their transcript is garbage: what
is checked is which model ran, how the artifacts and the run report name it, and what a rerun redoes.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from contracts import TranscriptArtifact, load_artifact
from orchestrator import layout
from tests.conftest import ROOT
from tests.fixtures.generate import clips
from tests.fixtures.hub_audio_standins import (
    DISTIL_CONFIG,
    DISTIL_REPO,
    DISTIL_REVISION,
    EN_ALIGNER_BUNDLE,
    build_distil_large_v3,
    build_english_aligner,
    standins_root,
)

pytestmark = pytest.mark.slow

DISTIL = f"{DISTIL_REPO}@{DISTIL_REVISION}"
ITEM = "talks/clip000"


def _pipeline(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(ROOT / "bin" / "pipeline"), "process", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **env},
    )


@pytest.fixture(scope="module")
def standins() -> Path:
    root = standins_root()
    build_distil_large_v3(root / "hf")
    build_english_aligner(root / "torch")
    return root


@pytest.fixture(scope="module")
def done(standins, tmp_path_factory):
    """One run: distil-large-v3 from the cache, English forced (the aligner's language), no aligner on disk
    (words timed by the ASR model's cross-attention), the embedded text embedder (no fallback to report), no
    caption files."""
    base = tmp_path_factory.mktemp("standins")
    clips(base / "talks", 1, seconds=2.0)
    env = {
        "ASR_MODEL": "distil-large-v3",
        "ASR_LANGUAGE": "en",
        "EMBEDDING_PROFILE": "embedded",
        "PIPELINE_FORMATS": "txt,html",  # random words, crammed into 2 s, make no captions worth checking
        "HF_HOME": str(standins / "hf"),
        "HF_HUB_OFFLINE": "1",
        "TORCH_HOME": str(base / "torch-without-aligner"),
    }
    args = [str(base / "talks"), "--output", str(base / "out"), "--no-speakers", "--offline"]
    first = _pipeline(*args, env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    return base / "out", args, env


def test_the_stand_in_has_distil_large_v3s_shapes(standins):
    import ctranslate2

    snapshot = standins / "hf" / "hub" / f"models--{DISTIL_REPO.replace('/', '--')}" / "snapshots"
    snapshot = snapshot / DISTIL_REVISION
    assert sorted(p.name for p in snapshot.iterdir()) == [
        "config.json",
        "model.bin",
        "preprocessor_config.json",
        "tokenizer.json",
        "vocabulary.json",
    ]
    whisper = ctranslate2.models.Whisper(str(snapshot), device="cpu")
    assert (whisper.n_mels, whisper.is_multilingual, whisper.num_languages) == (128, True, 100)
    assert len(json.loads((snapshot / "vocabulary.json").read_text())) == DISTIL_CONFIG["vocab_size"] == 51866
    assert json.loads((snapshot / "preprocessor_config.json").read_text())["feature_size"] == 128


def test_the_cached_model_runs_offline_and_is_named_by_repository_and_revision(done, standins):
    out, args, env = done
    report = json.loads((out / layout.REPORT).read_text())
    assert report["substitutions"] == [], report["substitutions"]
    asr = [a for s in report["stages"] if s["stage"] == "asr" for a in s["attempts"]]
    assert [a["model"] for a in asr] == [f"{DISTIL} (ctranslate2, int8)"]
    transcript = load_artifact(out / ITEM / "transcript.json", TranscriptArtifact)
    assert (transcript.model, transcript.requested_model) == (DISTIL, "distil-large-v3")
    assert (transcript.runtime, transcript.runtime_note, transcript.language) == ("ctranslate2", None, "en")
    assert transcript.aligner == "whisper-cross-attention:distil-large-v3", "no aligner on disk"
    for path in [out / layout.REPORT, *(out / ITEM).glob("*.json"), out / ITEM / "transcript.html"]:
        text = path.read_text()
        assert str(standins) not in text and "snapshots/" not in text and "models--" not in text, path
    plan = _pipeline(*args, "--dry-run", env=env)
    assert re.search(rf"^asr \[{re.escape(DISTIL)}\]: 1 to reuse, 0 to redo$", plan.stdout, re.M), plan.stdout


def test_the_aligner_made_available_redoes_the_alignment_and_not_asr(done, standins):
    """The English aligner where a run with the hub would have put it (torch hub's checkpoints): the plan
    and the rerun redo the alignment and what follows it, never ASR, and the alignment runs it offline."""
    out, args, env = done
    env = {**env, "TORCH_HOME": str(standins / "torch")}
    asr_written = (out / ITEM / "asr.json").stat().st_mtime_ns
    plan = _pipeline(*args, "--dry-run", env=env).stdout
    assert f"alignment: 1 to redo: model whisper-cross-attention -> wav2vec2:{EN_ALIGNER_BUNDLE}" in plan, (
        plan
    )
    assert re.search(rf"^asr \[{re.escape(DISTIL)}\]: 1 to reuse, 0 to redo$", plan, re.M), plan
    rerun = _pipeline(*args, env=env)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    report = json.loads((out / layout.REPORT).read_text())
    # the decoded audio is scratch (not kept): decoded again for the aligner
    assert [s["stage"] for s in report["stages"] if s["attempts"]] == ["audio", "alignment", "embeddings"]
    assert (out / ITEM / "asr.json").stat().st_mtime_ns == asr_written, "ASR is not redone"
    transcript = load_artifact(out / ITEM / "transcript.json", TranscriptArtifact)
    assert (transcript.aligner, transcript.aligned, transcript.model) == (EN_ALIGNER_BUNDLE, True, DISTIL)
    assert transcript.segments and all(
        w.start is not None for s in transcript.segments for w in s.words or []
    )
    plan = _pipeline(*args, "--dry-run", env=env).stdout
    assert "1 complete, 0 with work to do" in plan, plan
