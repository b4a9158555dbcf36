"""What each stage's artifact will be made from: its fingerprint, chained from the source's identity (or
its URL's) through the stages' inputs, with the model that runs (the alignment's aligner chosen by the
transcript's language); and whether an artifact on disk is the current one. Reads artifacts; starts no
child."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from json.encoder import encode_basestring_ascii

from contracts import Artifact, load_artifact
from contracts.errors import ArtifactError
from contracts.models import ALIGNER_BY_LANGUAGE
from orchestrator.planning.state import InputState
from orchestrator.planning.vocabulary import identity as vocabulary_identity
from orchestrator.registry import StageSpec
from orchestrator.remote import url_identity

log = logging.getLogger(__name__)


def fingerprint(spec: StageSpec, upstream: str, model: str | None = None) -> str:
    """Identity of an artifact-to-be: what determines it and nothing else. The stage and its code version,
    the settings that change results (not hub reachability, cache or weights paths), the model that runs
    (``model``, else the one the run resolved for the stage) and its input's identity.

    The hashed text is ``json.dumps`` of those six keys (sorted); what comes from ``spec`` alone is made
    once per spec (:func:`_spec_json`): a corpus of 100,000 inputs chains 400,000 of these."""
    module, settings, stage, version = _spec_json(spec)
    model = model or spec.model
    blob = (  # json.dumps of a str is encode_basestring_ascii's
        f'{{"model": {"null" if model is None else encode_basestring_ascii(model)}, "module": {module}, '
        f'"settings": {settings}, "stage": {stage}, "upstream": {encode_basestring_ascii(upstream)}, '
        f'"version": {version}}}'
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


#: id(spec) -> (the spec, its JSON parts): specs and their settings are frozen, the spec is kept so its
#: id is not reused
_SPEC_JSON: dict[int, tuple[StageSpec, tuple[str, str, str, str]]] = {}


def _spec_json(spec: StageSpec) -> tuple[str, str, str, str]:
    """The JSON (sorted keys) of ``spec``'s module, settings identity, name and version."""
    cached = _SPEC_JSON.get(id(spec))
    if cached is not None and cached[0] is spec:
        return cached[1]
    parts = (
        json.dumps(spec.module),
        json.dumps(spec.settings.identity(), sort_keys=True),
        json.dumps(spec.name),
        json.dumps(spec.version),
    )
    if len(_SPEC_JSON) > 256:
        _SPEC_JSON.clear()
    _SPEC_JSON[id(spec)] = (spec, parts)
    return parts


def artifact_state(
    path: str, item_id: str, expected: str, output: type[Artifact], quiet: bool = False
) -> tuple[Artifact | None, str]:
    """The artifact at ``path`` for input ``item_id``, made with fingerprint ``expected``: (the artifact or
    None, its state: "current", "missing", "unreadable: ...", "stale")."""
    if not os.path.exists(path):  # not pathlib: a resume checks every artifact of a corpus
        return None, "missing"
    try:
        artifact = load_artifact(path, output)
    except ArtifactError as exc:
        if not quiet:
            log.warning("redoing %s: %s", item_id, exc)
        return None, f"unreadable ({exc.reason})"
    if artifact.fingerprint != expected or artifact.item_id != item_id:
        if not quiet:
            log.info("redoing %s: %s is stale (inputs or settings changed)", item_id, os.path.basename(path))
        return artifact, "stale"
    return artifact, "current"


def _source_identity(inp: InputState) -> str:
    """The local source's path, size and modification time; what was seen is kept for the first stage."""
    source = str(inp.source)  # as text: a corpus plans 100,000 of these
    try:
        st = os.stat(source)
    except OSError:
        inp.planned = None
        return f"unreadable:{inp.source.absolute()}"
    inp.planned = (st.st_size, st.st_mtime_ns)
    # a name that is not UTF-8 is read through our link in the output directory: the identity is the
    # file it points at, so it does not depend on where the outputs go
    path = (
        os.fsencode(os.path.realpath(inp.source)).decode("utf-8", "backslashreplace")
        if inp.shown_source
        else _absolute(source)
    )
    return f"{path}:{st.st_size}:{st.st_mtime_ns}"


def _absolute(path: str) -> str:
    """``str(Path(path).absolute())`` for the text of a ``Path``, without making one."""
    if os.path.isabs(path):
        return path
    return os.getcwd() if path == "." else os.path.join(os.getcwd(), path)


def input_keys(spec: StageSpec, previous: StageSpec | None) -> tuple[str, ...]:
    """The artifacts (by key) ``spec`` reads; the first stage reads the source."""
    if previous is None:
        return ()
    return spec.inputs if spec.inputs is not None else (previous.kind,)


def chain_fingerprints(inp: InputState, specs: list[StageSpec], start: int = 0) -> None:
    """Each stage's expected fingerprint from its inputs' (a skipped input counts as "skipped"), into the
    input's run state. From stage ``start`` on: the ones before it are taken as already chained (the
    alignment's aligner changed: its fingerprint and those after it change, not the source's)."""
    by_key: dict[str, str] = {spec.kind: inp.fingerprints[spec.name] for spec in specs[:start]}
    for index in range(start, len(specs)):
        spec = specs[index]
        keys = input_keys(spec, specs[index - 1] if index else None)
        if not keys:
            upstream = url_identity(inp.url) if inp.url else _source_identity(inp)
        else:
            upstream = "|".join(f"skipped:{k}" if k in inp.skipped else by_key[k] for k in keys)
        # the input's vocabulary files (its own, not the run's), when they hold terms
        if spec.vocabulary and any(f.terms for f in inp.plan.vocabulary):
            upstream += f"|vocabulary:{vocabulary_identity(inp.plan.vocabulary)}"
        by_key[spec.kind] = inp.fingerprints[spec.name] = fingerprint(
            spec, upstream, inp.models.get(spec.name)
        )


def plan_aligner(
    inp: InputState, specs: list[StageSpec], language: str | None, ran: str | None = None
) -> bool:
    """The alignment stage's model for ``inp``: the aligner that ran (``ran``, when an artifact names one),
    else the one it will run for ``language`` (``orchestrator.models.choice.aligner_for``); the fingerprints
    chained again. False where the stage chooses no aligner per language (alignment off, not run)."""
    from orchestrator.models.choice import aligner_for

    index = next((i for i, s in enumerate(specs) if s.name == "alignment"), None)
    if index is None or specs[index].model != ALIGNER_BY_LANGUAGE:
        return False
    spec = specs[index]
    inp.text_language = language
    model = ran or aligner_for(language, bool(getattr(spec.settings, "allow_hub", False)))
    if inp.models.get(spec.name) != model:
        inp.models[spec.name] = model
        # the stages before the alignment keep their fingerprints (chained already, or chained now)
        chain_fingerprints(inp, specs, index if all(s.name in inp.fingerprints for s in specs[:index]) else 0)
    return True
