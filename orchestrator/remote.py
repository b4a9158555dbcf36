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
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from urllib.parse import unquote_plus

from contracts.errors import DiskFullError, InputError, SettingsError
from contracts.io import is_disk_full

log = logging.getLogger(__name__)


def is_url(value: str | Path) -> bool:
    """``proto://...`` (a local path, even one with ``:`` in it, is not)."""
    if isinstance(value, Path):
        return False
    scheme, sep, _ = str(value).partition("://")
    return bool(sep) and scheme.replace("+", "").replace("-", "").isalnum()


#: query parameters that sign or authenticate a URL (names compared in lower case), never part of its
#: identity nor shown: AWS SigV2/SigV4, GCS, CloudFront, Azure SAS and the generic tokens and keys.
#: ``PIPELINE_REMOTE_SECRET_PARAMS`` adds names
SECRET_PARAMS = frozenset(
    {
        # AWS SigV2 (SigV4's X-Amz-* are every "x-amz-" name) and GCS V2 (V4: every "x-goog-" name)
        "awsaccesskeyid",
        "googleaccessid",
        "signature",
        # Azure SAS (its other fields count when "sig" is there: SIGNED_WITH)
        "sig",
        # generic
        "token",
        "access_token",
        "id_token",
        "refresh_token",
        "auth",
        "auth_token",
        "authorization",
        "key",
        "api_key",
        "apikey",
        "api-key",
        "x-api-key",
        "password",
        "passwd",
        "secret",
        "client_secret",
        "credential",
        "credentials",
        "session_token",
        "security_token",
    }
)
#: query parameters whose names start so are secret (AWS SigV4's and GCS V4's signing fields)
SECRET_PREFIXES = ("x-amz-", "x-goog-")
#: fields of a signature that change with each signing, secret when their signature is in the query too
#: (alone, ``st=30`` or ``expires=...`` may be what the URL is about)
SIGNED_WITH = {
    "sig": frozenset(
        "sv ss srt sp se st spr sr si sip sdd skoid sktid skt ske sks skv saoid suoid scid ses".split()
    ),
    "signature": frozenset({"expires", "policy", "key-pair-id"}),
}

#: names added by the ``remote_secret_params`` setting (lower case; one ending in "*" is a prefix)
_extra_secret: frozenset[str] = frozenset()


def _split(url: str) -> tuple[str, str | None, str, str, str]:
    """``(scheme, userinfo or None, host and path, query, fragment)`` of ``proto://user:pw@host/path?q#f``.

    The userinfo ends at the authority's last ``@``, so a password may hold ``@`` and ``:``; one that holds
    ``/`` (which should be written ``%2F``) is found too: an authority ``user:pa`` whose "port" is no number
    runs to the next ``@``."""
    scheme, _, tail = url.partition("://")
    end = min((i for i in (tail.find(c) for c in "/?#") if i != -1), default=len(tail))
    authority = tail[:end]
    userinfo = None
    if "@" in authority:
        at = authority.rindex("@")
        userinfo, tail = tail[:at], tail[at + 1 :]
    elif ":" in authority and not authority.startswith("["):
        port = authority.rpartition(":")[2]
        at = tail.find("@", end)
        if at != -1 and port and not port.isdigit():
            # the host is what follows the last "@" before the next "/" (the password may hold "@" too)
            host_end = min((i for i in (tail.find(c, at) for c in "/?#") if i != -1), default=len(tail))
            at = tail.rindex("@", at, host_end)
            userinfo, tail = tail[:at], tail[at + 1 :]
    tail, _, fragment = tail.partition("#")
    rest, _, query = tail.partition("?")
    return scheme, userinfo, rest, query, fragment


def _secret_names(query: str) -> set[str]:
    """The names of ``query``'s parameters (``a=1&b=2``) that are credentials."""
    names = [unquote_plus(part.partition("=")[0]).lower() for part in query.split("&") if part]
    secret = {
        n
        for n in names
        if n in SECRET_PARAMS
        or n.startswith(SECRET_PREFIXES)
        or n in _extra_secret
        or any(p.endswith("*") and n.startswith(p[:-1]) for p in _extra_secret)
    }
    for signature, fields in SIGNED_WITH.items():
        if signature in secret:
            secret.update(n for n in names if n in fields)
    return secret


def _rebuild(url: str, password: str | None, value: str | None) -> str:
    """``url`` with its password shown as ``password`` (None: no userinfo at all) and each secret query
    parameter's value as ``value`` (None: the parameter left out)."""
    if "://" not in url:
        return url
    scheme, userinfo, rest, query, fragment = _split(url)
    head = f"{scheme}://"
    if userinfo is not None and password is not None:
        user, colon, _ = userinfo.partition(":")
        head += f"{user}:{password}@" if colon else f"{user}@"
    if query:
        secret = _secret_names(query)
        kept = []
        for part in query.split("&"):
            name = part.partition("=")[0]
            if unquote_plus(name).lower() not in secret:
                kept.append(part)
            elif value is not None:
                kept.append(f"{name}={value}")
        query = "&".join(kept)
    return head + rest + (f"?{query}" if query else "") + (f"#{fragment}" if fragment else "")


def redact(url: str) -> str:
    """The URL as logs, errors and reports show it: its password and the values of its signing or
    authenticating query parameters as ``***`` (``sftp://user:***@host/x``, ``https://h/a.wav?X-Amz-Signature=***``)."""
    try:
        return _rebuild(url, "***", "***")
    except Exception:  # noqa: BLE001 - never let a log line fail; show nothing of it rather than a secret
        return url.partition("://")[0] + "://***"


def without_credentials(url: str) -> str:
    """The URL with no user name, password or signing / authenticating query parameter
    (``sftp://alice:secret@host/x`` -> ``sftp://host/x``; ``https://h/a.wav?X-Amz-Signature=...`` ->
    ``https://h/a.wav``): what identifies a remote source across runs, in ids, the index, the journal
    and fingerprints. A password change or a new signature is not a new source."""
    return _rebuild(url, None, None)


#: a URL inside free text (a library's log line, an error)
_URL_IN_TEXT = re.compile(r"[a-zA-Z][\w+.-]*://[^\s'\"<>]+")


def redact_text(text: str) -> str:
    """``text`` with every URL in it redacted, and any ``?name=value`` or ``&name=value`` of a secret query
    parameter (a query string quoted without its URL) as ``name=***``."""
    text = _URL_IN_TEXT.sub(lambda m: redact(m.group(0)), text)
    return re.sub(
        r"(?<=[?&])([\w.-]+)=([^&\s'\"]+)",
        lambda m: f"{m.group(1)}=***" if m.group(2) != "***" and _secret_names(m.group(1)) else m.group(0),
        text,
    )


class RedactFilter(logging.Filter):
    """Rewrites a log record's message with :func:`redact_text` (the libraries we call log URLs, with their
    passwords and signatures, at debug level)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed record is the logging module's to report
            return True
        clean = redact_text(message)
        if clean != message:
            record.msg, record.args = clean, ()
        return True


#: the loggers of the libraries the URL inputs go through (a logger's filter does not see its children's
#: records: their known children are listed; the CLI's handlers redact every record too)
LIBRARY_LOGGERS = (
    "fsspec",
    "fsspec.http",
    "fsspec.asyn",
    "fsspec.spec",
    "fsspec.cached",
    "s3fs",
    "sshfs",
    "asyncssh",
    "asyncssh.sftp",
    "aiohttp",
    "aiohttp.client",
    "aiohttp.internal",
    "httpx",
    "httpcore",
    "httpcore.connection",
    "httpcore.http11",
    "botocore",
    "botocore.endpoint",
    "botocore.auth",
    "botocore.hooks",
    "botocore.httpsession",
    "botocore.parsers",
    "botocore.retryhandler",
    "aiobotocore",
    "urllib3",
    "urllib3.connectionpool",
)
_FILTER = RedactFilter()


def redact_logs(handlers: list[logging.Handler] | None = None) -> None:
    """Redact the library loggers' records (and every record of ``handlers``); idempotent."""
    for target in [*(logging.getLogger(n) for n in LIBRARY_LOGGERS), *(handlers or [])]:
        if _FILTER not in target.filters:
            target.addFilter(_FILTER)


redact_logs()


def configure(settings) -> None:
    """Take a run's ``remote_*`` settings: the timeouts of planning's own calls (listing, size and etag) and
    the extra secret query parameters. Planning a URL that timed out is forgotten."""
    global _PLANNING, _extra_secret
    _PLANNING = FetchLimits.from_settings(settings)
    _extra_secret = frozenset(n.strip().lower() for n in settings.remote_secret_params if n.strip())
    _timed_out.clear()


def _fs(url: str):
    import fsspec

    try:  # listing and identifying at planning, and uploads, are bounded by the protocol timeouts too
        return fsspec.core.url_to_fs(url, **_PLANNING.protocol_options(_protocol(url)))
    except Exception as exc:  # noqa: BLE001 - a missing protocol package, a malformed URL, a refused login
        raise InputError(f"cannot open {redact(url)}: {type(exc).__name__}: {_line(exc)}") from None


def filesystem(url: str):
    """``(fsspec filesystem, path)`` of ``url``, opened with the protocol's timeouts (an :class:`InputError`
    that says why when it cannot be opened)."""
    return _fs(url)


def _line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300]


#: URLs (without credentials) whose planning call timed out, and when: their other calls are not made
#: again (a host that never answers costs one timeout per plan, not one per call)
_timed_out: dict[str, float] = {}
#: how long a timed-out URL is not asked again
_TIMED_OUT_KEEP_S = 300.0


class PlanningTimeoutError(TimeoutError):
    """A planning call (listing a URL, its size and version) did not end within the remote timeouts
    (``again``: an earlier call about the URL did not, and this one was not made)."""

    def __init__(self, reason: str, again: bool = False) -> None:
        super().__init__(reason)
        self.again = again


def _planning_limit_s() -> float:
    """The longest a planning call may take: the connect timeout and the read timeout."""
    return _PLANNING.connect_timeout_s + _PLANNING.read_timeout_s


def _planning_call(url: str, call: Callable[[], object]):
    """``call()`` (one planning call about ``url``), given up after :func:`_planning_limit_s`: the protocol's
    own timeouts bound each request, and this bounds the whole call (retries, a HEAD then a GET, a protocol
    with no read timeout). A call given up goes on in a daemon thread until its protocol ends it."""
    key = without_credentials(url)
    since = _timed_out.get(key)
    if since is not None and time.monotonic() - since < _TIMED_OUT_KEEP_S:
        raise PlanningTimeoutError(_timeout_reason(), again=True)
    box: list = []

    def run() -> None:
        try:
            box.append((True, call()))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            box.append((False, exc))

    worker = threading.Thread(target=run, name="plan-url", daemon=True)
    worker.start()
    worker.join(_planning_limit_s())
    if not box:
        _timed_out[key] = time.monotonic()
        raise PlanningTimeoutError(_timeout_reason())
    ok, value = box[0]
    if ok:
        return value
    if _is_timeout(value):
        _timed_out[key] = time.monotonic()
        raise PlanningTimeoutError(_timeout_reason()) from None
    raise value


def _is_timeout(exc: BaseException | None) -> bool:
    """Whether ``exc`` or one it was raised from is a timeout (fsspec's http gives a FileNotFoundError)."""
    while exc is not None:
        if isinstance(exc, TimeoutError):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _timeout_reason() -> str:
    return (
        f"timed out: no answer within {_PLANNING.connect_timeout_s:g} s to connect and "
        f"{_PLANNING.read_timeout_s:g} s to read (PIPELINE_REMOTE_CONNECT_TIMEOUT_S / _READ_TIMEOUT_S)"
    )


def expand_url(url: str, suffixes: frozenset[str]) -> list[str]:
    """A URL of a file stays as it is (a missing one fails alone later); a "directory" gives its media files.
    Bounded by the remote timeouts: a host that does not answer leaves the URL as it is, with a warning."""

    def listing() -> list[str] | None:
        fs, path = _fs(url)
        if not fs.isdir(path):
            return None
        found = sorted(p for p in fs.find(path) if PurePosixPath(p).suffix.lower() in suffixes)
        return [path, *found]

    try:
        result = _planning_call(url, listing)
    except InputError:
        return [url]
    except Exception as exc:  # noqa: BLE001 - listing failed: the URL stays as it is and fails alone
        log.warning("cannot list %s: %s", redact(url), _line(exc))
        return [url]
    if result is None:
        return [url]
    path, *found = result
    # keep the URL's own prefix (host, port, user of sftp://; bucket of s3://) for each file below it
    base, root = url.split("?", 1)[0].rstrip("/"), path.rstrip("/")
    return [base + p[len(root) :] for p in found if p.startswith(root)] or [url]


def _url_path(url: str) -> PurePosixPath:
    """The path part of a URL (after ``proto://``, before any ``?query``)."""
    return PurePosixPath(url.split("://", 1)[-1].split("?", 1)[0])


def url_stem(url: str) -> str:
    return _url_path(url).stem


def url_identity(url: str) -> str:
    """What the first stage's fingerprint hangs on: the URL without credentials and its size and version
    (etag/mtime). Bounded by the remote timeouts; an unreadable URL says so (its fetch will say why)."""
    try:
        info = _planning_call(url, lambda: _info(url))
    except Exception as exc:  # noqa: BLE001 - unreadable now: the first stage will say why
        if isinstance(exc, PlanningTimeoutError) and not exc.again:
            log.warning("cannot read %s: %s", redact(url), _line(exc))
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


def _info(url: str) -> dict:
    fs, path = _fs(url)
    return fs.info(path)


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
    """``text`` (a protocol's error, which may quote the URL) with the URL's password and the values of its
    secret query parameters as ``***``, and any URL in it redacted."""
    secrets = set()
    try:
        _, userinfo, _, query, _ = _split(url)
    except ValueError:
        userinfo, query = None, ""
    if userinfo and ":" in userinfo:
        password = userinfo.partition(":")[2]
        secrets.update({password, unquote_plus(password)})
    names = _secret_names(query)
    for part in query.split("&"):
        name, _, value = part.partition("=")
        if unquote_plus(name).lower() in names and value:
            secrets.update({value, unquote_plus(value)})
    for secret in sorted(filter(None, secrets), key=len, reverse=True):
        text = text.replace(secret, "***")
    return redact_text(text)


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
    proc = spawn("orchestrator.remote:download_main", (url, str(partial), str(status), limits), name="fetch")
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
    cause, seen = exc, 0
    while cause is not None and not isinstance(cause, TimeoutError) and seen < 10:
        # fsspec's http file system answers a HEAD that timed out with FileNotFoundError from the timeout
        cause, seen = cause.__cause__ or cause.__context__, seen + 1
    if isinstance(cause, TimeoutError):
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


def check_writable(url: str) -> None:
    """Before a run: write and remove an empty file in the output URL's "directory" (within the protocol's
    timeouts), so a URL that cannot be written is a :class:`SettingsError` now, not after every stage ran."""
    fs, root = _fs(url)
    probe = f"{root.rstrip('/')}/.isostage-write-check-{os.getpid()}"
    try:
        fs.makedirs(root, exist_ok=True)
        fs.pipe_file(probe, b"")
        fs.rm_file(probe)
    except Exception as exc:  # noqa: BLE001 - whatever the protocol raises, the run cannot deliver there
        raise SettingsError(
            f"cannot write to the output URL {redact(url)}: {type(exc).__name__}: {_line(exc)}"
        ) from None


def staging_dir(url: str, base: Path) -> Path:
    """The local (shared) directory a URL output is built in: the same for the same URL (whatever its
    credentials), so reruns resume."""
    return base / hashlib.sha1(without_credentials(url).encode()).hexdigest()[:16]
