"""The catalogue beside outputs that go to a URL (``OUTPUT_URL=s3://bucket/out``), and searched from there.

A run with an output URL builds its output folder in a local staging folder and uploads each finished input;
its catalogue (``OUT/.catalogue/``: the search tables and the corpus speakers') is copied to
``URL/.catalogue/`` as each chunk ends (:func:`push`), so another machine can search it: ``pipeline search
s3://bucket/out "query"`` copies it into a local cache first (:func:`pull`) and searches the copy.

Lance writes every data, index and deletion file once under a new name; a version is made visible by its
manifest. So both directions copy the files the other side lacks (or holds at another size), the tables'
manifests last, then remove what the source no longer has (old versions the upkeep deleted): a reader of
either copy finds each version it can see whole. The cost follows what is new, not what the catalogue holds.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
from pathlib import Path

from orchestrator import layout
from orchestrator.remote import filesystem, redact, without_credentials

log = logging.getLogger(__name__)


def _last(relative: str) -> bool:
    """Files that make a version visible: copied after everything they name."""
    return "/_versions/" in f"/{relative}" or relative.endswith("_latest.manifest")


def _order(names) -> list[str]:
    return sorted(names, key=lambda name: (_last(name), name))


def _local(root: Path) -> dict[str, int]:
    if not root.is_dir():
        return {}
    return {
        path.relative_to(root).as_posix(): path.stat().st_size
        for path in root.rglob("*")
        if path.is_file() and not path.is_symlink()
    }


def _remote(fs, root: str) -> dict[str, int]:
    if not fs.exists(root):
        return {}
    found = fs.find(root, detail=True)
    prefix = root.rstrip("/") + "/"
    return {
        name[len(prefix) :]: int(info.get("size") or 0)
        for name, info in found.items()
        if info.get("type", "file") == "file" and name.startswith(prefix)
    }


def push(out: Path, url: str) -> int:
    """``OUT/.catalogue`` copied to ``URL/.catalogue``: what it lacks, manifests last, then what the local copy
    no longer has removed. Returns the files copied."""
    local_root = Path(out) / layout.CATALOGUE
    mine = _local(local_root)
    if not mine:
        return 0
    fs, base = filesystem(url)
    root = f"{base.rstrip('/')}/{layout.CATALOGUE}"
    theirs = _remote(fs, root)
    copied = 0
    for name in _order(n for n, size in mine.items() if theirs.get(n) != size):
        target = f"{root}/{name}"
        fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
        fs.put_file(str(local_root / name), target)
        copied += 1
    for name in sorted(set(theirs) - set(mine)):
        fs.rm_file(f"{root}/{name}")
    if copied:
        log.debug(
            "catalogue: %d file(s) copied to %s", copied, redact(f"{url.rstrip('/')}/{layout.CATALOGUE}")
        )
    return copied


def cache_dir(url: str, base: Path) -> Path:
    """Where a catalogue at ``url`` is copied to be searched: the same folder for the same URL (whatever its
    credentials), so a second search copies only what is new."""
    return Path(base) / "catalogues" / hashlib.sha1(without_credentials(url).encode()).hexdigest()[:16]


def pull(url: str, into: Path) -> Path:
    """``URL/.catalogue`` copied into ``into/.catalogue`` (what the copy lacks, manifests last, then what the
    URL no longer has removed); returns ``into``, an output folder holding only the catalogue. A URL without
    a catalogue leaves ``into`` without one."""
    fs, base = filesystem(url)
    root = f"{base.rstrip('/')}/{layout.CATALOGUE}"
    theirs = _remote(fs, root)
    local_root = Path(into) / layout.CATALOGUE
    if not theirs:
        shutil.rmtree(local_root, ignore_errors=True)
        return Path(into)
    mine = _local(local_root)
    for name in _order(n for n, size in theirs.items() if mine.get(n) != size):
        target = local_root / name
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + ".partial")
        fs.get_file(f"{root}/{name}", str(partial))
        os.replace(partial, target)
    for name in sorted(set(mine) - set(theirs)):
        (local_root / name).unlink(missing_ok=True)
    return Path(into)
