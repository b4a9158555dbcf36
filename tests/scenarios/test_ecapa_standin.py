"""The production speaker encoder (SpeechBrain ECAPA, ``speechbrain/spkrec-ecapa-voxceleb``) cached as a
download leaves it, run offline by ``pipeline enroll`` and ``pipeline process --profiles``.

The stand-in (``tests.fixtures.hub_audio_standins.build_ecapa``) is the repository's hyperparams.yaml with
random weights, in the Hugging Face cache; SpeechBrain's ``EncoderClassifier.from_hparams`` loads it by name
with the hub closed (``HF_HUB_OFFLINE=1``), as it would load the real one. Random weights name no one
reliably: what is checked is which encoder ran and how the profile, the transcript and the report name it.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from contracts import TranscriptArtifact, load_artifact
from orchestrator import layout
from tests.conftest import MEDIA, ROOT
from tests.fixtures.hub_audio_standins import ECAPA_REPO, ECAPA_REVISION, build_ecapa, standins_root

pytestmark = pytest.mark.slow

ECAPA = f"ecapa:{ECAPA_REPO}@{ECAPA_REVISION}"
SPEAKERS = MEDIA / "speakers"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    hf_home = standins_root() / "hf"
    build_ecapa(hf_home)
    tmp = tmp_path_factory.mktemp("ecapa")
    env = {
        **os.environ,
        "HF_HOME": str(hf_home),
        "HF_HUB_OFFLINE": "1",
        "PIPELINE_ALLOW_HUB": "false",  # (enroll has no --offline)
        "SPEAKER_ENCODER": "ecapa",
        "ASR_MODEL": "embedded",
        "DIARIZATION_MODEL": "embedded",
        "EMBEDDING_PROFILE": "embedded",
        "PIPELINE_FORMATS": "txt,html",  # random voices name speakers at random: no captions worth checking
        "TORCH_HOME": str(tmp / "torch"),
    }

    def pipeline(*args: str) -> subprocess.CompletedProcess:
        done = subprocess.run(
            [str(ROOT / "bin" / "pipeline"), *args], capture_output=True, text=True, timeout=600, env=env
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return done

    profiles, out = tmp / "profiles", tmp / "out"
    pipeline("enroll", "Host", str(SPEAKERS / "host_enroll_1.wav"), "--profiles", str(profiles))
    pipeline(
        "process",
        str(SPEAKERS / "host_guest.mp4"),
        "--profiles",
        str(profiles),
        "--output",
        str(out),
        "--speakers",
        "--offline",
    )
    return profiles, out


def test_enroll_embeds_with_the_cached_ecapa_named_by_revision(run):
    profiles, _ = run
    profile = json.loads((profiles / "Host.json").read_text())
    assert (profile["encoder"], profile["encoder_model"], profile["dimension"]) == ("ecapa", ECAPA, 192)
    assert len(profile["embedding"]) == 192


def test_process_matches_speakers_with_the_cached_ecapa(run):
    _, out = run
    report = json.loads((out / layout.REPORT).read_text())
    assert report["substitutions"] == [], report["substitutions"]
    assert [i["status"] for i in report["inputs"]] == ["ok"]
    transcript = load_artifact(out / "host_guest" / "transcript.json", TranscriptArtifact)
    assert transcript.speaker_encoder == ECAPA
    for path in [out / layout.REPORT, *(out / "host_guest").glob("*.json")]:
        text = path.read_text()
        assert str(standins_root()) not in text and "models--" not in text, path
