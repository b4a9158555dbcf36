"""A warm child imports its stage's libraries before its request comes (``Stage.import_libraries``), while
the previous stage still runs; only what it does after the request shows in a run's time. So loading a
stage's model must import no heavy library that ``import_libraries`` left out (the embedded
diarizer's child spent 3.7 s importing pyannote.audio in ``load``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

#: libraries that take a second or more to import here
HEAVY = (
    "torch",
    "torchaudio",
    "pyannote",
    "whisperx",
    "faster_whisper",
    "ctranslate2",
    "speechbrain",
    "transformers",
    "sentence_transformers",
    "scipy",
    "sklearn",
    "pandas",
    "lightning",
    "pytorch_lightning",
    "nltk",
    "onnxruntime",
)

#: a fresh process per stage, as a warm child is: an earlier stage's imports would hide a later one's
PROBE = r"""
import json, sys
from importlib import import_module
from contracts import StageRequest, WorkItem
from orchestrator import Orchestrator, Settings

name, heavy, out = sys.argv[1], set(sys.argv[2].split(",")), sys.argv[3]
spec = {s.name: s for s in Orchestrator(Settings(output_dir=out, embedding_profile="embedded")).stage_specs()}[name]
stage = import_module(spec.module).STAGE
stage.import_libraries()
before = set(sys.modules)
request = StageRequest(request_id=name, stage=name, module=spec.module, batch_size=spec.batch_size,
                       items=[WorkItem(id="x", inputs={}, output=out + "/x.json", fingerprint="x")],
                       device="cpu", settings=spec.settings.model_dump(mode="json"), result_path=out + "/r.json")
stage.settings = stage.read_settings(request)
stage.batch_size, stage.device = request.batch_size, "cpu"
model = stage.load(request, "cpu")
# a library first imported by load (a lazy submodule of one imported ahead, e.g. the BERT modelling code of
# transformers, is cheap and allowed)
late = {n.split(".")[0] for n in set(sys.modules) - before} & heavy - before
print(json.dumps({"model": model, "late": sorted(late - before)}))
"""


@pytest.mark.parametrize("stage", ["asr", "diarization", "embeddings"])  # alignment loads no model offline
def test_loading_a_model_imports_nothing_heavy_that_the_warm_start_left_out(tmp_path, stage):
    done = subprocess.run(
        [sys.executable, "-c", PROBE, stage, ",".join(HEAVY), str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    probe = json.loads(done.stdout.splitlines()[-1])
    assert probe["model"], probe  # the stage did load its model
    assert probe["late"] == [], f"{stage}: load() imported {probe['late']}: import them in import_libraries"
