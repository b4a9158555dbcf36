"""Atomic, validated reading and writing of contract files.

Every file is written to a temporary name in the same directory, fsynced and
renamed over the target, so a reader sees either the old whole file or the new
whole file, never half of one. Every model is validated before it is written
and again when it is read; sidecar files (``.npy``) are checked against the
sha256 their artifact records.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from contracts.errors import ArtifactError, DiskFullError, FileTooLargeError

M = TypeVar("M", bound=BaseModel)

_CHUNK = 1 << 20


def sha256_file(path: str | Path) -> str:
    digest = hashlib.sha256()
    for block in _blocks(path):
        digest.update(block)
    return digest.hexdigest()


#: errors that mean "the disk (or this process's share of it) is full"
_FULL = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


def is_disk_full(exc: BaseException) -> bool:
    """A full disk or quota (:class:`DiskFullError`, ENOSPC, EDQUOT): the run stops. Not a file over the size
    limit (:class:`FileTooLargeError`, EFBIG): that one file never fits, and its input fails alone."""
    if isinstance(exc, DiskFullError):
        return not isinstance(exc, FileTooLargeError)
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def atomic_write_bytes(path: str | Path, data: bytes | Callable[[], Iterable[bytes]]) -> Path:
    """Write ``data`` (bytes, or a function giving them in pieces: nothing held whole) to ``path``
    atomically (temp file + fsync + rename).

    On any failure the temporary file is removed and ``path`` is left as it was; a full disk
    (or quota, or file size limit) is a :class:`DiskFullError` that names the file.
    """
    path = Path(path)
    tmp = None
    written = 0
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), 0o644)  # mkstemp's 0600 would hide outputs from other users
            for piece in (data,) if isinstance(data, bytes) else data():
                fh.write(piece)
                written += len(piece)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
        if isinstance(exc, OSError) and exc.errno in _FULL:
            size = len(data) if isinstance(data, bytes) else f"{written} of more"
            if exc.errno == errno.EFBIG:
                raise FileTooLargeError(
                    f"file too large to write {path.name} ({size} bytes; {exc.strerror}: the "
                    f"file size limit) in {path.parent}"
                ) from None
            raise DiskFullError(
                f"no space left writing {path.name} ({size} bytes; {exc.strerror}) in {path.parent}"
            ) from None
        raise
    _fsync_dir(path.parent)
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def save_model(model: BaseModel, path: str | Path, *copies: str | Path) -> Path:
    """Validate ``model`` again and write it as JSON atomically (to ``path`` and each of ``copies``, validated
    and serialised once)."""
    try:
        type(model).model_validate(model.model_dump())  # the checked copy is dropped at once: a large report
    except ValidationError as exc:
        raise ArtifactError(
            path, f"refusing to write an invalid {type(model).__name__}: {_first_error(exc)}"
        ) from exc
    data = model.model_dump_json(indent=2).encode("utf-8") + b"\n"
    for copy in copies:
        atomic_write_bytes(copy, data)
    return atomic_write_bytes(path, data)


def save_large(model: BaseModel, field: str, path: str | Path, *copies: str | Path) -> Path:
    """:func:`save_model` for a model with a long list ``field`` (a run report of 100,000 inputs): validated
    and written (compact JSON) one element at a time, so it is never held whole as a dict or a text."""
    head = model.model_copy(update={field: []})
    elements = getattr(model, field)
    try:
        type(model).model_validate(head.model_dump())
        for element in elements:
            type(element).model_validate(element.model_dump())
    except ValidationError as exc:
        raise ArtifactError(
            path, f"refusing to write an invalid {type(model).__name__}: {_first_error(exc)}"
        ) from exc
    before, after = head.model_dump_json().split(f'"{field}":[]', 1)

    def pieces() -> Iterator[bytes]:
        yield f'{before}"{field}":['.encode()
        for number, element in enumerate(elements):
            yield (b"," if number else b"") + element.model_dump_json().encode()
        yield f"]{after}\n".encode()

    atomic_write_bytes(path, pieces)
    for copy in copies:
        link_or_copy(path, copy)
    return Path(path)


def link_or_copy(path: str | Path, copy: str | Path) -> Path:
    """``copy`` made the file at ``path`` atomically: a hard link where the filesystem allows (nothing written:
    a report of 100,000 inputs is 140 MB; every write here replaces a file, so the two never change
    together), else its bytes copied."""
    copy = Path(copy)
    copy.parent.mkdir(parents=True, exist_ok=True)
    tmp = copy.with_name(f".{copy.name}.{os.getpid()}.link")
    try:
        os.link(path, tmp)
        os.replace(tmp, copy)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return atomic_write_bytes(copy, lambda: _blocks(path))
    _fsync_dir(copy.parent)
    return copy


def _blocks(path: str | Path) -> Iterator[bytes]:
    with open(path, "rb") as fh:
        while block := fh.read(_CHUNK):
            yield block


def load_model(path: str | Path, cls: type[M]) -> M:
    """Read and validate a JSON contract file; any problem names the file."""
    try:  # not pathlib: a resume reads every artifact of a corpus
        with open(path, "rb") as fh:
            raw = fh.read()
    except FileNotFoundError:
        raise ArtifactError(Path(path), "missing") from None
    except OSError as exc:
        raise ArtifactError(Path(path), f"unreadable ({exc.strerror})") from exc
    try:  # pydantic's own JSON parsing: several times faster (a resume reads every artifact of a corpus)
        return cls.model_validate_json(raw)
    except ValidationError:
        pass  # said as ever, by the path below: not valid JSON, or the first field that does not match
    path = Path(path)
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ArtifactError(path, f"not valid JSON ({exc})") from exc
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        raise ArtifactError(path, f"does not match {cls.__name__}: {_first_error(exc)}") from exc


def load_artifact(path: str | Path, cls: type[M]) -> M:
    """Like :func:`load_model`, then check the artifact's sidecar file, if any."""
    artifact = load_model(path, cls)
    check_sidecar(artifact, path)
    return artifact


def check_sidecar(artifact: BaseModel, artifact_path: str | Path) -> None:
    """The artifact's sidecar (and each of its channel tracks' sidecars) is there with the sha256 recorded."""
    for track in getattr(artifact, "channel_tracks", None) or []:
        _check_sidecar_file(track.sidecar, track.sha256, artifact_path)
    _check_sidecar_file(getattr(artifact, "sidecar", None), getattr(artifact, "sha256", None), artifact_path)


def _check_sidecar_file(sidecar: str | None, expected: str | None, artifact_path: str | Path) -> None:
    if sidecar is None or expected is None:
        return
    data_path = os.path.join(os.path.dirname(artifact_path), sidecar)  # text: a resume checks a corpus's
    if not os.path.isfile(data_path):
        raise ArtifactError(Path(data_path), f"sidecar of {os.path.basename(artifact_path)} is missing")
    actual = sha256_file(data_path)
    if actual != expected:
        raise ArtifactError(
            Path(data_path),
            f"sha256 {actual[:12]}… does not match {expected[:12]}… recorded in {os.path.basename(artifact_path)}",
        )


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err.get("loc", ())) or "<root>"
    extra = f" (+{exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"{where}: {err.get('msg')}{extra}"
