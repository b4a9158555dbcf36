"""Known-harmless output of the libraries the stages use, handled where it starts: in the child.

Each known warning is filtered by its category, its message and the module it is
attributed to (never a blanket filter), so anything new and unexpected still
reaches the child's log. Other libraries' loggers are kept at WARNING: their
INFO chatter (checkpoint upgrades, applied quirks, "performing VAD") stays out
of the logs, their warnings and errors do not. Call :func:`quiet_libraries`
before importing them (the warning filters must exist when the warning is
raised) and again after (some set their own logger level when imported).
"""

from __future__ import annotations

import logging
import warnings

#: (category, message regex, module regex) of warnings known to be harmless here
KNOWN_WARNINGS: tuple[tuple[type[Warning], str, str], ...] = (
    # pyannote.audio can decode files through torchcodec; we always hand it arrays, so its missing FFmpeg
    # libraries do not matter (the warning prints a 20-line traceback in every child that imports it)
    (UserWarning, r"\s*torchcodec is not installed correctly", r"pyannote\.audio\.core\.io"),
    # speechbrain asks torchaudio for its backends with a call torchaudio 2.8 deprecates
    (
        UserWarning,
        r"torchaudio\._backend\.list_audio_backends has been deprecated",
        r"speechbrain\.utils\.torch_audio_backend",
    ),
    # torchaudio 2.8's own deprecation notices for its I/O functions (the stages decode with PyAV)
    (UserWarning, r"In 2\.9, this function's implementation will be changed", r"torchaudio\..*"),
)

#: libraries whose INFO messages are noise in a stage child's log
LIBRARY_LOGGERS = (
    "speechbrain",
    "lightning",
    "lightning.pytorch",
    "lightning_fabric",
    "pytorch_lightning",
    "whisperx",
    "pyannote",
    "transformers",
    "sentence_transformers",
    "huggingface_hub",
    "urllib3",
    "filelock",
    "fsspec",
    "numba",
    "faster_whisper",
)


def quiet_libraries() -> None:
    """Install the known-warning filters and keep other libraries' loggers at WARNING."""
    for category, message, module in KNOWN_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
    for name in LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
