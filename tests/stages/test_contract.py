"""Every stage module exposes the same entry and declares its artifact types."""

from __future__ import annotations

import inspect
from importlib import import_module

import pytest

from contracts import Artifact, AudioArtifact, EmbeddingsArtifact, StageRequest, StageResult, TranscriptArtifact
from orchestrator import Orchestrator, Settings
from stages.base import Stage

STAGE_MODULES = {"audio": "stages.audio", "asr": "stages.asr", "embeddings": "stages.embeddings"}


@pytest.mark.parametrize(("name", "module"), STAGE_MODULES.items())
def test_stage_module_exposes_one_stage_with_declared_types(name, module):
    stage = import_module(module).STAGE
    assert isinstance(stage, Stage) and stage.name == name
    assert issubclass(stage.output, Artifact)
    assert stage.input is None or issubclass(stage.input, Artifact)
    signature = inspect.signature(type(stage).run)
    assert list(signature.parameters) == ["self", "request", "on_item"]
    assert type(stage).run is Stage.run, "stages share the one item loop"
    annotations = inspect.get_annotations(Stage.run, eval_str=True)
    assert (annotations["request"], annotations["return"]) == (StageRequest, StageResult)


def test_pipeline_chains_outputs_to_inputs():
    specs = Orchestrator(Settings()).stage_specs()
    assert [s.name for s in specs] == list(STAGE_MODULES)
    stages = [import_module(s.module).STAGE for s in specs]
    assert [s.output for s in specs] == [st.output for st in stages] == [AudioArtifact, TranscriptArtifact, EmbeddingsArtifact]
    for upstream, spec, stage in zip(specs, specs[1:], stages[1:]):
        assert stage.input is upstream.output
        assert stage.input_key == upstream.kind
