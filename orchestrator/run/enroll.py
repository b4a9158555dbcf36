"""``pipeline enroll NAME clip...``: build a voice profile in its own stage child.

The profile is written to ``PROFILES_DIR/<name>.json``; ``pipeline process
--profiles PROFILES_DIR`` then matches every profile in that directory.
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

from contracts import VoiceProfile, WorkItem, load_model
from contracts.errors import InputError, PipelineError, SettingsError, StageError
from orchestrator.layout import profile_file_name
from orchestrator.models.hub import resolve_hub
from orchestrator.planning.fingerprints import fingerprint
from orchestrator.process.executor import LocalExecutor, Watchdog
from orchestrator.process.hooks import default_hooks
from orchestrator.registry import VOICE_PROFILE
from orchestrator.run.runner import StageRunner
from orchestrator.settings import Settings

log = logging.getLogger(__name__)


def enroll(
    settings: Settings, name: str, clips: list[str | Path], executor: LocalExecutor | None = None
) -> Path:
    """Embed ``clips`` of one speaker in a child and write the profile; return its path."""
    if settings.profiles_dir is None:
        raise SettingsError("no profiles directory: pass --profiles DIR or set PIPELINE_PROFILES_DIR")
    settings = resolve_hub(settings)
    if not clips:
        raise SettingsError("enroll needs at least one clip of the speaker")
    missing = [str(c) for c in clips if not Path(c).is_file()]
    if missing:
        raise InputError(f"clip not found: {', '.join(missing)}")
    directory = Path(settings.profiles_dir)
    output = directory / f"{profile_file_name(name)}.json"
    spec = VOICE_PROFILE.spec(settings)
    spec = replace(
        spec,
        settings=VOICE_PROFILE.settings_model.model_validate({**spec.settings.model_dump(), "name": name}),
    )
    identity = "|".join(
        f"{Path(c).resolve()}:{hashlib.sha256(Path(c).read_bytes()).hexdigest()}" for c in clips
    )
    item = WorkItem(
        id=profile_file_name(name),
        inputs={f"clip{i}": str(c) for i, c in enumerate(clips)},
        output=str(output),
        fingerprint=fingerprint(spec, identity),
    )
    run_dir = directory / ".runs" / f"{datetime.now(UTC):%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:6]}"
    run_dir.mkdir(parents=True, exist_ok=True)
    own = executor is None
    executor = executor or LocalExecutor(
        default_hooks(settings), watchdog=Watchdog.from_settings(settings), start_method=settings.start_method
    )
    try:
        runner = StageRunner(
            executor,
            run_dir,
            settings.child_env(),
            settings.device,
            settings.max_signal_retries,
            memory=settings.memory(),
        )
        outcomes, _ = runner.run(spec, [item], reuse=False)
    finally:
        if own:
            executor.stop_all()
    outcome = outcomes[item.id]
    if not outcome.ok:
        raise StageError(f"enrolling {name!r} failed: {outcome.error}")
    try:
        profile = load_model(output, VoiceProfile)
    except PipelineError as exc:
        raise StageError(f"enrolling {name!r} wrote no valid profile: {exc}") from exc
    log.info(
        "enrolled %s from %d clip(s) with %s -> %s (threshold %.2f)",
        profile.name,
        len(profile.clips),
        profile.encoder,
        output,
        profile.threshold,
    )
    return output
