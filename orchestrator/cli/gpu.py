"""``pipeline gpu``: the GPUs and the processes holding their memory; ``--cleanup`` stops orphaned stage
children."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from orchestrator.cli.common import NORMAL, setup_logging


def gpu(
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON document.")] = False,
    cleanup: Annotated[
        bool,
        typer.Option(
            "--cleanup",
            help="Stop this project's orphaned stage children (pid files with start times, never by name).",
        ),
    ] = False,
    pid_dir: Annotated[
        Path | None, typer.Option(help="Pid files of stage children [env PIPELINE_PID_DIR].")
    ] = None,
) -> None:
    """GPU devices and the processes holding VRAM (NVML: no CUDA context); exit 0 also without a GPU."""
    import json

    from rich.console import Console

    from orchestrator import Settings
    from orchestrator.gpu.nvml import NvmlReader
    from orchestrator.process.gpu_status import as_json, render, render_cleanup
    from orchestrator.process.pidfiles import ChildRegistry

    setup_logging(NORMAL)
    registry = ChildRegistry(pid_dir or Settings().pid_dir)
    done = registry.cleanup() if cleanup else None
    snapshot = NvmlReader().read()
    if json_out:
        typer.echo(json.dumps(as_json(snapshot, registry, done), indent=2))
        return
    console = Console(soft_wrap=True)
    console.print(render(snapshot, registry))
    if done is not None:
        console.print(render_cleanup(done, registry))
