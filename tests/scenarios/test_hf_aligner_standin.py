"""whisperX's Hugging Face wav2vec2 aligner cached as a download leaves it, run offline by the alignment stage.

The stand-in of ``jonatasgrosman/wav2vec2-large-xlsr-53-portuguese`` (whisperX's default aligner for
Portuguese; ``tests.fixtures.hub_audio_standins.build_hf_aligner``: wav2vec2-large-xlsr-53's configuration,
2 of its 24 layers, random weights) lies in a temporary Hugging Face cache; whisperX's ``load_align_model``
loads it by name with the hub closed (``HF_HUB_OFFLINE=1``), as it would load the real one. The Spanish clip
is transcribed as Portuguese by the embedded multilingual Whisper base (``ASR_LANGUAGE=pt``): what is checked
is which aligner ran, how the transcript names it (repository and revision, as the plan names it) and that
a rerun redoes nothing, not the quality of its times (random weights). Random weights score each character
about 1/45, so the run drops the aligned segment as improbable; the words it timed are checked by the same
stage in a child of the test's, without that rule.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from contracts import TranscriptArtifact, load_artifact
from orchestrator import layout
from tests.conftest import MEDIA, ROOT, pipeline
from tests.fixtures.hub_audio_standins import (
    HF_ALIGNER_FILES,
    PT_ALIGNER_LANGUAGE,
    PT_ALIGNER_REPO,
    PT_ALIGNER_REVISION,
    PT_CHARACTERS,
    build_hf_aligner,
)

pytestmark = pytest.mark.slow

CLIP = MEDIA / "languages" / "es.ogg"
CLIP_S = 5.67
ALIGNER = f"{PT_ALIGNER_REPO}@{PT_ALIGNER_REVISION}"
#: the alignment stage in a child of its own (the cache is read from HF_HOME as the child imports the hub
#: client) over the run's ASR transcript, the non-speech rule left out: the words the stand-in timed
ALIGN_ONLY = """
import json, sys
from pathlib import Path
import stages.alignment as alignment
from contracts import StageRequest, TranscriptArtifact, WorkItem, load_artifact
from stages.audio import AudioStage
from tests.conftest import stage_settings

source, asr, tmp = sys.argv[1], sys.argv[2], Path(sys.argv[3])
AudioStage().run(StageRequest(
    request_id="a", stage="audio", module="stages.audio", batch_size=1, device="cpu",
    result_path=str(tmp / "a.json"), settings=stage_settings("audio"),
    items=[WorkItem(id="x", inputs={"source": source}, output=str(tmp / "audio.json"), fingerprint="fp")],
))
alignment.drop_non_speech = lambda segments, speech: (segments, 0)
item = WorkItem(id="x", inputs={"audio": str(tmp / "audio.json"), "asr": asr},
                output=str(tmp / "transcript.json"), fingerprint="fp")
result = alignment.AlignmentStage().run(StageRequest(
    request_id="r", stage="alignment", module="stages.alignment", batch_size=1, device="cpu",
    settings=stage_settings("alignment", align=True, speakers=False), items=[item],
    result_path=str(tmp / "r.json"),
))
assert result.items[0].ok, result.items
print(load_artifact(tmp / "transcript.json", TranscriptArtifact).model_dump_json())
"""


@pytest.fixture(scope="module")
def hf_home(tmp_path_factory):
    home = tmp_path_factory.mktemp("hf-aligner")
    build_hf_aligner(home)
    return home


@pytest.fixture(scope="module")
def done(hf_home, tmp_path_factory):
    """One run of the clip, Portuguese forced, the stand-in the only aligner on disk, the hub closed."""
    base = tmp_path_factory.mktemp("hf-aligner-run")
    env = {
        **os.environ,
        "ASR_MODEL": "whisper-base",
        "ASR_LANGUAGE": PT_ALIGNER_LANGUAGE,
        "EMBEDDING_PROFILE": "embedded",
        "PIPELINE_FORMATS": "txt",
        "HF_HOME": str(hf_home),
        "HF_HUB_OFFLINE": "1",
        "TORCH_HOME": str(base / "torch"),
    }
    args = ["process", str(CLIP), "--output", str(base / "out"), "--no-speakers", "--offline"]
    first = pipeline(*args, env=env, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    return base / "out", args, env, first


def test_the_stand_in_has_xlsr_53s_shapes_and_the_languages_vocabulary(hf_home):
    from transformers import Wav2Vec2Config

    folder = hf_home / "hub" / f"models--{PT_ALIGNER_REPO.replace('/', '--')}"
    assert (folder / "refs" / "main").read_text() == PT_ALIGNER_REVISION
    snapshot = folder / "snapshots" / PT_ALIGNER_REVISION
    assert sorted(p.name for p in snapshot.iterdir()) == sorted(HF_ALIGNER_FILES)
    config = Wav2Vec2Config.from_pretrained(snapshot)
    assert (config.hidden_size, config.num_attention_heads, config.intermediate_size) == (1024, 16, 4096)
    assert (config.feat_extract_norm, config.do_stable_layer_norm, config.conv_bias) == ("layer", True, True)
    assert config.num_hidden_layers == 2, "cut from 24 for test speed"
    vocab = json.loads((snapshot / "vocab.json").read_text())
    assert config.vocab_size == len(vocab) and vocab["<pad>"] == config.pad_token_id == 0
    assert set(PT_CHARACTERS) <= set(vocab) and {"ã", "ç", "õ"} <= set(vocab)


def test_the_cached_hf_aligner_aligns_offline_named_by_repository_and_revision(done):
    out, args, env, first = done
    item = out / CLIP.stem
    transcript = load_artifact(item / "transcript.json", TranscriptArtifact)
    assert transcript.language == PT_ALIGNER_LANGUAGE
    assert (transcript.aligned, transcript.aligner, transcript.alignment_note) == (True, ALIGNER, None), (
        "the stand-in aligned, not Whisper's cross-attention"
    )
    # random weights score each character ~1/45: the stage finds the aligned segment improbable and drops it
    assert transcript.dropped_segments == 1 and transcript.segments == [], transcript.segments
    report = json.loads((out / layout.REPORT).read_text())
    assert not [n for n in report["substitutions"] if "align" in n], report["substitutions"]
    assert not [n for n in first.stderr.splitlines() if n.startswith("NOTE") and "align" in n], first.stderr
    for path in [out / layout.REPORT, *item.glob("*.json")]:
        text = path.read_text()
        assert "snapshots/" not in text and "models--" not in text, path
    plan = pipeline(*args, "--dry-run", env=env).stdout
    assert "1 complete, 0 with work to do" in plan, plan
    written = (item / "transcript.json").stat().st_mtime_ns
    rerun = pipeline(*args, env=env, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    report = json.loads((out / layout.REPORT).read_text())
    assert [s["stage"] for s in report["stages"] if s["attempts"]] == [], "a rerun redoes nothing"
    assert (item / "transcript.json").stat().st_mtime_ns == written


def test_the_stand_in_times_every_word_within_the_audio(done, hf_home, tmp_path):
    """The words the alignment stage timed with the stand-in, before the non-speech rule (which drops the
    random weights' improbable segment in a run): every word of the ASR transcript, inside the clip."""
    out, _, env, _ = done
    asr = load_artifact(out / CLIP.stem / "asr.json", TranscriptArtifact)
    child = subprocess.run(
        [sys.executable, "-c", ALIGN_ONLY, str(CLIP), str(out / CLIP.stem / "asr.json"), str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**env, "PYTHONPATH": str(ROOT)},
    )
    assert child.returncode == 0, child.stderr[-3000:]
    aligned = TranscriptArtifact.model_validate_json(child.stdout.strip().splitlines()[-1])
    assert (aligned.aligned, aligned.aligner, aligned.alignment_note) == (True, ALIGNER, None)
    words = [w for s in aligned.segments for w in s.words or []]
    assert [w.word for w in words] == [w.word for s in asr.segments for w in s.words or []], words
    assert all(
        w.start is not None and w.end is not None and 0.0 <= w.start <= w.end <= CLIP_S + 0.02 for w in words
    ), words


def test_a_new_revision_of_the_aligner_redoes_the_alignment_and_not_asr(done, hf_home, tmp_path):
    """The cache's ``main`` moved to another revision (a download of a newer one): the plan names both, and
    redoes the alignment (and what follows it), never ASR."""
    out, args, env, _ = done
    home = tmp_path / "hf"
    shutil.copytree(hf_home, home, symlinks=True)
    folder = home / "hub" / f"models--{PT_ALIGNER_REPO.replace('/', '--')}"
    newer = "b2200000000000000000000000000000000000f7"
    (folder / "snapshots" / PT_ALIGNER_REVISION).rename(folder / "snapshots" / newer)
    (folder / "refs" / "main").write_text(newer)
    plan = pipeline(*args, "--dry-run", env={**env, "HF_HOME": str(home)}).stdout
    assert f"alignment: 1 to redo: model wav2vec2:{ALIGNER} -> wav2vec2:{PT_ALIGNER_REPO}@{newer}" in plan, (
        plan
    )
    assert re.search(r"^asr \[[^\]]+\]: 1 to reuse, 0 to redo$", plan, re.M), plan
