"""Unpack the carried bundles on the device machine: install their wheels, put their weights together.

    python3 bench/device/unpack.py [--require-all] [--kit .kit] [--target /tmp/site]

Run there, in the repository root, by the image's Python (3.12, standard library only: nothing else is
installed yet). Each ``.kit/carryN/`` holds a ``manifest.json`` (the whole kit's plan, the same in every
bundle, written by bench/device/prepare.py) and some pieces: whole wheels, whole weight files, or parts of
files that were split to fit a call. Idempotent: a call with a new bundle installs and joins only what that
bundle completes; what is already installed (``<target>/.kit-installed.json``) or placed
(``<kit>/weights/.kit-placed.json``) with the same sha256 is left alone. A fresh machine has neither file,
so everything is done again there.

Exit status: 0 done (some entries may still wait for a later bundle), 3 with ``--require-all`` when an entry
still waits, 1 when a file's sha256 does not match or pip fails, 2 when no bundle or mixed kits are present.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PIP_FLAGS = ["install", "-q", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir", "--upgrade"]

OK, FAILED, MIXED, WAITING = 0, 1, 2, 3


def sha256_of(paths: list[Path]) -> str:
    """The sha256 of the concatenation of ``paths`` (one path: that file's)."""
    digest = hashlib.sha256()
    for path in paths:
        with path.open("rb") as fh:
            while chunk := fh.read(1 << 20):
                digest.update(chunk)
    return digest.hexdigest()


def _load_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _save_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, path)


def read_manifests(kit: Path) -> tuple[dict | None, list[int], str | None]:
    """(the manifest, the bundle numbers present, an error) from every ``carry*/manifest.json`` under kit."""
    found = {}
    for path in sorted(kit.glob("carry*/manifest.json")):
        data = _load_json(path)
        if "kit_id" in data and "bundle" in data:
            found[int(data["bundle"])] = data
    if not found:
        return None, [], f"no bundle under {kit} (no carry*/manifest.json): carry .kit/carry1 first"
    ids = {data["kit_id"] for data in found.values()}
    if len(ids) > 1:
        return (
            None,
            sorted(found),
            (
                f"bundles of {len(ids)} different prepare runs are here ({sorted(ids)}): "
                "carry all bundles of one run (or start a fresh machine)"
            ),
        )
    return next(iter(found.values())), sorted(found), None


def _pieces(kit: Path, entry: dict) -> tuple[list[Path], list[int]]:
    """(the paths of the entry's pieces, the bundles still missing for it)."""
    paths, missing = [], []
    for piece in entry["pieces"]:
        path = kit / f"carry{piece['bundle']}" / piece["path"]
        if path.is_file() and path.stat().st_size == piece["size"]:
            paths.append(path)
        else:
            missing.append(piece["bundle"])
    return paths, sorted(set(missing))


def _join(paths: list[Path], dest: Path) -> None:
    """Write the concatenation of ``paths`` to ``dest`` (a hard link when there is one piece)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".joining")
    tmp.unlink(missing_ok=True)
    if len(paths) == 1:
        try:
            os.link(paths[0], tmp)
        except OSError:
            shutil.copyfile(paths[0], tmp)
    else:
        with tmp.open("wb") as out:
            for path in paths:
                with path.open("rb") as fh:
                    shutil.copyfileobj(fh, out, 1 << 20)
    os.replace(tmp, dest)


def unpack(kit: Path, target: Path, require_all: bool = False, pip: list[str] | None = None) -> int:
    t0 = time.monotonic()
    manifest, present, error = read_manifests(kit)
    if error:
        print(f"unpack: {error}")
        return MIXED
    total = manifest["bundles"]
    absent = [n for n in range(1, total + 1) if n not in present]
    print(
        f"unpack: kit {manifest['kit_id']}, bundles present {present} of {total}"
        + (f", not here: {absent}" if absent else "")
    )
    installed_path = target / ".kit-installed.json"
    placed_path = kit / "weights" / ".kit-placed.json"
    installed, placed = _load_json(installed_path), _load_json(placed_path)
    to_install: list[tuple[dict, Path]] = []
    waiting: list[str] = []
    status = OK
    for entry in manifest["entries"]:
        dest, sha = entry["dest"], entry["sha256"]
        if entry["kind"] == "wheel" and installed.get(dest) == sha:
            continue
        final = kit / "weights" / dest
        if entry["kind"] == "weight" and placed.get(dest) == sha and final.is_file():
            if final.stat().st_size == entry["size"]:
                continue
        paths, missing = _pieces(kit, entry)
        if missing:
            waiting.append(f"{dest} (needs bundle {', '.join(map(str, missing))})")
            continue
        if entry["kind"] == "wheel":
            whole = paths[0] if len(paths) == 1 else kit / "joined" / dest
            if len(paths) > 1:
                _join(paths, whole)
            if sha256_of([whole]) != sha:
                print(f"unpack: sha256 mismatch for wheel {dest}: not installed")
                status = FAILED
                continue
            to_install.append((entry, whole))
        else:
            if sha256_of(paths) != sha:
                print(f"unpack: sha256 mismatch for {dest} ({len(paths)} piece(s)): not placed")
                status = FAILED
                continue
            _join(paths, final)
            placed[dest] = sha
            note = f" from {len(paths)} parts" if len(paths) > 1 else ""
            print(f"unpack: placed {final} ({entry['size'] / 2**20:.1f} MiB{note}, sha256 ok)")
    if placed:
        _save_json(placed_path, placed)
    if to_install:
        target.mkdir(parents=True, exist_ok=True)
        cmd = [*(pip or [sys.executable, "-m", "pip"]), *PIP_FLAGS, "--target", str(target)]
        cmd += [str(path) for _, path in to_install]
        t1 = time.monotonic()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            print(f"unpack: pip failed ({proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
            return FAILED
        for entry, _ in to_install:
            installed[entry["dest"]] = entry["sha256"]
        _save_json(installed_path, installed)
        names = ", ".join(" ".join(entry["dest"].split("-")[:2]) for entry, _ in to_install)
        print(
            f"unpack: installed {len(to_install)} wheel(s) into {target} in {time.monotonic() - t1:.1f} s: {names}"
        )
    entries = manifest["entries"]
    wheels = [e for e in entries if e["kind"] == "wheel"]
    weights = [e for e in entries if e["kind"] == "weight"]
    wheels_done = sum(installed.get(e["dest"]) == e["sha256"] for e in wheels)
    weights_done = sum(placed.get(e["dest"]) == e["sha256"] for e in weights)
    print(
        f"unpack: {wheels_done}/{len(wheels)} wheels installed, {weights_done}/{len(weights)} weight files placed, "
        f"{len(waiting)} waiting; {time.monotonic() - t0:.1f} s"
    )
    for line in waiting:
        print(f"unpack: waiting: {line}")
    if not waiting:
        print(f"unpack: complete; use PYTHONPATH={target}:$PWD")
    if require_all and waiting and status == OK:
        print(
            "unpack: --require-all: not complete (a bundle was not carried, or the machine is a fresh one: "
            "carry the bundles it names)"
        )
        return WAITING
    return status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kit", type=Path, default=ROOT / ".kit", help="the kit folder (default: .kit)")
    parser.add_argument(
        "--target", type=Path, default=Path("/tmp/site"), help="pip --target (default /tmp/site)"
    )
    parser.add_argument("--require-all", action="store_true", help="exit 3 unless every entry is in place")
    args = parser.parse_args(argv)
    return unpack(args.kit, args.target, require_all=args.require_all)


if __name__ == "__main__":
    sys.exit(main())
