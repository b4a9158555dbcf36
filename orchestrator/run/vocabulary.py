"""Vocabulary files: the names and terms a corpus gives Whisper, found beside its inputs (read by the parent).

A folder's ``vocabulary.txt`` applies to every input under that folder (the
nearest folder's wins, up to the folder the run was given); an input's own
``<input>.vocabulary.txt`` (``talk.mp4.vocabulary.txt``, or ``talk.vocabulary.txt``)
applies to it alone. One name or term a line; blank lines and lines starting
with ``#`` are left out. The ASR stage joins them after the run's prompt and
hotwords, in that order, within Whisper's prompt budget (``stages/asr.py``).
What the files say is part of the input's ASR fingerprint, so a changed folder
vocabulary redoes exactly that folder's inputs. The input walk takes media files
only, so these files are never inputs.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

from contracts.artifacts import VocabularyFile

log = logging.getLogger(__name__)

#: a folder's vocabulary
FOLDER_FILE = "vocabulary.txt"
#: an input's own vocabulary: ``<input>`` + this, or its stem + this
INPUT_SUFFIX = ".vocabulary.txt"


def read_terms(path: Path) -> list[str]:
    """The names and terms of a vocabulary file, in order, once each."""
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    return list(dict.fromkeys(t for t in (line.strip() for line in lines) if t and not t.startswith("#")))


def _read(path: Path, level: str) -> VocabularyFile | None:
    try:
        if not path.is_file():
            return None
        terms = read_terms(path)
    except OSError as exc:
        log.warning("vocabulary: cannot read %s (%s); left out", path, exc)
        return None
    return VocabularyFile(level=level, path=str(path.absolute()), terms=terms) if terms else None


def vocabulary_files(source: Path, root: Path | None = None) -> tuple[VocabularyFile, ...]:
    """The vocabulary files that apply to the local ``source``: the nearest ``vocabulary.txt`` from its own
    folder up to ``root`` (the directory argument it was found under; None: its own folder only), then its
    own ``<input>.vocabulary.txt``."""
    out: list[VocabularyFile] = []
    folder = source.parent
    stop = (root or folder).absolute()
    if stop != folder.absolute() and stop not in folder.absolute().parents:
        stop = folder.absolute()
    while True:
        found = _read(folder / FOLDER_FILE, "folder")
        if found is not None:
            out.append(found)
            break
        if folder.absolute() == stop or folder.parent == folder:
            break
        folder = folder.parent
    for name in (source.name + INPUT_SUFFIX, source.stem + INPUT_SUFFIX):
        found = _read(source.parent / name, "input")
        if found is not None:
            out.append(found)
            break
    return tuple(out)


def identity(files: tuple[VocabularyFile, ...] | list[VocabularyFile]) -> str:
    """What of the files changes a transcript (their levels and terms, not where they are)."""
    blob = json.dumps([[f.level, f.terms] for f in files])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
