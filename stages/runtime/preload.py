"""Imported once by the fork server (``PIPELINE_START_METHOD=forkserver``): every stage's libraries, no model.

The fork server is a fresh interpreter the orchestrator starts (never the orchestrator itself, which imports
no torch); it imports this module, then forks each stage child from itself, so a child starts with torch,
whisperx, pyannote, sentence-transformers, ... already imported and skips seconds of imports. Nothing here
may touch a GPU: importing torch creates no CUDA context (``torch.cuda.is_initialized()`` stays False: the tests
check it in the server and in a child), and each child creates its own when its stage loads its model.

A library that fails to import is left to the child (it imports it again and fails or falls back as it
would without the fork server); nothing raised here may stop the server.
"""

from __future__ import annotations

import os
from importlib import import_module

#: the stage modules whose ``import_libraries()`` the server runs (the pipeline's and ``speakers``' stages)
STAGE_MODULES = (
    "stages.audio",
    "stages.asr",
    "stages.diarization",
    "stages.enrollment",
    "stages.alignment",
    "stages.embeddings",
    "stages.voice_profile",
)

#: what failed to import, by module (a child imports it again and reports it in its own log)
failed: dict[str, str] = {}


def preload() -> None:
    """Import every stage's libraries in this process (the fork server), quietly."""
    # the server shares the parent's terminal: its import-time chatter would reach the console
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    os.close(devnull)
    from stages.runtime.noise import quiet_libraries

    quiet_libraries()
    for name in STAGE_MODULES:
        try:
            import_module(name).STAGE.import_libraries()
        except Exception as exc:  # noqa: BLE001 - the child imports it again and says what is wrong
            failed[name] = f"{type(exc).__name__}: {exc}"
    quiet_libraries()  # some libraries set their loggers' levels when imported


preload()
