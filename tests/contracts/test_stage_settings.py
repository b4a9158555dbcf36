"""No drift between what the parent sends a stage and what the stage reads.

For every stage of the registry: the builder sets every field of the stage's
settings model explicitly, and the stage's module reads every field and no name
that is not one (an AST scan of ``self.settings.<name>`` / ``settings.<name>``
reads). Adding a setting nobody reads, or reading one nobody sends, fails here.
"""

from __future__ import annotations

import ast
import inspect
from importlib import import_module

import pytest

from contracts import StageRequest, WorkItem
from contracts.errors import ArtifactError
from orchestrator.registry import BY_NAME
from orchestrator.settings import Settings


def _reads(module_name: str) -> set[str]:
    """Attribute names read from ``self.settings`` or a local ``settings`` in the module."""
    tree = ast.parse(inspect.getsource(import_module(module_name)))
    names = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        base = node.value
        if isinstance(base, ast.Name) and base.id == "settings":
            names.add(node.attr)
        elif (
            isinstance(base, ast.Attribute)
            and base.attr == "settings"
            and isinstance(base.value, ast.Name)
            and base.value.id == "self"
        ):
            names.add(node.attr)
    return names - {"model_dump", "model_fields"}


@pytest.mark.parametrize("name", list(BY_NAME))
def test_the_parent_sends_every_field_and_the_child_reads_every_field(name):
    definition = BY_NAME[name]
    built = definition.build(Settings())
    fields = set(definition.settings_model.model_fields)
    # Given the builder's output for default settings: every field was set explicitly
    assert built.model_fields_set == fields
    # Then the stage's code reads exactly those fields (speaker_encoder.load_configured reads the encoder's)
    reads = _reads(definition.module)
    if name in ("enrollment", "voice_profile"):
        reads |= _reads("stages.voices.encoders")
    assert reads == fields, (
        f"{name}: sent but never read {fields - reads}; read but never sent {reads - fields}"
    )


def test_no_stage_reads_settings_through_an_untyped_lookup():
    for definition in BY_NAME.values():
        source = inspect.getsource(import_module(definition.module))
        assert "request.setting(" not in source and "settings.get(" not in source, definition.module


def test_a_child_refuses_settings_its_model_does_not_know(tmp_path):
    stage = import_module("stages.audio").STAGE
    request = StageRequest(
        request_id="r",
        stage="audio",
        module="stages.audio",
        batch_size=1,
        items=[WorkItem(id="a", inputs={"source": "x"}, output=str(tmp_path / "a.json"), fingerprint="f")],
        result_path=str(tmp_path / "r.json"),
        settings={"model": "large-v3"},
    )
    with pytest.raises(ArtifactError, match="invalid stage settings"):
        stage.read_settings(request)
