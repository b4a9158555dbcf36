"""Inputs and outputs at fsspec URLs (``file://``, ``s3://``, ``sftp://``, ``memory://``, ...).

Stages only ever see local paths: the parent fetches a URL input into the
input's scratch directory (``OUT/<id>/.work/``, on the shared storage every
node sees) just before its audio stage, and uploads each finished input's
outputs to the output URL. A protocol's own package must be installed
(``s3fs`` for ``s3://``, ``sshfs`` for ``sftp://``); fsspec names the one
missing. Credentials come from the protocol's usual places (environment,
``~/.aws``, ``~/.ssh``), never from this project's settings.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from pathlib import Path, PurePosixPath

from contracts.errors import InputError

log = logging.getLogger(__name__)


def is_url(value: str | Path) -> bool:
    """``proto://...`` (a local path, even one with ``:`` in it, is not)."""
    text = str(value)
    scheme, sep, _ = text.partition("://")
    return bool(sep) and scheme.replace("+", "").replace("-", "").isalnum() and not isinstance(value, Path)


def redact(url: str) -> str:
    """The URL with any password replaced (``sftp://user:***@host/...``): for logs, errors and reports."""
    return re.sub(r"^([a-zA-Z][\w+.-]*://[^/@:]*):[^/@]*@", r"\1:***@", url)


def without_credentials(url: str) -> str:
    """The URL with no user name or password (``sftp://alice:secret@host/x`` -> ``sftp://host/x``): what
    identifies a remote source across runs, in ids, the index, the journal and fingerprints. A password
    change is not a new source."""
    return re.sub(r"^([a-zA-Z][\w+.-]*://)[^/@]*@", r"\1", url)


def _fs(url: str):
    import fsspec

    try:
        return fsspec.core.url_to_fs(url)
    except Exception as exc:  # noqa: BLE001 - a missing protocol package, a malformed URL, a refused login
        raise InputError(f"cannot open {redact(url)}: {type(exc).__name__}: {_line(exc)}") from None


def _line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300]


def expand_url(url: str, suffixes: frozenset[str]) -> list[str]:
    """A URL of a file stays as it is (a missing one fails alone later); a "directory" gives its media files."""
    try:
        fs, path = _fs(url)
        if not fs.isdir(path):
            return [url]
        found = sorted(p for p in fs.find(path) if PurePosixPath(p).suffix.lower() in suffixes)
    except InputError:
        return [url]
    except Exception as exc:  # noqa: BLE001 - listing failed: the URL stays as it is and fails alone
        log.warning("cannot list %s: %s", redact(url), _line(exc))
        return [url]
    # keep the URL's own prefix (host, port, user of sftp://; bucket of s3://) for each file below it
    base, root = url.split("?", 1)[0].rstrip("/"), path.rstrip("/")
    return [base + p[len(root):] for p in found if p.startswith(root)] or [url]


def _url_path(url: str) -> PurePosixPath:
    """The path part of a URL (after ``proto://``, before any ``?query``)."""
    return PurePosixPath(url.split("://", 1)[-1].split("?", 1)[0])


def url_stem(url: str) -> str:
    return _url_path(url).stem


def url_identity(url: str) -> str:
    """What the first stage's fingerprint hangs on: the URL and its size and version (etag/mtime)."""
    try:
        fs, path = _fs(url)
        info = fs.info(path)
    except Exception as exc:  # noqa: BLE001 - unreadable now: the first stage will say why
        return f"unreadable:{without_credentials(url)}:{type(exc).__name__}"
    version = next((str(info[k]) for k in ("ETag", "etag", "mtime", "LastModified", "last_modified", "created")
                    if info.get(k) is not None), "")
    return f"{without_credentials(url)}:{info.get('size')}:{version}"


def url_suffix(url: str) -> str:
    """The file suffix of a URL's path (".mp4"), lower case; "" without one."""
    return _url_path(url).suffix.lower()


def fetch(url: str, target: Path) -> Path:
    """Download ``url`` to ``target`` atomically (nothing is left half-written)."""
    directory = target.parent
    directory.mkdir(parents=True, exist_ok=True)
    partial = directory / f".{target.name}.partial"
    try:
        fs, path = _fs(url)
        fs.get_file(path, str(partial))
        os.replace(partial, target)
    except InputError:
        raise
    except Exception as exc:  # noqa: BLE001 - any protocol's failure: this input fails alone, in one line
        partial.unlink(missing_ok=True)
        raise InputError(f"could not fetch {redact(url)}: {type(exc).__name__}: {_line(exc)}") from None
    log.info("fetched %s (%.1f MB)", redact(url), target.stat().st_size / 1e6)
    return target


def upload(files: list[Path], url: str) -> None:
    """Copy ``files`` into the URL "directory" ``url`` (each written whole by the protocol: no partial reads)."""
    fs, root = _fs(url)
    fs.makedirs(root, exist_ok=True)
    for path in files:
        fs.put_file(str(path), f"{root.rstrip('/')}/{path.name}")


def staging_dir(url: str, base: Path) -> Path:
    """The local (shared) directory a URL output is built in: the same for the same URL (whatever its
    credentials), so reruns resume."""
    return base / hashlib.sha1(without_credentials(url).encode()).hexdigest()[:16]
