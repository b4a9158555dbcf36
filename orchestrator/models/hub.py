"""``allow_hub=auto``: may the stage children reach the Hugging Face hub on this run?

Checked once per run, in the parent, with one short HTTP request to the hub
endpoint (``HF_ENDPOINT`` if set, else ``https://huggingface.co``) and no model
library. Any HTTP answer means the hub is reachable: children may then download
what is not cached (``HF_HUB_OFFLINE`` is not set for them). No answer within
``hub_check_timeout_s`` (no network, a closed port, DNS failure) means offline,
as on a fresh air-gapped machine: children get ``HF_HUB_OFFLINE=1`` and fail
fast instead of retrying for minutes. A token (``HF_TOKEN``) is never sent here.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import httpx

from orchestrator.settings import Settings

log = logging.getLogger(__name__)

DEFAULT_ENDPOINT = "https://huggingface.co"


def hub_endpoint() -> str:
    """The endpoint huggingface_hub would use (its own variable, read from the environment)."""
    return os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT


def hub_reachable(endpoint: str, timeout_s: float) -> tuple[bool, str]:
    """(reachable, why): one HEAD request; any HTTP status counts as reachable."""
    try:
        response = httpx.head(endpoint, timeout=timeout_s, follow_redirects=False)
    except httpx.HTTPError as exc:
        return False, f"{endpoint} did not answer within {timeout_s:g} s ({type(exc).__name__})"
    return True, f"{endpoint} answered (HTTP {response.status_code})"


def resolve_hub(settings: Settings) -> Settings:
    """``settings`` with ``allow_hub`` true or false: "auto" is decided by asking the endpoint once."""
    if settings.allow_hub != "auto":
        return settings
    endpoint = hub_endpoint()
    reachable, why = hub_reachable(endpoint, settings.hub_check_timeout_s)
    if reachable:
        log.info(
            "hub: %s: stage children may download models that are not cached (progress in their logs)", why
        )
    else:
        log.info("hub: %s: running offline (cached and embedded models only)", why)
    return settings.replace(allow_hub=reachable)


def cached_repos(cache_dir: Path | str | None = None) -> dict[str, int]:
    """repo id -> bytes on disk of every repository in the Hugging Face cache (huggingface_hub's scan)."""
    from huggingface_hub import scan_cache_dir  # the hub client only: no model library

    try:
        return {repo.repo_id: repo.size_on_disk for repo in scan_cache_dir(cache_dir).repos}
    except Exception as exc:  # noqa: BLE001 - no cache yet, or an unreadable one: nothing to compare
        log.debug("hub cache not scanned: %s", exc)
        return {}


def downloads(before: dict[str, int], after: dict[str, int]) -> list[str]:
    """One line per repository the run downloaded (new in the cache, or grown), for the console."""
    lines = []
    for repo, size in sorted(after.items()):
        grown = size - before.get(repo, 0)
        if grown > 0:
            lines.append(f"downloaded {repo} ({grown / 2**20:.0f} MiB) into the Hugging Face cache")
    return lines
