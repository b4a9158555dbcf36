"""A run's inputs: the walk over the arguments, each source's id and the output folder's index of them
(``.ids.json``), and what identifies a source. Starts no child.

Ids are built, not hashed. An input found under a directory argument keeps its
path relative to it, led by the directory's own name, so the output tree mirrors
the corpus (``/data/meetings/016437/audio.wav`` -> ``OUT/meetings/016437/audio/``);
a loose file keeps its stem. Whatever clash is left (two arguments with one name,
names differing only by case, a name one of the run's own files has, an id that
would sit inside another's folder) gets ``-2``, ``-3``, ... on its last part, each
checked free. The output directory's index (``.ids.json``: source -> id) wins
over all of this, so folders made by earlier versions keep their ids.

The same source given twice (listed twice, or a folder and a file in it) is one
input, with a note. Remote sources are known by their URL without credentials
(no user name or password, no signing or authenticating query parameter): the
same object under a new pre-signed URL keeps its id.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import stat
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from contracts.artifacts import VocabularyFile
from contracts.errors import InputError
from contracts.io import atomic_write_text
from orchestrator import layout
from orchestrator.planning.vocabulary import FOLDER_FILE, INPUT_SUFFIX, left_out_note, vocabulary_files
from orchestrator.remote import expand_url, is_url, redact, url_stem, url_suffix, without_credentials

log = logging.getLogger(__name__)

MEDIA_SUFFIXES = frozenset(
    ".mp4 .mkv .mov .avi .webm .m4v .flv .ts .mpg .mpeg .wmv .wav .mp3 .m4a .aac .flac .ogg .opus .wma .aiff".split()
)
#: each part of an id is cut to this many UTF-8 bytes, so "<part>-<n>" stays a valid file name (255 bytes)
MAX_PART_BYTES = 200


@dataclass(frozen=True)
class Found:
    """One source as the arguments gave it: a local path or a URL, and the parts its id is made of."""

    source: Path | str
    #: (directory argument's name, sub-folders..., stem), or (stem,) for a loose file
    parts: tuple[str, ...]
    #: the directory argument a local file was found under (where its vocabulary files are looked for up to)
    root: Path | None = None
    #: what the walk saw of a file it found: its ``stat``, and its absolute path as text
    seen: os.stat_result | None = None
    absolute: str | None = None


def find_inputs(
    paths: list[str | Path],
    output: Path | None = None,
    skipped: list[str] | None = None,
    listing: dict[str, frozenset[str]] | None = None,
) -> list[Found]:
    """Files stay as given (missing ones too: they fail alone later); directories give their media files in
    sorted order, each with its path relative to the directory. A directory without media stays itself, to
    fail alone with that reason. fsspec URLs (strings) are expanded the same way and stay URLs.

    A directory's walk never enters this run's ``output`` folder nor any other output folder
    (:func:`iter_media`): each such folder is named once, in ``skipped`` when given, else in a warning.
    ``listing`` gets the vocabulary file names of each folder walked (see :func:`_walk`)."""
    out: list[Found] = []
    passed: list[Path] = []
    for raw in paths:
        if is_url(raw):
            url = str(raw)
            found = expand_url(url, MEDIA_SUFFIXES)
            if found == [url]:
                out.append(Found(url, (url_stem(url),)))
                continue
            base = url.split("?", 1)[0].rstrip("/")
            name = PurePosixPath(base.split("://", 1)[-1]).name or "input"
            for item in found:
                rel = PurePosixPath(item[len(base) :].lstrip("/"))
                out.append(Found(item, (name, *rel.parent.parts, rel.stem)))
            continue
        path = Path(raw)
        if path.is_dir():
            files = _media_under(path, output, passed, listing)
            name = path.absolute().resolve().name if path.name in ("", ".", "..") else path.name
            if not files:
                out.append(Found(path, (name or "input",)))
            absolute = str(path.absolute())
            for file, rel, seen in files:  # as text: a corpus has many files
                base = os.path.basename(file)
                parts = (name or "input", *rel, os.path.splitext(base)[0])
                where = os.path.join(absolute, *rel, base)
                out.append(Found(Path(file), parts, root=path, seen=seen, absolute=where))
        else:
            out.append(Found(path, (path.stem,)))
    names = list(dict.fromkeys(shown(p) for p in passed))
    if skipped is not None:
        skipped.extend(names)
    for name in names if skipped is None else ():
        log.warning("skipped %s: the pipeline's output, not an input", name)
    return out


def iter_media(root: Path, out: Path | None = None, skipped: list[Path] | None = None) -> Iterator[Path]:
    """Media files below ``root`` as the walk meets them (folders in sorted order); linked folders
    are followed once (no loops). A caller may stop early (the API's bounded walk).

    No file the pipeline wrote is taken: the walk does not enter this run's output folder ``out`` nor any
    output folder (:func:`orchestrator.layout.is_output`: an earlier run's, whatever it was named), each
    added to ``skipped``. Where ``root`` is in or is an output folder (``--output`` above the inputs), the
    folders of that folder's inputs (its index) and its run-level folders are left out; a ``root`` inside
    an input's folder is skipped whole."""
    for path, _rel, _stat in _walk(str(root), out, skipped, None):
        yield Path(path)


def _walk(
    root: str, out: Path | None, skipped: list[Path] | None, listing: dict[str, frozenset[str]] | None
) -> Iterator[tuple[str, tuple[str, ...], os.stat_result]]:
    """:func:`iter_media`'s walk, as text: each regular media file (links followed) as (its path, the names
    of the folders between ``root`` and it, its ``stat``). One ``scandir`` a folder, one ``stat`` a folder
    and a file: the listing tells which folders are output folders, and ``listing`` (absolute folder ->
    the names of its vocabulary files) keeps what the vocabulary lookup would otherwise ask the disk."""
    seen: set[tuple[int, int]] = set()
    own = _identity(out) if out is not None else None
    home, ids = _output_around(Path(root))
    if home is not None and _within(os.path.relpath(os.path.abspath(root), home), ids):
        if skipped is not None:
            skipped.append(Path(root))
        return
    # (folder as the walk names it, the folder names from root to it, its absolute path as text)
    stack: list[tuple[str, tuple[str, ...], str]] = [(root, (), str(Path(root).absolute()))]
    while stack:
        directory, rel, absolute = stack.pop()
        try:
            st = os.stat(directory)
            with os.scandir(directory) as listed:
                entries = sorted(listed, key=_name)
        except OSError:
            continue
        identity = (st.st_dev, st.st_ino)
        if rel and (identity == own or any(entry.name in _MARKERS for entry in entries)):
            # an output folder (any run's, or this run's whatever it holds yet): never entered
            if skipped is not None:
                skipped.append(Path(directory))
            continue
        if identity in seen:  # a linked folder met again
            continue
        seen.add(identity)
        if listing is not None:
            found = [entry.name for entry in entries if entry.name.endswith(VOCABULARY_NAMES)]
            listing[absolute] = frozenset(found) if found else _NONE
        subs: list[str] = []
        for entry in entries:
            name = entry.name
            try:
                is_dir = entry.is_dir()
            except OSError:
                continue
            if is_dir:
                if home is not None:
                    sub = os.path.relpath(os.path.abspath(entry.path), home)
                    if sub in ids or (os.sep not in sub and name in layout.RUN_LEVEL):
                        continue  # an input's folder (or .runs) of the output folder the walk is in
                subs.append(name)
            elif os.path.splitext(name)[1].lower() in MEDIA_SUFFIXES:
                try:
                    file_stat = entry.stat()
                except OSError:
                    continue
                if stat.S_ISREG(file_stat.st_mode):
                    yield entry.path, rel, file_stat
        for name in reversed(subs):
            stack.append((os.path.join(directory, name), (*rel, name), os.path.join(absolute, name)))


#: what a vocabulary file's name ends with (``orchestrator.planning.vocabulary``)
VOCABULARY_NAMES = (FOLDER_FILE, INPUT_SUFFIX)
_NONE: frozenset[str] = frozenset()
_MARKERS = frozenset(layout.MARKERS)


def _name(entry: os.DirEntry) -> str:
    return entry.name


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def _output_around(root: Path) -> tuple[str | None, set[str]]:
    """The output folder ``root`` is or sits in (nearest first), with its inputs' folders (relative to it,
    from its index); ``(None, set())`` when there is none."""
    path = os.path.abspath(root)
    while True:
        if layout.is_output(path):
            return path, {item_id.replace("/", os.sep) for item_id in load_ids(Path(path)).values()}
        parent = os.path.dirname(path)
        if parent == path:
            return None, set()
        path = parent


def _within(rel: str, ids: set[str]) -> bool:
    """Whether ``rel`` (a path relative to an output folder) is one of its inputs' folders or inside one."""
    parts = rel.split(os.sep)
    return any(os.sep.join(parts[:n]) in ids for n in range(1, len(parts) + 1))


def _media_under(
    root: Path,
    out: Path | None = None,
    skipped: list[Path] | None = None,
    listing: dict[str, frozenset[str]] | None = None,
) -> list[tuple[str, tuple[str, ...], os.stat_result]]:
    """:func:`_walk`'s files in the order of their paths' parts (as ``sorted`` orders ``Path`` objects)."""
    return sorted(
        _walk(str(root), out, skipped, listing), key=lambda found: (*found[1], os.path.basename(found[0]))
    )


def expand_inputs(paths: list[str | Path]) -> list[Path | str]:
    """The sources :func:`find_inputs` finds, without their id parts."""
    return [f.source for f in find_inputs(paths)]


def shown(path: Path | str) -> str:
    """A path as text that is always valid UTF-8: bytes that are not are written as \\xNN; a URL without
    its password."""
    return redact(str(path)) if is_url(path) else os.fsencode(path).decode("utf-8", "backslashreplace")


def source_key(path: Path | str) -> str:
    """What identifies a source in the index across runs: its URL without credentials, or its absolute
    path (any bytes, escaped)."""
    if is_url(path):
        return without_credentials(str(path))
    path = Path(path)
    return shown(path if path.is_absolute() else path.absolute())


def same_source(path: Path | str) -> tuple:
    """What makes two arguments the same source: the URL without credentials, or the file itself
    (device and inode; the real path when it cannot be read)."""
    if is_url(path):
        return ("url", without_credentials(str(path)))
    try:
        st = os.stat(path)
        if stat.S_ISREG(st.st_mode):
            return ("file", st.st_dev, st.st_ino)
    except OSError:
        pass
    return ("path", os.path.realpath(path))


def _part(text: str) -> str:
    """One part of an id: valid UTF-8, NFC, no separators or controls, no leading dot, at most
    :data:`MAX_PART_BYTES` bytes ("input" if nothing is left)."""
    text = text.encode("utf-8", "surrogateescape").decode("utf-8", "replace").replace("\ufffd", "_")
    part = unicodedata.normalize("NFC", text).strip() or "input"
    part = "".join("_" if ch in "/\\\0" or ord(ch) < 32 else ch for ch in part).lstrip(".").strip() or "input"
    return part.encode("utf-8")[:MAX_PART_BYTES].decode("utf-8", "ignore") or "input"


class _Taken:
    """Ids in use (case-insensitively), and every folder they need: an id must neither equal another nor
    sit inside another's folder (nor hold one in its own)."""

    def __init__(self) -> None:
        self.ids: set[str] = set()
        self.folders: set[str] = set()

    def clashes(self, item_id: str) -> bool:
        key = item_id.lower()
        parts = key.split("/")
        if layout.reserved(parts[0]) or key in self.ids or key in self.folders:
            return True
        return any("/".join(parts[:n]) in self.ids for n in range(1, len(parts)))

    def add(self, item_id: str) -> None:
        key = item_id.lower()
        self.ids.add(key)
        parts = key.split("/")
        self.folders.update("/".join(parts[:n]) for n in range(1, len(parts)))


def _free(parts: list[str], taken: _Taken) -> str:
    candidate = "/".join(parts)
    number = 1
    while taken.clashes(candidate):
        number += 1
        candidate = "/".join([*parts[:-1], f"{parts[-1]}-{number}"])
    return candidate


def assign_ids(
    found: list[Found], known: dict[str, str] | None = None, keys: list[str] | None = None
) -> list[str]:
    """One id per source (see the module doc); ``known`` is the index (source key -> id) and wins.
    ``keys``: the sources' :func:`source_key`, when the caller has them already."""
    known = known or {}
    taken = _Taken()
    for item_id in known.values():
        taken.add(item_id)
    keys = keys if keys is not None else [source_key(item.source) for item in found]
    ids: list[str | None] = [known.get(key) for key in keys]
    # new ids in the order of their sources, not of the arguments: the same files get the same ids however
    # they are listed (which of Talk.wav and talk.wav gets the "-2" does not depend on a shuffle)
    for index in sorted((i for i, item_id in enumerate(ids) if item_id is None), key=keys.__getitem__):
        item_id = _free([_part(p) for p in found[index].parts], taken)
        taken.add(item_id)
        ids[index] = item_id
    return ids


def item_ids(paths: list[Path | str], known: dict[str, str] | None = None) -> list[str]:
    """Ids for loose sources (each its stem, clashes made free): what API jobs and tests use."""
    return assign_ids([Found(p, (url_stem(str(p)) if is_url(p) else Path(p).stem,)) for p in paths], known)


def load_ids(out: Path) -> dict[str, str]:
    """The output directory's index of source -> id (empty when there is none, or it is unreadable).

    URL keys lose their credentials (an index written by an earlier version could hold them), and where
    that index gave one id to two sources (earlier versions could), the first keeps it: the other gets
    a new id, and its fingerprints tell whose artifacts the folder holds."""
    try:
        index = json.loads(layout.path(out, layout.IDS).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(index, dict):
        return {}
    clean: dict[str, str] = {}
    owners: set[str] = set()
    for key, item_id in sorted(index.items()):
        key, item_id = str(key), str(item_id)
        if is_url(key):
            key = without_credentials(key)
        if key in clean:  # the same source under two signatures (earlier versions): the first id holds
            continue
        if item_id.lower() in owners:
            log.warning("index: %s shared id %r with another source; it gets a new one", redact(key), item_id)
            continue
        owners.add(item_id.lower())
        clean[key] = item_id
    return clean


def _stored(out: Path) -> dict | None:
    """The index file as it is (None: none, or unreadable)."""
    try:
        return json.loads(layout.path(out, layout.IDS).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def save_ids(out: Path, index: dict[str, str]) -> None:
    """Write the index atomically (JSON with \\u escapes: any source path survives; no credentials)."""
    atomic_write_text(
        layout.path(out, layout.IDS), json.dumps(index, ensure_ascii=True, indent=1, sort_keys=True)
    )


@dataclass(frozen=True, slots=True)
class Input:
    """One input as planned (immutable): its id, where its source is, its folder. What a run learns and
    does about it is its :class:`~orchestrator.planning.state.InputState`."""

    id: str
    #: the local file the first stage reads (for a URL input: where it is fetched to)
    source: Path
    directory: Path
    #: the fsspec URL the input comes from, if not a local path (with its credentials: only to fetch it)
    url: str | None = None
    #: the source as the report shows it, when its name is not UTF-8 (escaped bytes)
    shown_source: str | None = None
    #: what planning noticed (the same source given more than once)
    notes: tuple[str, ...] = ()
    #: the vocabulary files that apply to it (``orchestrator.planning.vocabulary``; local sources only)
    vocabulary: tuple[VocabularyFile, ...] = ()
    #: why it fails before any stage runs (a vocabulary file that is not one), None: it is planned to run
    error: str | None = None

    @property
    def shown(self) -> str:
        """The source as reports and logs show it (escaped bytes; a URL without its password)."""
        return redact(self.url) if self.url else self.shown_source or str(self.source)

    def artifact(self, kind: str) -> Path:
        """Where this input's artifact of ``kind`` lives (decoded audio is scratch)."""
        return Path(self.artifact_file(kind))

    def artifact_file(self, kind: str) -> str:
        """:meth:`artifact` as a string, made without :mod:`pathlib` (planning a corpus asks for several per
        input; joining ``Path`` objects was a fifth of a 100,000-input dry run)."""
        if kind == "audio":
            return f"{self.directory}{os.sep}.work{os.sep}audio.json"
        return f"{self.directory}{os.sep}{kind}.json"


def plan_inputs(
    paths: list[str | Path], out: Path, dry: bool = False, skipped: list[str] | None = None
) -> list[Input]:
    """The run's inputs, one per distinct source, with ids (the index updated on disk unless ``dry``) and
    notes for sources given more than once. The walk leaves out the pipeline's own output folders
    (:func:`find_inputs`: named in ``skipped`` when given, else in a warning)."""
    listing: dict[str, frozenset[str]] = {}
    found = find_inputs(paths, out, skipped, listing)
    unique: dict[tuple, Found] = {}
    also: dict[tuple, list[str]] = {}
    for item in found:
        same = ("file", item.seen.st_dev, item.seen.st_ino) if item.seen else same_source(item.source)
        if same in unique:
            also.setdefault(same, []).append(shown(item.source))
        else:
            unique[same] = item
    index = load_ids(out)
    kept = list(unique.values())
    keys = [shown(f.absolute) if f.absolute else source_key(f.source) for f in kept]
    ids = assign_ids(kept, index, keys)
    new = dict(zip(keys, ids))
    if not dry and (any(index.get(k) != v for k, v in new.items()) or _stored(out) != index):
        save_ids(out, index | new)  # also when the file held what load_ids drops (an earlier signed URL)
    inputs = []
    folders: dict[str, VocabularyFile | InputError | None] = {}  # each folder's vocabulary.txt, read once
    for (same, item), item_id in zip(unique.items(), ids):
        inp = _input(item_id, item.source, out, dry)
        notes: list[str] = []
        if not is_url(item.source):
            try:
                vocabulary = vocabulary_files(Path(item.source), item.root, folders, listing, item.absolute)
            except InputError as exc:  # this input fails alone, before any stage
                inp = dataclasses.replace(inp, error=str(exc))
            else:
                if vocabulary:
                    inp = dataclasses.replace(inp, vocabulary=vocabulary)
                notes += [left_out_note(f.path, len(f.terms), f.left_out) for f in vocabulary if f.left_out]
        if same in also:
            others = also[same]
            notes.insert(
                0,
                f"given {len(others) + 1} times (also as {', '.join(others[:3])}"
                f"{', ...' if len(others) > 3 else ''}); processed once",
            )
        if notes:
            inp = dataclasses.replace(inp, notes=tuple(notes))
        inputs.append(inp)
    return inputs


def _input(item_id: str, source: Path | str, out: Path, dry: bool = False) -> Input:
    directory = out / item_id
    if is_url(source):
        source = str(source)
        return Input(
            id=item_id,
            source=directory / ".work" / f"source{url_suffix(source)}",
            directory=directory,
            url=source,
        )
    source = source if isinstance(source, Path) else Path(source)
    text = str(source)
    plain = text.isascii() or shown(source) == text  # a name that is not UTF-8 has escapes: not ASCII
    if not plain and dry:  # the same identity as through the link (its real path)
        return Input(id=item_id, source=source, directory=directory, shown_source=shown(source))
    if not plain:
        # a name that is not UTF-8 cannot travel in a request (JSON): the child reads it through a link
        link = directory / ".work" / f"source{_safe_suffix(source)}"
        try:
            link.parent.mkdir(parents=True, exist_ok=True)
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to(source.absolute())
        except OSError as exc:
            log.warning("cannot link %s: %s", shown(source), exc)
        return Input(id=item_id, source=link, directory=directory, shown_source=shown(source))
    return Input(id=item_id, source=source, directory=directory)


def _safe_suffix(path: Path) -> str:
    suffix = path.suffix.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    return suffix if suffix.isascii() and "\ufffd" not in suffix else ""
