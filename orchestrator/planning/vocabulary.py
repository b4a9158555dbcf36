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
import os
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


def _read(path: str, level: str) -> VocabularyFile | None:
    """The vocabulary file at the absolute ``path`` (None: there is none, it cannot be read, or is empty)."""
    try:
        if not os.path.isfile(path):
            return None
        terms = read_terms(Path(path))
    except OSError as exc:
        log.warning("vocabulary: cannot read %s (%s); left out", path, exc)
        return None
    return VocabularyFile(level=level, path=path, terms=terms) if terms else None


def vocabulary_files(
    source: Path,
    root: Path | None = None,
    folders: dict[str, VocabularyFile | None] | None = None,
    listing: dict[str, frozenset[str]] | None = None,
    absolute: str | None = None,
) -> tuple[VocabularyFile, ...]:
    """The vocabulary files that apply to the local ``source``: the nearest ``vocabulary.txt`` from its own
    folder up to ``root`` (the directory argument it was found under; None: its own folder only), then its
    own ``<input>.vocabulary.txt``. ``folders`` (folder -> its ``vocabulary.txt``, or None) is what one
    planning has read already: a corpus's inputs share their parent folders. ``listing`` (absolute folder
    -> the names in it that end as vocabulary files do) is what the input walk saw: a folder it lists is
    not asked again whether such a file is there. ``absolute``: the source's absolute path, when known.

    Paths as text (``Path.absolute()``'s, then ``os.path``): planning calls this once per input."""
    out: list[VocabularyFile] = []
    own = folder = os.path.dirname(absolute) if absolute else str(source.parent.absolute())
    names = listing.get(own) if listing is not None else None
    stop = str((root or source.parent).absolute())
    if stop != folder and not folder.startswith(stop.rstrip(os.sep) + os.sep):
        stop = folder
    while True:
        listed = listing.get(folder) if listing is not None else None
        if listed is not None and FOLDER_FILE not in listed:
            found = None
        elif folders is None:
            found = _read(os.path.join(folder, FOLDER_FILE), "folder")
        elif folder in folders:
            found = folders[folder]
        else:
            found = folders[folder] = _read(os.path.join(folder, FOLDER_FILE), "folder")
        if found is not None:
            out.append(found)
            break
        parent = os.path.dirname(folder)
        if folder == stop or parent == folder:
            break
        folder = parent
    for name in (source.name + INPUT_SUFFIX, source.stem + INPUT_SUFFIX):
        if names is not None and name not in names:
            continue
        found = _read(os.path.join(own, name), "input")
        if found is not None:
            out.append(found)
            break
    return tuple(out)


def identity(files: tuple[VocabularyFile, ...] | list[VocabularyFile]) -> str:
    """What of the files changes a transcript (their levels and terms, not where they are)."""
    blob = json.dumps([[f.level, f.terms] for f in files])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
