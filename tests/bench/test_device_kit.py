"""The device kit: what travels to the bare GPU machine, how it is unpacked there, and a rehearsal of it here."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from bench.device import prepare, rehearse

ROOT = Path(__file__).resolve().parents[2]
PYTHON_312 = Path("/root/.pyenv/versions/3.12.1/bin/python")
UNPACK = ROOT / "bench" / "device" / "unpack.py"

_COMPILE_ALL = r"""
import sys, pathlib
bad, count = [], 0
for folder in sys.argv[1:]:
    for path in sorted(pathlib.Path(folder).rglob("*.py")):
        count += 1
        try:
            compile(path.read_bytes(), str(path), "exec", dont_inherit=True)
        except SyntaxError as exc:
            bad.append(f"{path}:{exc.lineno}: {exc.msg}")
print(count)
print("\n".join(bad))
sys.exit(1 if bad else 0)
"""


def test_every_source_file_compiles_under_python_312():
    """Given the device image's Python 3.12, when every module of ours is compiled, then none fails."""
    if not PYTHON_312.is_file():
        pytest.skip(
            f"{PYTHON_312} is missing: no Python 3.12 here to compile with (the device image runs 3.12.3)"
        )
    folders = [str(ROOT / d) for d in ("contracts", "orchestrator", "stages", "bench")]
    proc = subprocess.run([str(PYTHON_312), "-c", _COMPILE_ALL, *folders], capture_output=True, text=True)
    count, _, failures = proc.stdout.partition("\n")
    assert proc.returncode == 0, f"syntax errors under Python 3.12:\n{failures}{proc.stderr}"
    assert int(count) > 100  # it did look at the tree


def test_image_list_has_the_image_and_not_what_the_kit_carries():
    image = prepare.read_image()
    assert image["torch"] == "2.11.0" and image["transformers"] == "5.17.0" and image["numpy"] == "2.5.2"
    assert "typing-extensions" in image and image["typing-extensions"] is None  # no version read there
    carried = {prepare.normalize(n) for n in prepare.NEEDED + prepare.OPTIONAL}
    assert not carried & set(image), "a package the kit carries is listed as the image's"
    for absent in ("whisperx", "faster-whisper", "speechbrain", "pydantic", "ctranslate2"):
        assert absent not in image


def test_uv_lock_pins_every_carried_package_for_python_312():
    lock = prepare.lock_versions()
    for name in prepare.NEEDED + prepare.OPTIONAL:
        assert prepare.normalize(name) in lock, f"uv.lock pins no version of {name}"
    assert lock["pydantic"] == "2.14.3"


def test_markers_are_read_for_the_device_python():
    env = prepare.marker_env()
    assert env["python_version"] == "3.12" and env["extra"] == ""
    from packaging.requirements import Requirement

    assert Requirement('typing-extensions>=4.10; python_version < "3.13"').marker.evaluate(env)
    assert not Requirement('email-validator>=2; extra == "email"').marker.evaluate(env)


def test_device_calls_unpack_every_bundle_and_run_only_in_the_last():
    calls = prepare.device_calls(3)
    assert [c["carry"] for c in calls] == [[".kit/carry1"], [".kit/carry2"], [".kit/carry3"]]
    assert all("bench/device/unpack.py" in c["command"] for c in calls)
    assert all("run.py" not in c["command"] for c in calls[:-1])
    assert "--require-all" in calls[-1]["command"] and "PYTHONPATH=/tmp/site:$PWD" in calls[-1]["command"]
    assert len(calls[-1]["command"]) <= 2000  # the device tool's limit on a command


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _tiny_wheel(folder: Path) -> Path:
    """A pure-Python wheel ``tinykit`` 0.1 whose module holds ``VALUE = 42``."""
    files = {
        "tinykit/__init__.py": b"VALUE = 42\n",
        "tinykit-0.1.dist-info/METADATA": b"Metadata-Version: 2.1\nName: tinykit\nVersion: 0.1\n",
        "tinykit-0.1.dist-info/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = "".join(f"{name},{_record_hash(data)},{len(data)}\n" for name, data in files.items())
    record += "tinykit-0.1.dist-info/RECORD,,\n"
    path = folder / "tinykit-0.1-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
        zf.writestr("tinykit-0.1.dist-info/RECORD", record)
    return path


def _python_with_pip() -> str:
    for python in (sys.executable, str(rehearse.base_python()), shutil.which("python3") or ""):
        if python and subprocess.run([python, "-m", "pip", "--version"], capture_output=True).returncode == 0:
            return python
    pytest.skip("no Python with pip here to run unpack.py's pip install")


def _unpack(python: str, kit: Path, target: Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [python, str(UNPACK), "--kit", str(kit), "--target", str(target), *flags],
        capture_output=True,
        text=True,
    )


@pytest.fixture
def laid_out(tmp_path):
    """A kit of one wheel and two weight files, one of them split into 3 parts, over 3 bundles."""
    source = tmp_path / "source"
    (source / "model" / "sub").mkdir(parents=True)
    big = bytes(range(256)) * 10  # 2,560 bytes: 3 parts of at most 1,000
    (source / "model" / "big.bin").write_bytes(big)
    (source / "model" / "sub" / "small.json").write_text('{"a": 1}')
    wheel = _tiny_wheel(tmp_path)
    files = [("wheel", wheel, wheel.name)]
    files += [
        ("weight", p, f"model/{p.relative_to(source / 'model')}")
        for p in sorted((source / "model").rglob("*"))
    ]
    files = [f for f in files if f[1].is_file()]
    kit = tmp_path / "kit"
    manifest = prepare.layout(files, kit, bundle_bytes=1200, part_bytes=1000)
    return kit, manifest, big


def test_layout_splits_big_files_and_fills_bundles_to_the_limit(laid_out):
    kit, manifest, big = laid_out
    sizes = dict(prepare.bundle_sizes(kit))
    assert manifest["bundles"] == len(sizes) >= 3
    for n in range(1, manifest["bundles"] + 1):
        on_disk = sum(
            f.stat().st_size
            for f in (kit / f"carry{n}").rglob("*")
            if f.is_file() and f.name != "manifest.json"
        )
        assert on_disk <= 1200
        assert json.loads((kit / f"carry{n}" / "manifest.json").read_text())["kit_id"] == manifest["kit_id"]
    big_entry = next(e for e in manifest["entries"] if e["dest"] == "model/big.bin")
    assert [p["size"] for p in big_entry["pieces"]] == [1000, 1000, 560]
    assert big_entry["sha256"] == hashlib.sha256(big).hexdigest()
    assert manifest["entries"][0]["kind"] == "wheel"  # wheels first


def test_unpack_installs_and_joins_bundle_by_bundle_and_checks_sha256(laid_out, tmp_path):
    """Given the bundles arriving one call at a time, unpack does what each completes and never repeats it."""
    kit, manifest, big = laid_out
    python = _python_with_pip()
    device, target = tmp_path / "device-kit", tmp_path / "site"
    device.mkdir()
    big_entry = next(e for e in manifest["entries"] if e["dest"] == "model/big.bin")
    last_part = max(p["bundle"] for p in big_entry["pieces"])
    for n in range(1, manifest["bundles"] + 1):
        shutil.copytree(kit / f"carry{n}", device / f"carry{n}")
        proc = _unpack(python, device, target, "--require-all")
        joined = device / "weights" / "model" / "big.bin"
        if n < last_part:
            assert proc.returncode == 3, proc.stdout + proc.stderr
            assert not joined.exists() and "waiting: model/big.bin" in proc.stdout
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (device / "weights" / "model" / "big.bin").read_bytes() == big
    assert (device / "weights" / "model" / "sub" / "small.json").read_text() == '{"a": 1}'
    check = subprocess.run(
        [python, "-c", "import tinykit; print(tinykit.VALUE)"],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(target)},
    )
    assert check.stdout.strip() == "42", check.stderr
    again = _unpack(python, device, target, "--require-all")
    assert again.returncode == 0 and "installed" not in again.stdout.replace("wheels installed", "")
    assert "placed /" not in again.stdout


def test_unpack_refuses_a_corrupt_part_and_mixed_kits(laid_out, tmp_path):
    kit, manifest, _ = laid_out
    python = _python_with_pip()
    device = tmp_path / "device-kit"
    shutil.copytree(kit, device)
    big_entry = next(e for e in manifest["entries"] if e["dest"] == "model/big.bin")
    part = device / f"carry{big_entry['pieces'][1]['bundle']}" / big_entry["pieces"][1]["path"]
    part.write_bytes(b"\0" * part.stat().st_size)
    proc = _unpack(python, device, tmp_path / "site")
    assert proc.returncode == 1 and "sha256 mismatch for model/big.bin" in proc.stdout
    assert not (device / "weights" / "model" / "big.bin").exists()

    other = json.loads((device / "carry1" / "manifest.json").read_text())
    other["kit_id"] = "another"
    (device / "carry1" / "manifest.json").write_text(json.dumps(other))
    proc = _unpack(python, device, tmp_path / "site")
    assert proc.returncode == 2 and "different prepare runs" in proc.stdout


def test_rehearsal_counts_cuda_12_libraries_as_the_images_cuda_13_ones():
    image = prepare.read_image()
    assert rehearse.image_stand_in("nvidia-cublas-cu12", image)  # the image: nvidia-cublas
    assert rehearse.image_stand_in("nvidia-cudnn-cu12", image)  # the image: nvidia-cudnn-cu13
    assert not rehearse.image_stand_in("nvidia-foo-cu12", image)
    assert not rehearse.image_stand_in("whisperx", image)


def test_first_import_error_names_the_missing_module():
    text = "Traceback ...\nModuleNotFoundError: No module named 'httptools'\nImportError: later"
    assert rehearse.first_import_error(text) == "ModuleNotFoundError: No module named 'httptools'"
    assert rehearse.first_import_error("all fine") is None


@pytest.mark.slow
def test_rehearsal_holds_only_the_image_and_the_carried_packages(tmp_path):
    """Given a rehearsal built from scratch, then nothing outside image + carried is visible in it,
    whisperx and its kin do not import, and every module the device run uses does."""
    try:
        info = rehearse.build(kit=tmp_path / "kit")
    except prepare.KitError as exc:
        pytest.skip(f"no package index reachable to download the carried wheels: {exc}")
    allowed = {n.split("==")[0] for n in info["image_packages"] + info["carried"]}
    seen = set(rehearse.distributions(info))
    assert seen <= allowed, f"outside image + carried: {sorted(seen - allowed)}"
    assert {"pydantic", "fastapi", "av", "torch"} <= seen
    assert not {"whisperx", "faster-whisper", "speechbrain"} & seen
    results = rehearse.try_imports(
        info, rehearse.MUST_IMPORT + rehearse.device_modules() + rehearse.MUST_NOT_IMPORT
    )
    for module in rehearse.MUST_NOT_IMPORT:
        assert results[module] is not None and "No module named" in results[module], module
    failing = {m: e for m, e in results.items() if m not in rehearse.MUST_NOT_IMPORT and e is not None}
    assert not failing, failing
