"""The project's one exception tree (shared by parent and children)."""

from __future__ import annotations

from pathlib import Path


class PipelineError(Exception):
    """Base of every error this project raises on purpose."""


class ArtifactError(PipelineError):
    """An artifact or request file is missing, corrupt or does not match its contract."""

    def __init__(self, path: str | Path, reason: str) -> None:
        self.path = str(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")


class InputError(PipelineError):
    """A user's input cannot be processed (missing, not media, no audio, empty)."""


class DiskFullError(PipelineError):
    """A file could not be written: no space left on its filesystem, or a quota. Nobody's input's fault:
    the run stops, and a rerun resumes."""


class FileTooLargeError(DiskFullError):
    """A file is larger than the file size limit (``ulimit -f``) allows: it never will fit, so the input
    it belongs to fails alone."""


class StageError(PipelineError):
    """A stage failed for a reason that retrying will not fix."""


class ModelUnavailableError(StageError):
    """A requested model is neither embedded, on disk nor in the hub cache."""


class GpuMemoryError(StageError):
    """A stage cannot start: its GPU has less free memory than it needs (names who holds it)."""


class SettingsError(PipelineError):
    """Settings or command-line options are invalid."""


class OutputBusyError(SettingsError):
    """Another run holds the output directory."""


class ApiError(PipelineError):
    """The HTTP API answered with an error (status and OpenAI-style error body)."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "server_error",
        param: str | None = None,
        code: str | None = None,
        retry_after: int | None = None,
    ) -> None:
        self.status = status
        #: seconds a 429's ``Retry-After`` says (None: the server's default)
        self.retry_after = retry_after
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        super().__init__(f"HTTP {status} {type}: {message}")
