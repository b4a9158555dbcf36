"""Which files a model's folder (a Hugging Face cache snapshot, or a local folder) must hold for its loader.

Shared by the parent, which plans a model only when its cached snapshot can load (``orchestrator.models``),
and the stage children, which name the missing file when they fall back. Stdlib only: nothing is loaded,
only file names (and the few small text files that name others) are read.

Each kind lists what its loader opens, not what the repository happens to hold:

- ``sentence-transformers`` (the embeddings): ``config.json`` and the weights;
- ``whisper`` (ASR): a CTranslate2 model (faster-whisper: ``model.bin``, ``config.json``, ``tokenizer.json``,
  ``vocabulary.json`` or ``.txt``) or a transformers one (``config.json``, the weights, ``tokenizer.json``);
- ``wav2vec2`` (whisperX's hub aligners: ``Wav2Vec2Processor`` and ``Wav2Vec2ForCTC``): ``config.json``,
  ``preprocessor_config.json``, ``vocab.json`` and the weights;
- ``pyannote`` (a diarization pipeline): ``config.yaml`` and each ``$model/...`` sub-model it names;
- ``speechbrain`` (the ECAPA encoder): ``hyperparams.yaml`` and each ``<pretrained_path>/...`` file its
  pretrainer fetches;
- ``transformers`` (a folder whose kind is known by ``config.json`` only): ``config.json`` and the weights.

The weights are ``model.safetensors`` or ``pytorch_model.bin``, or every shard the index
(``model.safetensors.index.json``, ``pytorch_model.bin.index.json``) names.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

#: the kind of model each stage loads
STAGE_KINDS: dict[str, str] = {
    "asr": "whisper",
    "embeddings": "sentence-transformers",
    "alignment": "wav2vec2",
    "diarization": "pyannote",
    "enrollment": "speechbrain",
    "voice_profile": "speechbrain",
}
WEIGHTS = ("model.safetensors", "pytorch_model.bin")
INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
VOCABULARIES = ("vocabulary.json", "vocabulary.txt")
_PYANNOTE_REF = re.compile(r"\$model/([\w./-]+)")
_SPEECHBRAIN_REF = re.compile(r"<pretrained_path>/([\w./-]+)")


def kind_of(folder: Path) -> str | None:
    """The kind of model ``folder`` holds, by its files (None: none this project loads)."""

    def has(name: str) -> bool:  # a link to a lost blob still says what the folder is
        return (folder / name).is_file() or (folder / name).is_symlink()

    if has("hyperparams.yaml"):
        return "speechbrain"
    if has("config.yaml"):
        return "pyannote"
    if any(
        has(n) for n in ("modules.json", "config_sentence_transformers.json", "sentence_bert_config.json")
    ):
        return "sentence-transformers"
    if has("model.bin") or any(has(n) for n in VOCABULARIES):
        return "whisper"
    if has("config.json"):
        return "transformers"
    return None


def missing_files(folder: Path, kind: str | None) -> list[str]:
    """The files ``folder`` lacks that a loader of ``kind`` opens (``a (or b)`` where either will do); a
    link whose target is gone is missing. Empty: it can load, as far as its files go."""
    if kind is None:
        return []
    if kind == "whisper":
        if _any(folder, "model.bin", *VOCABULARIES) or not _any(folder, *WEIGHTS, *INDEXES):
            return _lacks(folder, "model.bin", "config.json", "tokenizer.json") + _one_of(
                folder, VOCABULARIES
            )
        return _lacks(folder, "config.json", "tokenizer.json") + _weights(folder)
    if kind == "wav2vec2":
        return _lacks(folder, "config.json", "preprocessor_config.json", "vocab.json") + _weights(folder)
    if kind == "pyannote":
        return _lacks(folder, "config.yaml") or _named(folder, "config.yaml", _PYANNOTE_REF)
    if kind == "speechbrain":
        return _lacks(folder, "hyperparams.yaml") or _named(folder, "hyperparams.yaml", _SPEECHBRAIN_REF)
    if kind in ("sentence-transformers", "transformers"):
        return _lacks(folder, "config.json") + _weights(folder)
    raise ValueError(f"unknown model kind {kind!r}")


def _any(folder: Path, *names: str) -> bool:
    return any((folder / name).is_file() for name in names)


def _lacks(folder: Path, *names: str) -> list[str]:
    return [name for name in names if not (folder / name).is_file()]


def _one_of(folder: Path, names: tuple[str, ...]) -> list[str]:
    return [] if _any(folder, *names) else [" (or ".join(names) + ")" * (len(names) - 1)]


def _weights(folder: Path) -> list[str]:
    for index in INDEXES:
        if (folder / index).is_file():
            try:
                shards = sorted(set(json.loads((folder / index).read_text())["weight_map"].values()))
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                return [f"{index} (unreadable)"]
            return _lacks(folder, *shards)
    return _one_of(folder, WEIGHTS)


def _named(folder: Path, config: str, pattern: re.Pattern) -> list[str]:
    """The files or folders ``config`` names (``pattern``'s group) that ``folder`` lacks (a folder: no file
    in it)."""
    try:
        text = (folder / config).read_text(errors="replace")
    except OSError:
        return [config]
    missing = []
    for name in dict.fromkeys(m.group(1).rstrip("/.") for m in pattern.finditer(text)):
        path = folder / name
        if not (path.is_file() or (path.is_dir() and any(p.is_file() for p in path.rglob("*")))):
            missing.append(name)
    return missing
