"""Entry point of a stage child: read the request, run the stage, exit with a named code.

Started by the orchestrator through ``multiprocess``'s spawn context (a fresh
interpreter, so a fresh CUDA context), or by hand for debugging::

    python -m stages.runtime.child REQUEST.json [LOG_FILE]
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from importlib import import_module

from contracts import ExitCode, StageRequest, load_model, save_model
from contracts.errors import ArtifactError
from contracts.io import is_disk_full
from contracts.jsonl import append_line
from stages.runtime.base import Stage
from stages.runtime.memory import configure_heap, is_oom
from stages.runtime.noise import quiet_libraries

log = logging.getLogger("stages.runtime.child")

LOG_FORMAT = "%(levelname)s %(name)s: %(message)s"


def main(
    request_path: str,
    log_path: str | None = None,
    warm_module: str | None = None,
    warm_env: dict[str, str] | None = None,
) -> None:
    """Run one stage request and leave the process with an :class:`ExitCode`.

    With ``warm_module``, apply ``warm_env`` (the environment the request will carry), import
    that stage's libraries and then wait for the request file to appear (the parent writes
    it when the previous stage is done). The environment comes first: some libraries read
    theirs once, on import (huggingface_hub's ``HF_HUB_OFFLINE``: imported ahead without it,
    an offline run's hub lookups would go to the network and retry).
    """
    bootstrap(log_path)
    ahead = None
    if warm_module:
        os.environ.update(warm_env or {})
        configure_heap()  # before the libraries' threads exist
        ahead = _import_ahead(warm_module, request_path)
    leave(run_request(request_path, ahead))


def bootstrap(log_path: str | None) -> None:
    """What every child of this project does first: ignore Ctrl-C, send its output to ``log_path``,
    log in the format the parent re-logs (``LEVEL name: message``)."""
    # Ctrl-C in a terminal reaches the whole process group; the parent decides what
    # happens (it asks for a graceful stop with the request's stop file, or kills).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # past a file size limit (RLIMIT_FSIZE) a write fails with EFBIG, which fails the item, instead of
    # the default SIGXFSZ, which would kill the child with every item of its chunk
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    if log_path:
        redirect_output(log_path)
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT, stream=sys.stderr, force=True)
    quiet_libraries()


def leave(code: ExitCode) -> None:
    """End the child with ``code``, flushing logs but skipping interpreter teardown: results are already
    fsynced, and torch / CUDA teardown can take seconds; the OS reclaims all memory (and the GPU driver
    the whole CUDA context) when the process ends."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(int(code))


def _import_ahead(module: str, request_path: str) -> tuple[float, float]:
    """Import ``module``'s stage libraries, then wait for the request; returns the import's (seconds, when it
    ended in seconds since the epoch), which the stage reports as its import."""
    started = time.perf_counter()
    import_module(module).STAGE.import_libraries()  # no model, no CUDA context yet
    seconds, done = time.perf_counter() - started, time.time()
    log.info("%s: imported ahead in %.2fs, waiting for the request", module, seconds)
    while not os.path.exists(request_path):  # written atomically: present means complete
        time.sleep(0.02)
    return seconds, done


def run_request(request_path: str, imported_ahead: tuple[float, float] | None = None) -> ExitCode:
    try:
        request = load_model(request_path, StageRequest)
    except ArtifactError as exc:
        log.error("bad request: %s", exc)
        return ExitCode.CONTRACT_ERROR
    os.environ.update(request.env)
    heap = configure_heap()  # a warm child did it on arrival; this is the cold child's first chance
    log.info(
        "%s: pid %d, attempt %d, %d item(s), batch size %d, heap %s",
        request.stage,
        os.getpid(),
        request.attempt,
        len(request.items),
        request.batch_size,
        heap,
    )
    try:
        stage = import_module(request.module).STAGE
        if not isinstance(stage, Stage):
            raise TypeError(f"{request.module}.STAGE is not a Stage")
        result = stage.run(
            request, on_item=_progress_writer(request.progress_path), imported_ahead=imported_ahead
        )
        save_model(result, request.result_path)
    except BaseException as exc:  # noqa: BLE001 - every way out becomes an exit code
        return exit_code_for(exc, request.stage)
    failed = sum(not item.ok for item in result.items)
    log.info("%s: finished, %d ok, %d failed", request.stage, len(result.items) - failed, failed)
    return ExitCode.INTERRUPTED if result.stopped == "interrupted" else ExitCode.OK


def _progress_writer(path: str | None):
    """Append each finished item as one JSON line (the parent follows the file)."""
    if not path:
        return None

    def write(item) -> None:
        append_line(path, item)

    return write


def exit_code_for(exc: BaseException, stage: str) -> ExitCode:
    """Log ``exc`` and name the exit code that tells the parent what happened."""
    if isinstance(exc, KeyboardInterrupt):
        log.warning("%s: interrupted", stage)
        return ExitCode.INTERRUPTED
    if is_oom(exc):
        log.error("%s: out of memory: %s", stage, " ".join(str(exc).split())[:300])
        return ExitCode.OOM
    if is_disk_full(exc):  # before the artifact check: the parent stops the run, nothing fails
        log.error("%s: disk full: %s", stage, " ".join(str(exc).split())[:300])
        return ExitCode.DISK_FULL
    if isinstance(exc, ArtifactError):
        log.error("%s: contract error: %s", stage, exc)
        return ExitCode.CONTRACT_ERROR
    log.exception("%s: failed: %s", stage, exc)
    return ExitCode.FAILED


def redirect_output(log_path: str) -> None:
    """Send this process's stdout and stderr (also native libraries' output) to ``log_path``."""
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(line_buffering=True)
        except (AttributeError, ValueError):
            pass


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        sys.exit(ExitCode.USAGE)
    main(*sys.argv[1:])
