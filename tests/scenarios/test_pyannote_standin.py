"""The production diarization pipeline (``pyannote/speaker-diarization-community-1``) cached as a download leaves
it, run offline by ``pipeline process`` with ``DIARIZATION_MODEL=auto``.

The stand-in (``tests.fixtures.pyannote_standin``) is the repository's config.yaml with the real segmentation
model, a random WeSpeaker ResNet34 and a random PLDA, in the Hugging Face cache; whisperx's
``DiarizationPipeline`` (pyannote.audio's ``Pipeline.from_pretrained``) loads it by name with the hub closed
(``HF_HUB_OFFLINE=1``), as it would load the real one. Random embeddings cluster at random: what is checked is
which pipeline ran, how the artifact, the report and the plan name it, that its turns lie within the audio, and
that a rerun redoes nothing.
"""

from __future__ import annotations

import json
import os
import re

import pytest
import yaml

from contracts import DiarizationArtifact, load_artifact
from orchestrator import layout
from tests.conftest import MEDIA, pipeline
from tests.fixtures.pyannote_standin import (
    COMMUNITY_FILES,
    COMMUNITY_REPO,
    COMMUNITY_REVISION,
    EMBEDDING_STATE_SIZE,
    build_pyannote_community,
    standin_root,
)

pytestmark = pytest.mark.slow

COMMUNITY = f"{COMMUNITY_REPO}@{COMMUNITY_REVISION}"
CLIP = MEDIA / "speech.wav"
ITEM = "speech"


@pytest.fixture(scope="module")
def hf_home():
    root = standin_root() / "hf"
    build_pyannote_community(root)
    return root


@pytest.fixture(scope="module")
def done(hf_home, tmp_path_factory):
    """One run: the pipeline from the cache, the hub closed, no HF_TOKEN, the embedded ASR and text embedder."""
    out = tmp_path_factory.mktemp("community") / "out"
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")},
        "HF_HOME": str(hf_home),
        "HF_HUB_OFFLINE": "1",
        "PIPELINE_ALLOW_HUB": "false",
        "DIARIZATION_MODEL": "auto",
        "ASR_MODEL": "embedded",
        "EMBEDDING_PROFILE": "embedded",
        "PIPELINE_FORMATS": "txt,html",  # random voices split the speech at random: no captions worth checking
    }
    args = ("process", str(CLIP), "--output", str(out), "--speakers", "--offline")
    first = pipeline(*args, env=env, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    return out, args, env, first


def test_the_stand_in_is_laid_out_as_the_cache_holds_the_repository(hf_home):
    import numpy as np
    from pyannote.audio import Model
    from pyannote.audio.core.plda import PLDA

    from stages.runtime.weights import weight_path

    repo = hf_home / "hub" / f"models--{COMMUNITY_REPO.replace('/', '--')}"
    assert (repo / "refs" / "main").read_text() == COMMUNITY_REVISION
    snapshot = repo / "snapshots" / COMMUNITY_REVISION
    files = sorted(str(p.relative_to(snapshot)) for p in snapshot.rglob("*") if not p.is_dir())
    assert files == sorted(COMMUNITY_FILES)
    assert all(
        (snapshot / f).is_symlink() and (snapshot / f).resolve().parent == repo / "blobs" for f in files
    )
    config = yaml.safe_load((snapshot / "config.yaml").read_text())
    assert config["pipeline"]["name"] == "pyannote.audio.pipelines.SpeakerDiarization"
    params = config["pipeline"]["params"]
    assert (params["segmentation"], params["embedding"], params["plda"], params["clustering"]) == (
        "$model/segmentation",
        "$model/embedding",
        "$model/plda",
        "VBxClustering",
    )
    assert config["params"]["clustering"] == {"threshold": 0.6, "Fa": 0.07, "Fb": 0.8}
    # the real segmentation-3.0 checkpoint, as it is
    assert (snapshot / "segmentation" / "pytorch_model.bin").read_bytes() == weight_path(
        "segmentation"
    ).read_bytes()
    embedding = Model.from_pretrained(str(snapshot), subfolder="embedding")
    assert type(embedding).__name__ == "WeSpeakerResNet34" and embedding.dimension == 256
    assert sum(v.numel() for v in embedding.state_dict().values()) == EMBEDDING_STATE_SIZE
    transform, plda = (
        np.load(snapshot / "plda" / "xvec_transform.npz"),
        np.load(snapshot / "plda" / "plda.npz"),
    )
    assert {k: transform[k].shape for k in transform.files} == {
        "mean1": (256,),
        "mean2": (128,),
        "lda": (256, 128),
    }
    assert {k: plda[k].shape for k in plda.files} == {"mu": (128,), "tr": (128, 128), "psi": (128,)}
    loaded = PLDA.from_pretrained(str(snapshot), subfolder="plda")
    assert (loaded.phi > 0).all() and loaded(np.ones((2, 256))).shape == (2, 128)


def test_the_cached_pipeline_runs_offline_named_by_repository_and_revision(done):
    out, _, _, first = done
    diarization = load_artifact(out / ITEM / "diarization.json", DiarizationArtifact)
    assert (diarization.model, diarization.requested_model) == (f"pyannote:{COMMUNITY}", "auto")
    assert diarization.fallback_reason is None
    assert diarization.voice_encoder == f"pyannote:{COMMUNITY}"
    assert diarization.voices and all(len(v) == 256 for v in diarization.voices.values())
    assert diarization.turns, "the pipeline found no speech"
    # pyannote's last window runs past the audio's end: the turns are cut where the audio ends (to the ms)
    end = round(diarization.duration_s, 3)
    assert all(0 <= t.start < t.end <= end for t in diarization.turns), (diarization.turns, end)
    report = json.loads((out / layout.REPORT).read_text())
    assert report["substitutions"] == [], report["substitutions"]
    assert [i["status"] for i in report["inputs"]] == ["ok"]
    attempts = [a for s in report["stages"] if s["stage"] == "diarization" for a in s["attempts"]]
    assert [a["model"] for a in attempts] == [f"pyannote:{COMMUNITY}"]
    assert not [line for line in first.stderr.splitlines() if line.startswith("NOTE")], first.stderr[-3000:]
    for path in [out / layout.REPORT, *(out / ITEM).glob("*.json")]:
        text = path.read_text()
        assert str(standin_root()) not in text and "snapshots/" not in text and "models--" not in text, path


def test_a_rerun_redoes_nothing(done):
    out, args, env, _ = done
    plan = pipeline(*args, "--dry-run", env=env)
    assert plan.returncode == 0, plan.stderr[-3000:]
    assert re.search(
        rf"^diarization \[{re.escape(COMMUNITY)}\]: 1 to reuse, 0 to redo$", plan.stdout, re.M
    ), plan.stdout
    assert "1 complete, 0 with work to do" in plan.stdout, plan.stdout
    written = (out / ITEM / "diarization.json").stat().st_mtime_ns
    rerun = pipeline(*args, env=env, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    report = json.loads((out / layout.REPORT).read_text())
    assert [s["stage"] for s in report["stages"] if s["attempts"]] == [], report["stages"]
    assert (out / ITEM / "diarization.json").stat().st_mtime_ns == written
