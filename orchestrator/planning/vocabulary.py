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
import unicodedata
from pathlib import Path

from contracts.artifacts import VocabularyFile, terms_sha256
from contracts.errors import InputError
from contracts.io import atomic_write_text

log = logging.getLogger(__name__)

#: a folder's vocabulary
FOLDER_FILE = "vocabulary.txt"
#: an input's own vocabulary: ``<input>`` + this, or its stem + this
INPUT_SUFFIX = ".vocabulary.txt"
#: the most names and terms read from one vocabulary file, in file order (the rest are left out, with a note);
#: Whisper's prompt holds 224 tokens, a few dozen names
MAX_TERMS = 1_000
#: the largest vocabulary file read: a bigger one is not a list of names (its inputs fail, with the reason)
MAX_BYTES = 1 << 20


def read_terms(path: Path | str) -> tuple[list[str], int]:
    """The names and terms of a vocabulary file, in file order, once each: the first :data:`MAX_TERMS`, and
    how many more it holds (left out). Raises InputError, with a one-line reason naming the file, for a file
    over :data:`MAX_BYTES` or one that is not UTF-8 text (a byte order mark is allowed)."""
    with open(path, "rb") as f:
        data = f.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        size = os.path.getsize(path)
        raise InputError(
            f"vocabulary file {path} is {size / 2**20:.1f} MiB, over the {MAX_BYTES // 2**20} MiB a vocabulary "
            "file may be (one name or term a line)"
        )
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(
            f"vocabulary file {path} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); "
            "save it as UTF-8"
        ) from None
    lines = text.splitlines()
    for number, line in enumerate(lines, start=1):
        bad = next((c for c in line if unicodedata.category(c) == "Cc" and c != "\t"), None)
        if bad is not None:
            raise InputError(
                f"vocabulary file {path} is not text (control character U+{ord(bad):04X} on line {number})"
            )
    terms = list(dict.fromkeys(t for t in (line.strip() for line in lines) if t and not t.startswith("#")))
    return terms[:MAX_TERMS], max(0, len(terms) - MAX_TERMS)


def _read(path: str, level: str) -> VocabularyFile | None:
    """The vocabulary file at the absolute ``path``, also when it holds no terms (None: there is none, or it
    cannot be read). Raises InputError when it is not a vocabulary file (:func:`read_terms`)."""
    try:
        if not os.path.isfile(path):
            return None
        terms, left_out = read_terms(path)
    except OSError as exc:
        log.warning("vocabulary: cannot read %s (%s); left out", path, exc)
        return None
    if left_out:
        log.warning("vocabulary: %s", left_out_note(path, len(terms), left_out))
    return VocabularyFile(level=level, path=path, terms=terms, left_out=left_out)


def left_out_note(path: str, kept: int, left_out: int) -> str:
    """What an input's report says of a vocabulary file cut at :data:`MAX_TERMS`."""
    return (
        f"vocabulary file {path}: {left_out} of its {kept + left_out} terms left out "
        f"(only the first {MAX_TERMS} are read)"
    )


def vocabulary_files(
    source: Path,
    root: Path | None = None,
    folders: dict[str, VocabularyFile | InputError | None] | None = None,
    listing: dict[str, frozenset[str]] | None = None,
    absolute: str | None = None,
) -> tuple[VocabularyFile, ...]:
    """The vocabulary files that apply to the local ``source``: the nearest ``vocabulary.txt`` from its own
    folder up to ``root`` (the directory argument it was found under; None: its own folder only), then its
    own ``<input>.vocabulary.txt``; the nearest found wins even when it holds no terms. Raises InputError
    when one of them is not a vocabulary file (:func:`read_terms`). ``folders`` (folder -> its
    ``vocabulary.txt``, None, or why it is not one) is what one
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
        elif folders is not None and folder in folders:
            found = folders[folder]
        else:
            try:
                found = _read(os.path.join(folder, FOLDER_FILE), "folder")
            except InputError as exc:  # kept: each input under the folder fails with it
                found = exc
            if folders is not None:
                folders[folder] = found
        if isinstance(found, InputError):
            raise found
        if found is not None:  # the nearest wins, also with no terms (an empty file switches those above off)
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
    """What of the files changes a transcript (their levels and terms, not where they are): a file with no
    terms adds nothing (the terms it switches off are gone from the files above it)."""
    blob = json.dumps([[f.level, f.terms] for f in files if f.terms])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


class TermStore:
    """The run's files of vocabulary terms (``<run>/vocabulary/<sha256>.json``, a JSON list), each written
    once: a work item names a file's terms by reference (:meth:`reference`) instead of carrying them, so an
    input's request, and every member of its join group listed in it, stays small. Planning read each file
    once a run, so a file's path names its terms for the run."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._sent: dict[tuple[str, str], VocabularyFile] = {}

    def reference(self, file: VocabularyFile) -> VocabularyFile:
        """``file`` with its terms by reference (one with no terms as it is)."""
        if not file.terms or file.terms_file is not None:
            return file
        key = (file.level, file.path)
        sent = self._sent.get(key)
        if sent is None:
            digest = terms_sha256(file.terms)
            path = self.folder / f"{digest}.json"
            if not path.exists():
                self.folder.mkdir(parents=True, exist_ok=True)
                atomic_write_text(path, json.dumps(file.terms, ensure_ascii=False))
            update = {"terms": [], "count": len(file.terms), "sha256": digest, "terms_file": str(path)}
            sent = self._sent[key] = file.model_copy(update=update)
        return sent

    def references(self, files: list[VocabularyFile] | tuple[VocabularyFile, ...]) -> list[VocabularyFile]:
        return [self.reference(f) for f in files]
