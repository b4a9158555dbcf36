"""Inputs and outputs at fsspec URLs (``file://``, ``s3://``, ``sftp://``, ``memory://``, ...).

Stages only ever see local paths: the parent fetches a URL input into the
input's scratch directory (``OUT/<id>/.work/``, on the shared storage every
node sees) just before its audio stage, and uploads each finished input's
outputs to the output URL. The download runs in a spawned process the parent
watches (:func:`fetch`): it fails alone, in one line, when it stalls, overruns
its deadline or grows beyond the size limit (the ``remote_*`` settings).
A protocol's own package must be installed (``s3fs`` for ``s3://``, ``sshfs``
for ``sftp://``); fsspec names the one missing. Credentials come from the
protocol's usual places (environment, ``~/.aws``, ``~/.ssh``), never from this
project's settings.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit

from contracts.errors import DiskFullError, InputError
from contracts.io import is_disk_full

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

    try:  # listing and identifying at planning, and uploads, are bounded by the protocol timeouts too
        return fsspec.core.url_to_fs(url, **_PLANNING.protocol_options(_protocol(url)))
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
    return [base + p[len(root) :] for p in found if p.startswith(root)] or [url]


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
    version = next(
        (
            str(info[k])
            for k in ("ETag", "etag", "mtime", "LastModified", "last_modified", "created")
            if info.get(k) is not None
        ),
        "",
    )
    return f"{without_credentials(url)}:{info.get('size')}:{version}"


def url_suffix(url: str) -> str:
    """The file suffix of a URL's path (".mp4"), lower case; "" without one."""
    return _url_path(url).suffix.lower()


@dataclass(frozen=True)
class FetchLimits:
    """How big a URL input may be and how long its download may take (the ``remote_*`` settings)."""

    max_bytes: int
    connect_timeout_s: float
    #: no byte for this long: the download stalled
    read_timeout_s: float
    #: the whole download may take ``floor_s`` plus ``per_mb_s`` per MB of its size
    floor_s: float
    per_mb_s: float

    @classmethod
    def from_settings(cls, settings) -> FetchLimits:
        return cls(
            settings.remote_max_bytes,
            settings.remote_connect_timeout_s,
            settings.remote_read_timeout_s,
            settings.remote_deadline_floor_s,
            settings.remote_deadline_per_mb_s,
        )

    def deadline_s(self, size: int | None, received: int) -> float:
        """Seconds the download may take: from the size the server gave, or (none given) from what came so far."""
        return self.floor_s + self.per_mb_s * max(size or 0, received) / 1e6

    def protocol_options(self, protocol: str) -> dict:
        """The connect / read timeouts in the words of ``protocol``'s fsspec filesystem (none for the others:
        the parent's stall check still holds for them)."""
        if protocol in ("http", "https"):
            import aiohttp

            # total=None: aiohttp's default (300 s) would cut every download longer than 5 minutes
            return {
                "client_kwargs": {
                    "timeout": aiohttp.ClientTimeout(
                        total=None,
                        connect=self.connect_timeout_s,
                        sock_connect=self.connect_timeout_s,
                        sock_read=self.read_timeout_s,
                    )
                }
            }
        if protocol in ("s3", "s3a"):
            return {
                "config_kwargs": {
                    "connect_timeout": self.connect_timeout_s,
                    "read_timeout": self.read_timeout_s,
                }
            }
        if protocol in ("sftp", "ssh"):
            return {"timeout": self.connect_timeout_s}
        if protocol == "ftp":
            return {"timeout": self.connect_timeout_s}
        return {}


#: the connect / read timeouts of the parent's own calls (listing a URL folder, a source's size and etag at
#: planning, uploads): the settings' defaults (planning runs before a run's settings reach this module)
_PLANNING = FetchLimits(max_bytes=0, connect_timeout_s=30.0, read_timeout_s=60.0, floor_s=0.0, per_mb_s=0.0)


def _size(value: float) -> str:
    return f"{value / 1e6:,.1f} MB"


def fetch(url: str, target: Path, limits: FetchLimits, cancelled: Callable[[], bool] | None = None) -> Path:
    """Download ``url`` to ``target`` atomically (nothing is left half-written), within ``limits``.

    The download runs in a spawned process (it imports fsspec and the protocol's package, never torch)
    that this one watches: it is stopped when no byte arrives for ``read_timeout_s``, when it takes
    longer than its deadline, when it grows beyond ``max_bytes``, or when ``cancelled()`` turns true
    (the run is stopping). A blocked socket read cannot hang the run. ``memory://`` (its files live in
    this process) is copied here, with the same size limit. Every failure is an :class:`InputError`
    in one line, without credentials.
    """
    directory = target.parent
    directory.mkdir(parents=True, exist_ok=True)
    partial = directory / f".{target.name}.partial"
    status = directory / f".{target.name}.fetch.json"
    try:
        if _protocol(url) == "memory":
            _download(url, partial, limits)
        else:
            _watch(url, partial, status, limits, cancelled)
        os.replace(partial, target)
    except Exception as exc:  # noqa: BLE001 - any protocol's failure: this input fails alone, in one line
        reason = str(exc) if isinstance(exc, InputError) else _failure(exc, limits)
        if is_disk_full(exc) or _full(directory):  # not the input's fault: the run stops, a rerun resumes
            raise DiskFullError(
                f"no space left fetching {redact(url)} into {directory}: {_without_password(reason, url)}"
            ) from None
        raise InputError(f"could not fetch {redact(url)}: {_without_password(reason, url)}") from None
    finally:
        partial.unlink(missing_ok=True)
        status.unlink(missing_ok=True)
    log.info("fetched %s (%s)", redact(url), _size(target.stat().st_size))
    return target


def _full(directory: Path) -> bool:
    """Whether ``directory``'s filesystem has less than a read's worth of space left (the downloader process
    may not have been able to say why it failed: its status file is on the same disk)."""
    try:
        return shutil.disk_usage(directory).free < _CHUNK
    except OSError:
        return False


def _without_password(text: str, url: str) -> str:
    """``text`` (a protocol's error, which may quote the URL) with the URL's password as ``***``."""
    try:
        password = urlsplit(url).password
    except ValueError:
        password = None
    return text.replace(password, "***") if password else text


def _protocol(url: str) -> str:
    return url.partition("://")[0].lower()


#: seconds a fresh downloader process may take to start (an interpreter importing fsspec), not counted as a stall
_START_S = 120.0
_POLL_S = 0.2


def _watch(
    url: str, partial: Path, status: Path, limits: FetchLimits, cancelled: Callable[[], bool] | None
) -> None:
    """Run the download in a spawned process and stop it when it stalls, overruns or is cancelled."""
    from orchestrator.process.toolkit import spawn, stop

    status.unlink(missing_ok=True)
    partial.unlink(missing_ok=True)
    proc = spawn(
        "orchestrator.run.remote:download_main", (url, str(partial), str(status), limits), name="fetch"
    )
    try:
        began = last = time.monotonic()
        received, said = 0, None
        while True:
            proc.join(_POLL_S)
            now = time.monotonic()
            told = _read_status(status)
            if told != said:  # started, connected, or finished
                said, last = told, now
            size = partial.stat().st_size if partial.exists() else 0
            if size > received:
                received, last = size, now
            if proc.exitcode is not None:
                break
            if said is None:  # the interpreter is still starting
                silence_limit = _START_S
            elif "size" not in said:  # connecting
                silence_limit = limits.connect_timeout_s + limits.read_timeout_s
            else:
                silence_limit = limits.read_timeout_s
            if now - last > silence_limit:
                raise InputError(
                    f"stalled: no data for {silence_limit:g} s, {_size(received)} received "
                    "(PIPELINE_REMOTE_READ_TIMEOUT_S)"
                )
            deadline = limits.deadline_s((said or {}).get("size"), received)
            if now - began > deadline:
                raise InputError(
                    f"timed out: not done within {deadline:.0f} s, {_size(received)} received "
                    "(PIPELINE_REMOTE_DEADLINE_FLOOR_S / _PER_MB_S)"
                )
            if received > limits.max_bytes:  # the child stops itself there; this is in case it does not
                raise InputError(_too_large(limits))
            if cancelled is not None and cancelled():
                raise InputError("interrupted: the run is stopping")
    finally:
        if proc.exitcode is None:
            stop(proc, grace_s=1.0)
    said = _read_status(status) or {}
    if proc.exitcode != 0 or "done" not in said:
        raise InputError(said.get("error") or f"the download process ended with exit status {proc.exitcode}")


def _read_status(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _write_status(path: Path, **fields) -> None:
    temp = path.with_name(path.name + ".tmp")
    temp.write_text(json.dumps(fields))
    os.replace(temp, path)


def download_main(url: str, partial: str, status: str, limits: FetchLimits) -> None:
    """The downloader process (spawned by :func:`fetch`): says when it starts, the size the server gives
    and how it ended in the ``status`` file; exit status 0 when the download is complete."""
    path = Path(status)
    _write_status(path)
    try:
        _download(url, Path(partial), limits, on_size=lambda size: _write_status(path, size=size))
    except InputError as exc:
        _write_status(path, error=str(exc))
        sys.exit(1)
    except Exception as exc:  # noqa: BLE001 - any protocol's failure, in one line
        _write_status(path, error=_failure(exc, limits))
        sys.exit(1)
    _write_status(path, done=True)


#: bytes read at a time: the stall check sees progress at least this often
_CHUNK = 1024 * 1024


def _download(
    url: str, partial: Path, limits: FetchLimits, on_size: Callable[[int | None], None] | None = None
) -> None:
    """Copy ``url`` to ``partial`` in chunks, failing once it is larger than ``limits.max_bytes``."""
    import fsspec

    fs, path = fsspec.core.url_to_fs(url, **limits.protocol_options(_protocol(url)))
    size = fs.info(path).get("size")
    if size is not None and size > limits.max_bytes:
        raise InputError(f"it is {_size(size)}, " + _too_large(limits))
    if on_size is not None:
        on_size(size)
    # block_size=0: over http(s), one streamed GET instead of range requests
    options = {"block_size": 0} if _protocol(url) in ("http", "https") else {}
    written = 0
    with fs.open(path, "rb", **options) as source, open(partial, "wb") as sink:
        while chunk := source.read(_CHUNK):
            written += len(chunk)
            if written > limits.max_bytes:
                raise InputError(_too_large(limits))
            sink.write(chunk)
            sink.flush()


def _too_large(limits: FetchLimits) -> str:
    return f"larger than the limit of {_size(limits.max_bytes)} (PIPELINE_REMOTE_MAX_BYTES)"


def _failure(exc: BaseException, limits: FetchLimits) -> str:
    """One line for a protocol's failure; a protocol's own timeout says which setting it was."""
    what = f"{type(exc).__name__}: {_line(exc)}" if _line(exc) else type(exc).__name__
    if isinstance(exc, TimeoutError):
        return (
            f"timed out: no connection within {limits.connect_timeout_s:g} s or no data for "
            f"{limits.read_timeout_s:g} s (PIPELINE_REMOTE_CONNECT_TIMEOUT_S / _READ_TIMEOUT_S): {what}"
        )
    return what


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
