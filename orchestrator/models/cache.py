"""Models for an air-gapped machine: what the settings need (``pipeline models list``), fetching it into the
Hugging Face cache on a connected machine (``pull``), and checking the cache's files (``verify``).

Called in the parent process: only the hub client (``huggingface_hub``), never a model library. What
``list`` says runs is what ``process`` plans: the same resolution (``orchestrator.models.choice``).
"""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

from contracts.models import (
    ALIGNER_BY_LANGUAGE,
    HF_ALIGNERS,
    PYANNOTE_DEFAULT,
    TORCHAUDIO_ALIGNERS,
    WORD_TIMING,
)
from contracts.snapshots import STAGE_KINDS, kind_of, missing_files
from orchestrator.gpu.sizing import resolve_auto
from orchestrator.models.choice import (
    TORCHAUDIO_SERVER,
    aligner_for,
    cached_revision,
    loadable_revision,
    repo_folder,
    resolve_models,
    snapshot_missing,
    torch_hub_home,
    wanted_model,
)
from orchestrator.registry import BY_NAME, VOICE_PROFILE, StageSpec, process_specs
from orchestrator.settings import Settings

log = logging.getLogger(__name__)

#: the files faster-whisper's ``download_model`` fetches of a CTranslate2 Whisper repository, and those the
#: torch runtime loads of a transformers one (weights in safetensors, the tokenizer, generation settings)
ASR_FILES = ["config.json", "preprocessor_config.json", "model.bin", "tokenizer.json", "vocabulary.*"] + [
    "model.safetensors",
    "model-*.safetensors",
    "model.safetensors.index.json",
    "generation_config.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "normalizer.json",
    "vocab.json",
    "merges.txt",
]
#: other frameworks' copies of the weights, which no stage loads (sentence-transformers, transformers)
OTHER_FORMATS = ["*.onnx", "onnx/*", "openvino/*", "*.h5", "*.msgpack", "*.ot", "flax_model*", "tf_model*"]
#: licence or gate of the models the settings name by default (the hub's own answer wins when it gives one)
KNOWN_TERMS: dict[str, str] = {
    PYANNOTE_DEFAULT: "cc-by-4.0, gated: accept its conditions on hf.co, then HF_TOKEN",
    "BAAI/bge-small-en-v1.5": "mit",
    "Alibaba-NLP/gte-Qwen2-1.5B-instruct": "apache-2.0",
    "speechbrain/spkrec-ecapa-voxceleb": "apache-2.0",
    "Systran/faster-whisper-large-v3": "mit",
    "Systran/faster-distil-whisper-large-v3": "mit",
    "Systran/faster-whisper-medium": "mit",
    "Systran/faster-whisper-small": "mit",
    "Systran/faster-whisper-base": "mit",
}
_HEX = re.compile(r"^[0-9a-f]{40}$|^[0-9a-f]{64}$")


class PullError(Exception):
    """A model could not be fetched; the message is one line that says what to do."""


@dataclass
class ModelRow:
    """One model a stage of the settings can load, and what would run now."""

    stage: str
    #: the hub repository (or local folder, or embedded model) the settings ask for
    repo: str
    #: the revision asked for (the settings pin none: the hub's ``main``; None: not a hub model)
    revision: str | None = "main"
    #: the revision ``main`` points at in the cache when its snapshot can load (None: not cached, or a file
    #: the stage loads is missing); "local" for a folder, "embedded" for a model that ships with the project,
    #: "torch hub" for a torchaudio aligner's checkpoint in ``$TORCH_HOME/hub/checkpoints``
    cached: str | None = None
    #: what ``process`` would run now, in the plan's words
    runs: str = ""
    #: why that is not the model asked for (None: it is)
    fallback_reason: str | None = None
    #: licence or gate, when known
    terms: str | None = None
    #: where the model comes from: "hub" (pulled, verified), "local" (a folder), "embedded", "torch"
    source: str = field(default="hub", repr=False)
    allow_patterns: list[str] | None = field(default=None, repr=False)
    ignore_patterns: list[str] | None = field(default=None, repr=False)

    @property
    def local(self) -> bool:
        return self.source == "local"

    @property
    def hub(self) -> bool:
        return self.source == "hub"

    @property
    def kind(self) -> str | None:
        """The kind of model its (first) stage loads (``contracts.snapshots``)."""
        return STAGE_KINDS.get(self.stage.split(", ", 1)[0])


def model_specs(settings: Settings) -> list[StageSpec]:
    """Every stage that can load a model under ``settings``, whichever command runs it: ``process``'s, the
    enrollment stage even before a voice profile exists (``process`` runs it once one does), and
    ``pipeline enroll``'s encoder (``voice_profile``)."""
    specs = process_specs(settings)
    names = {spec.name for spec in specs}
    if "diarization" in names and "enrollment" not in names:
        specs.append(BY_NAME["enrollment"].spec(settings))
    specs.append(VOICE_PROFILE.spec(settings))
    return specs


def model_rows(settings: Settings, hub_info=None) -> list[ModelRow]:
    """Each model the stages of ``settings`` can load (:func:`model_specs`), with what runs now
    (``settings.allow_hub`` must be resolved: ``orchestrator.models.hub.resolve_hub``): hub models, local
    folders, embedded models and the aligners per language. ``hub_info(repo)``: the hub's answer for a
    repository or the exception it raised (default: one ``model_info`` request each, only when the hub is
    allowed). Stages that load the same model share one row (``enrollment, voice_profile``)."""
    hub = bool(settings.hub)
    settings = resolve_auto(settings)
    specs = model_specs(settings)
    runs = resolve_models(specs, hub)
    if hub_info is None:
        hub_info = _hub_info
    rows: list[ModelRow] = []
    for spec in specs:
        wanted = wanted_model(spec)
        if spec.name == "alignment":
            rows += _aligner_rows(settings, hub, hub_info) if getattr(spec.settings, "align", False) else []
        elif wanted is not None:
            rows.append(_row(spec.name, wanted, runs.get(spec.name, ""), hub, hub_info))
        elif spec.name in runs:
            asked = getattr(spec.settings, "model", None) or getattr(spec.settings, "profile", None)
            asked = getattr(spec.settings, "encoder", None) or asked
            rows.append(_embedded(spec.name, str(asked), runs[spec.name]))
    merged: dict[tuple[str, str], ModelRow] = {}
    for row in rows:
        if (row.repo, row.runs) in merged:
            merged[row.repo, row.runs].stage += f", {row.stage}"
        else:
            merged[row.repo, row.runs] = row
    return list(merged.values())


def _embedded(stage: str, asked: str, runs: str) -> ModelRow:
    """A model that ships with the project (a wheel, or pinned weights): no hub, nothing to pull."""
    return ModelRow(stage=stage, repo=asked, revision=None, cached="embedded", runs=runs, source="embedded")


def _aligner_rows(settings: Settings, hub: bool, hub_info) -> list[ModelRow]:
    """The alignment stage's aligner for each language the settings name (none named: one row, the aligner
    chosen per detected language)."""
    languages = [settings.asr_language] if settings.asr_language else list(settings.asr_languages)
    if not languages:
        return [_embedded("alignment", ALIGNER_BY_LANGUAGE, ALIGNER_BY_LANGUAGE)]
    rows = []
    for language in languages:
        runs = aligner_for(language, hub)
        if language in HF_ALIGNERS:
            rows.append(_row("alignment", HF_ALIGNERS[language], runs, hub, hub_info))
        elif language in TORCHAUDIO_ALIGNERS:
            bundle, file = TORCHAUDIO_ALIGNERS[language]
            checkpoints = Path(torch_hub_home()) / "checkpoints"
            row = ModelRow(stage="alignment", repo=bundle, revision=None, runs=runs, source="torch")
            row.cached = "torch hub" if (checkpoints / file).is_file() else None
            if runs == WORD_TIMING:
                row.fallback_reason = (
                    f"not in {checkpoints}, and {TORCHAUDIO_SERVER} is off: not a hub model, "
                    "run once with that server reachable (or copy the file there)"
                )
            rows.append(row)
        else:
            rows.append(_embedded("alignment", WORD_TIMING, runs))
    return rows


def _row(stage: str, repo: str, runs: str, hub: bool, hub_info) -> ModelRow:
    row = ModelRow(stage=stage, repo=repo, runs=runs, terms=KNOWN_TERMS.get(repo))
    if stage == "asr":
        row.allow_patterns = ASR_FILES
    elif stage in ("embeddings", "alignment"):
        row.ignore_patterns = OTHER_FORMATS
    path = Path(repo).expanduser()
    if path.exists():
        row.cached, row.revision, row.source = "local", None, "local"
        return row
    if repo.count("/") != 1 or repo.startswith(("/", ".", "~")):
        row.revision, row.source = None, "local"
        row.fallback_reason = (
            f"no such folder on this machine ({path})"
            if repo.startswith(("/", ".", "~")) or repo.count("/") > 1
            else "neither a hub repository (org/name) nor a folder on this machine"
        )
        return row
    row.cached = loadable_revision(repo, row.kind)
    if _names(runs, repo):
        return row
    if missing := snapshot_missing(repo, row.kind):
        row.fallback_reason = (
            f"not cached: its snapshot {cached_revision(repo)} lacks {', '.join(missing)} "
            "(a pull cut off between files?): `models pull` again"
        )
        return row
    info = hub_info(repo) if hub else None
    if isinstance(info, Exception):
        row.fallback_reason = f"not cached, and {_hub_failure(info)}"
    elif info is not None:
        row.terms = _terms(info) or row.terms
        if getattr(info, "gated", False):
            row.fallback_reason = "not cached, and gated: accept its conditions on hf.co, then set HF_TOKEN"
        else:
            row.fallback_reason = "not cached"
    else:
        row.fallback_reason = "not cached, and the hub is off (allow_hub=false, or it did not answer)"
    return row


def _names(runs: str, repo: str) -> bool:
    """Whether the planned model ``runs`` is the repository ``repo`` (``org/name@rev``, ``wav2vec2:org/name``)."""
    return runs.removeprefix("wav2vec2:").split("@", 1)[0] == repo


def _hub_info(repo: str):
    from huggingface_hub import HfApi

    try:
        return HfApi().model_info(repo, timeout=10.0)
    except Exception as exc:  # noqa: BLE001 - any failure is reported on the model's row
        return exc


def _hub_failure(exc: Exception) -> str:
    """Why the hub did not give a repository's revision, in a few words."""
    from huggingface_hub.errors import OfflineModeIsEnabled, RepositoryNotFoundError

    if isinstance(exc, OfflineModeIsEnabled):
        return "HF_HUB_OFFLINE is set"
    if isinstance(exc, RepositoryNotFoundError):
        return "the hub does not have it"
    return f"the hub did not give it ({_short(exc)})"


def _terms(info) -> str | None:
    card = getattr(info, "card_data", None)
    licence = getattr(card, "license", None) if card is not None else None
    gated = getattr(info, "gated", False)
    parts = [str(licence)] if licence else []
    if gated:
        parts.append("gated: accept its conditions on hf.co, then HF_TOKEN")
    return ", ".join(parts) or None


def _short(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:160] or type(exc).__name__


# -- pull: on a machine that reaches the hub ----------------------------------------------------------


def pull(row: ModelRow) -> str:
    """Fetch ``row``'s repository (its files as the stage loads them) into the Hugging Face cache; resumes
    what an earlier pull left. Returns one line; raises :class:`PullError` with one line."""
    from huggingface_hub import HfApi, get_token, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
    )

    if row.repo.count("/") != 1:
        raise PullError(f"{row.repo}: neither a hub repository (org/name) nor a folder on this machine")
    token = get_token()  # HF_TOKEN, or a saved login
    try:
        info = HfApi().model_info(row.repo, revision=row.revision, token=token)
        if getattr(info, "gated", False) and not token:
            raise GatedRepoError(f"{row.repo} is gated")
        path = snapshot_download(
            row.repo,
            revision=row.revision,  # a branch: the cache's refs/main is written, which offline loads read
            allow_patterns=row.allow_patterns,
            ignore_patterns=row.ignore_patterns,
            token=token,
        )
    except (GatedRepoError, HfHubHTTPError) as exc:
        status = getattr(getattr(exc, "response", None), "status_code", None)
        if isinstance(exc, GatedRepoError) or status in (401, 403):
            raise PullError(
                f"{row.repo}: gated (HTTP {status or 401}): accept its conditions on "
                f"https://huggingface.co/{row.repo} with your account, then set HF_TOKEN to a token of it"
                + (" (the token given was refused)" if token else "")
            ) from None
        if isinstance(exc, RepositoryNotFoundError):
            raise PullError(f"{row.repo}: no such model on the hub (HTTP {status})") from None
        raise PullError(f"{row.repo}: the hub answered HTTP {status}: {_short(exc)}") from None
    except OfflineModeIsEnabled:
        raise PullError(f"{row.repo}: HF_HUB_OFFLINE is set: unset it to pull") from None
    except Exception as exc:  # noqa: BLE001 - a network failure (no route, refused, cut off): one line
        raise PullError(
            f"{row.repo}: not fetched ({type(exc).__name__}: {_short(exc)}); is the hub reachable "
            "(HF_ENDPOINT)? Rerun to resume"
        ) from None
    files = [p for p in Path(path).rglob("*") if p.is_file()]
    size = sum(p.stat().st_size for p in files)
    return f"{row.stage}: {row.repo}@{Path(path).name} ({len(files)} files, {size / 2**20:.1f} MiB)"


# -- verify: the cache's files against their blob names, and the files each loader opens ----------------


@dataclass
class Check:
    """One repository of the cache, checked."""

    repo: str
    revision: str | None
    files: int = 0
    #: "file: why" for each missing or corrupt file (empty: sound)
    problems: list[str] = field(default_factory=list)
    #: "file: why" for each file whose hash nothing in the cache records (a copy that dereferenced the
    #: cache's links: its name is not its hash); not "ok", not known bad
    unhashed: list[str] = field(default_factory=list)


def verify(repo: str, cache_dir: Path | None = None, kind: str | None = None) -> Check:
    """Check ``repo``'s cached ``main`` snapshot: every file a loader of ``kind`` opens is there (default:
    the kind its files show, ``contracts.snapshots``), and every file's content matches its hash: the blob
    it links to is named by it (the sha256 of an LFS file, the git blob sha1 of any other). A file copied
    without its link (``cp -rL``, ``rsync -L``) is hashed and looked up among the cache's blob names; one
    that matches none is corrupt when a blob of its size matches no file (same size, other bytes), else
    unhashed. A snapshot file whose blob is gone is missing."""
    folder = repo_folder(repo, cache_dir)
    revision = cached_revision(repo, cache_dir)
    check = Check(repo=repo, revision=revision)
    if revision is None:
        check.problems.append("not in the cache (run `pipeline models pull` on a connected machine)")
        return check
    snapshot = folder / "snapshots" / revision
    blobs = {
        p.name: p.stat().st_size for p in (folder / "blobs").glob("*") if _HEX.match(p.name) and p.is_file()
    }
    claimed: set[str] = set()
    copies: list[tuple[str, int]] = []  # dereferenced files that match no blob: (name, size)
    gone: set[str] = set()
    for link in sorted(snapshot.rglob("*")):
        if link.is_dir():
            continue
        check.files += 1
        name = link.relative_to(snapshot).as_posix()
        if not link.is_symlink():
            sha256, sha1 = _hashes(link)
            if sha256 in blobs or sha1 in blobs:
                claimed.add(sha256 if sha256 in blobs else sha1)
            else:
                copies.append((name, link.stat().st_size))
            continue
        blob = link.resolve()
        if not blob.is_file():
            check.problems.append(f"{name}: missing (its blob is gone)")
            gone.add(name)
            continue
        expected = blob.name
        claimed.add(expected)
        if not _HEX.match(expected):
            check.unhashed.append(f"{name}: links outside the cache's blobs ({blob}): no hash to check")
            continue
        sha256, sha1 = _hashes(blob)
        actual = sha256 if len(expected) == 64 else sha1
        if actual != expected:
            check.problems.append(f"{name}: corrupt (hash {actual[:12]}..., blob {expected[:12]}...)")
    unmatched = {size for blob, size in blobs.items() if blob not in claimed}
    for name, size in copies:
        if size in unmatched:
            check.problems.append(
                f"{name}: corrupt (a copy without its link: its content matches no blob of the cache, "
                "and a blob of its size matches no file)"
            )
        else:
            check.unhashed.append(
                f"{name}: could not be hashed (a copy without the cache's links, and no blob of the cache "
                "holds its content: copy HF_HOME keeping links, rsync -a)"
            )
    for name in missing_files(snapshot, kind or kind_of(snapshot)):
        if name not in gone:
            check.problems.append(f"{name}: missing (the stage loads it: a pull cut off between files?)")
    return check


def cached_repo_ids(cache_dir: Path | None = None) -> list[str]:
    """Every model repository in the Hugging Face cache."""
    from huggingface_hub import constants

    root = Path(cache_dir or constants.HF_HUB_CACHE)
    return sorted(
        p.name.removeprefix("models--").replace("--", "/", 1) for p in root.glob("models--*") if p.is_dir()
    )


def _hashes(path: Path) -> tuple[str, str]:
    """(sha256, git blob sha1) of ``path``'s content, in one read: what the cache names a blob by."""
    sha256 = hashlib.sha256()
    sha1 = hashlib.sha1(f"blob {path.stat().st_size}\0".encode())  # git's object id, not for security
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(2**20), b""):
            sha256.update(chunk)
            sha1.update(chunk)
    return sha256.hexdigest(), sha1.hexdigest()
