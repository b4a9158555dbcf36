"""Rehearse the device run here, on the CPU, with only what the device machine will have.

    .venv/bin/python bench/device/rehearse.py [--reuse] [--command "python bench/device/run.py ..."]

Builds ``.kit/rehearsal/``: a fresh Python 3.11 venv (no pip) whose interpreter sees only

(a) the image's packages (bench/device/image.txt) that our .venv holds, taken file by file from their
    RECORDs: symbolic links in ``image-site/``, which a ``.pth`` file in the venv adds as a site directory
    (so their own ``.pth`` files work). The venv's torch is a CUDA 12 build: its ``nvidia-*-cu12`` libraries
    stand in for the image's CUDA 13 ones (``nvidia-*`` / ``nvidia-*-cu13``);
(b) the carried packages (``.kit/plan.json``, which prepare.py writes; prepare.py's resolution is run when it
    is absent), as their cp311 wheels at the same versions (``.kit/wheels311/``), installed with
    ``pip --target`` into ``carried-site/``, which goes first on ``PYTHONPATH``, as ``/tmp/site`` does there.

Then runs the command (the repository root second on ``PYTHONPATH``, as there), reports the first
ImportError with the missing name, and checks that whisperx, faster_whisper and speechbrain cannot be
imported in it while pydantic and the other carried modules can.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.device import prepare

ROOT = prepare.ROOT
KIT = prepare.KIT
#: our venv's site-packages: where the image's packages are taken from
VENV_SITE = (
    ROOT / ".venv" / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
)
#: the device run's own modules and the carried ones it uses: each must import in the rehearsal
MUST_IMPORT = (
    "contracts",
    "orchestrator",
    "orchestrator.settings",
    "orchestrator.gpu.nvml",
    "orchestrator.api.server",
    "stages.runtime.base",
    "pydantic",
    "pydantic_settings",
    "multiprocess",
    "av",
    "fastapi",
    "uvicorn",
    "torch",
    "numpy",
    "pynvml",
    "psutil",
)
#: run here only (prepare.py, rehearse.py) or before anything is installed there (unpack.py)
HERE_ONLY = ("prepare", "rehearse", "unpack")


def device_modules() -> tuple[str, ...]:
    """``bench.device.<name>`` for every section module there is now (others add theirs)."""
    here = Path(__file__).parent
    return tuple(
        f"bench.device.{p.stem}" for p in sorted(here.glob("*.py")) if p.stem not in HERE_ONLY + ("__init__",)
    )


#: not in the image and not carried: importing any of them there fails, so it must fail here too
MUST_NOT_IMPORT = ("whisperx", "faster_whisper", "speechbrain", "pyannote.audio")
FALLBACK_COMMAND = (
    'python -c "import contracts, orchestrator, stages.runtime.base, orchestrator.api.server" && '
    "python bench/device/env.py --device cpu --out .kit/rehearsal-out"
)
RUN_COMMAND = "python bench/device/run.py --device cpu --quick --out .kit/rehearsal-out"
_MISSING = re.compile(r"(ModuleNotFoundError|ImportError): (.*)")


def base_python() -> Path:
    """The interpreter our .venv was made from (its pyvenv.cfg ``home``): the same CPython, no packages."""
    cfg = (ROOT / ".venv" / "pyvenv.cfg").read_text()
    home = next(line.split("=", 1)[1].strip() for line in cfg.splitlines() if line.startswith("home"))
    return Path(home) / f"python{sys.version_info.major}.{sys.version_info.minor}"


def image_stand_in(name: str, image: dict[str, str | None]) -> bool:
    """Whether our .venv's distribution ``name`` is one of the image's (a CUDA 12 library for a CUDA 13 one)."""
    if name in image:
        return True
    if name.startswith("nvidia-") and name.endswith("-cu12"):
        stem = name[: -len("-cu12")]
        return stem in image or f"{stem}-cu13" in image
    return False


def _site_files(dist) -> list[Path]:
    """The distribution's RECORD files inside site-packages (scripts and data outside it left out)."""
    files = [Path(str(f)) for f in dist.files or []]
    return [f for f in files if not f.is_absolute() and ".." not in f.parts]


def link_image_packages(site: Path, dest: Path, image: dict[str, str | None]) -> tuple[list[str], int]:
    """Link the image's distributions in ``site`` into ``dest``, by their RECORDs; (names, links made).

    A top-level folder that only one distribution's RECORD names is linked whole (torch: one link instead
    of 15,000); a folder that several share (``nvidia/``) is linked file by file, so that a distribution
    outside the image stays out.
    """
    dists = {
        prepare.normalize(d.metadata["Name"]): d for d in importlib.metadata.distributions(path=[str(site)])
    }
    files = {name: _site_files(dist) for name, dist in dists.items()}
    owners: dict[str, set[str]] = {}
    for name, rels in files.items():
        for rel in rels:
            if len(rel.parts) > 1:
                owners.setdefault(rel.parts[0], set()).add(name)
    names, count = [], 0
    for name, dist in dists.items():
        if not image_stand_in(name, image):
            continue
        names.append(f"{name}=={dist.version}")
        for rel in files[name]:
            top = rel.parts[0]
            whole = len(rel.parts) > 1 and owners.get(top) == {name}
            rel = Path(top) if whole else rel
            src, link = site / rel, dest / rel
            if not src.exists() or link.is_symlink() or link.exists():
                continue
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(src)
            count += 1
    return sorted(names), count


def carried_plan(kit: Path) -> list[dict]:
    """The carried packages (name, version): ``kit/plan.json``, else prepare.py's resolution run now."""
    plan_path = kit / "plan.json"
    if plan_path.is_file():
        return json.loads(plan_path.read_text())["packages"]
    print(f"rehearse: no {plan_path}: resolving the carried packages as prepare.py does")
    return [{"name": p.name, "version": p.version} for p in prepare.resolve(kit / "wheels")]


def build(kit: Path = KIT, dest: Path | None = None, reuse: bool = False) -> dict:
    """Build the rehearsal environment under ``dest`` (default ``kit/rehearsal``); what it holds and timings."""
    dest = dest or kit / "rehearsal"
    venv, image_site, carried_site = dest / "venv", dest / "image-site", dest / "carried-site"
    python = venv / "bin" / "python"
    info: dict = {"dest": str(dest), "python": str(python)}
    t0 = time.monotonic()
    if reuse and (dest / "built.json").is_file():
        return json.loads((dest / "built.json").read_text())
    shutil.rmtree(dest, ignore_errors=True)
    info["clean_s"] = round(time.monotonic() - t0, 2)
    t0v = time.monotonic()
    subprocess.run([str(base_python()), "-m", "venv", "--without-pip", str(venv)], check=True)
    info["venv_s"] = round(time.monotonic() - t0v, 2)

    t1 = time.monotonic()
    image = prepare.read_image()
    names, files = link_image_packages(VENV_SITE, image_site, image)
    site_packages = next(venv.glob("lib/python*/site-packages"))
    (site_packages / "_rehearsal_image.pth").write_text(
        f"import site; site.addsitedir({str(image_site)!r})\n"
    )
    info.update(image_packages=names, image_files=files, image_s=round(time.monotonic() - t1, 2))
    info["image_absent_here"] = sorted(
        n for n in image if not any(x.split("==")[0] == n for x in names) and not n.startswith("nvidia-")
    )

    t2 = time.monotonic()
    plan = carried_plan(kit)
    wheels311 = kit / "wheels311"
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    pip = [str(base_python()), "-m", "pip"]
    prepare.download([f"{p['name']}=={p['version']}" for p in plan], wheels311, python=py, pip=pip)
    wheels = [prepare.wheel_of(wheels311, p["name"], p["version"]) for p in plan]
    info["download_s"] = round(time.monotonic() - t2, 2)
    t3 = time.monotonic()
    cmd = [*pip, "install", "-q", "--no-index", "--no-deps", "--no-compile", "--disable-pip-version-check"]
    subprocess.run([*cmd, "--target", str(carried_site), *map(str, wheels)], check=True)
    info.update(
        carried=[f"{p['name']}=={p['version']}" for p in plan],
        carried_wheels=[w.name for w in wheels],
        install_s=round(time.monotonic() - t3, 2),
        build_s=round(time.monotonic() - t0, 2),
    )
    (dest / "built.json").write_text(json.dumps(info, indent=1))
    return info


def environment(info: dict) -> dict[str, str]:
    """The rehearsal's process environment: its venv first on PATH, carried packages then the repo on PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONHOME", "PYTHONPATH")}
    dest = Path(info["dest"])
    env["PATH"] = f"{dest / 'venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = f"{dest / 'carried-site'}{os.pathsep}{ROOT}"
    env["PYTHONNOUSERSITE"] = "1"
    env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def first_import_error(text: str) -> str | None:
    """The first ``ModuleNotFoundError``/``ImportError`` line in ``text``, or None."""
    match = _MISSING.search(text)
    return f"{match.group(1)}: {match.group(2).strip()}" if match else None


def try_imports(info: dict, modules: tuple[str, ...]) -> dict[str, str | None]:
    """Each module imported in its own rehearsal process: None if it imports, else its error's last line."""
    code = (
        "import importlib, sys\n"
        "try:\n"
        "    importlib.import_module(sys.argv[1])\n"
        "except BaseException as exc:\n"
        "    print(f'{type(exc).__name__}: {exc}'); sys.exit(1)\n"
    )
    result = {}
    for module in modules:
        proc = subprocess.run(
            [info["python"], "-c", code, module],
            capture_output=True,
            text=True,
            env=environment(info),
            cwd=ROOT,
        )
        result[module] = (
            None if proc.returncode == 0 else (proc.stdout + proc.stderr).strip().splitlines()[-1]
        )
    return result


def distributions(info: dict) -> list[str]:
    """Every distribution the rehearsal's interpreter can see (normalized names)."""
    code = (
        "import importlib.metadata as m, json, re\n"
        "print(json.dumps(sorted({re.sub(r'[-_.]+', '-', d.metadata['Name']).lower()"
        " for d in m.distributions()})))"
    )
    proc = subprocess.run(
        [info["python"], "-c", code],
        capture_output=True,
        text=True,
        env=environment(info),
        cwd=ROOT,
        check=True,
    )
    return json.loads(proc.stdout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--command", help=f"default: {RUN_COMMAND!r} (before run.py exists: {FALLBACK_COMMAND!r})"
    )
    parser.add_argument("--reuse", action="store_true", help="keep an environment built earlier")
    parser.add_argument("--kit", type=Path, default=KIT)
    args = parser.parse_args(argv)
    command = args.command or (RUN_COMMAND if (ROOT / "bench/device/run.py").is_file() else FALLBACK_COMMAND)
    info = build(args.kit, reuse=args.reuse)
    print(
        f"rehearse: built {info['dest']} in {info['build_s']} s (removing the old one {info['clean_s']} s; "
        f"venv {info['venv_s']} s; image "
        f"{len(info['image_packages'])} packages, {info['image_files']} links made in {info['image_s']} s; "
        f"carried {len(info['carried'])} cp311 wheels, download {info['download_s']} s, "
        f"install {info['install_s']} s)"
    )
    print(
        f"rehearse: the image's packages this venv lacks (not rehearsed): {' '.join(info['image_absent_here'])}"
    )

    t0 = time.monotonic()
    print(f"rehearse: $ {command}")
    proc = subprocess.run(
        command,
        shell=True,
        capture_output=True,
        text=True,
        env=environment(info),
        cwd=ROOT,
        executable="/bin/bash",
    )
    run_s = time.monotonic() - t0
    sys.stdout.write(proc.stdout[-6000:])
    sys.stdout.write(proc.stderr[-6000:])
    missing = first_import_error(proc.stdout + proc.stderr)
    print(f"rehearse: the command exited {proc.returncode} after {run_s:.1f} s")
    print(f"rehearse: first import error: {missing or 'none'}")

    status = 0 if proc.returncode == 0 and missing is None else 1
    seen = set(distributions(info))
    allowed = {n.split("==")[0] for n in info["image_packages"] + info["carried"]}
    strays = sorted(seen - allowed)
    print(f"rehearse: {len(seen)} distributions visible; outside image + carried: {strays or 'none'}")
    must = MUST_IMPORT + device_modules()
    results = try_imports(info, must + MUST_NOT_IMPORT)
    for module, error in results.items():
        expected = module in must
        ok = (error is None) == expected
        status |= 0 if ok else 1
        mark = "ok  " if ok else "FAIL"
        print(f"rehearse: {mark} {module}: {'imports' if error is None else error}")
    if strays:
        status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
