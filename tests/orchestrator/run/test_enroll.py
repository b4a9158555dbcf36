"""``pipeline enroll``: what is checked before any child starts, and the profile's file name.

Enrolling itself (a ``voice_profile`` child) runs end to end in ``tests/scenarios/`` and ``tests/stages/``.
"""

from __future__ import annotations

import pytest

from contracts.errors import InputError, SettingsError
from orchestrator.layout import profile_file_name
from orchestrator.run.enroll import enroll
from orchestrator.settings import Settings


@pytest.mark.parametrize(
    ("name", "stem"),
    [
        ("Alice", "Alice"),
        ("  Alice  ", "Alice"),
        ("José_García", "José_García"),
        ("host-2.v1", "host-2.v1"),
        ("Dr. Bob Smith", "Dr._Bob_Smith~"),
        ("a/b\\c", "a_b_c~"),
        ("../etc/passwd", "etc_passwd~"),
        ("...", "speaker~"),
        ("?!", "speaker~"),
    ],
)
def test_a_speaker_name_becomes_a_safe_file_stem(name, stem):
    """A name that is a safe stem is its own; another one is a slug and a hash of the exact name."""
    made = profile_file_name(name)
    assert made == stem if not stem.endswith("~") else (made.startswith(stem) and len(made) == len(stem) + 10)
    assert "/" not in made and "\\" not in made and not made.startswith(".")


def test_names_that_slug_alike_get_distinct_files():
    names = ["Dr Lee", "Dr/Lee", "Dr_Lee", "Dr  Lee", "dr lee", "Dr Lee?", "x" * 300, "x" * 301]
    stems = [profile_file_name(n) for n in names]
    assert len(set(stems)) == len(names), stems
    assert profile_file_name("Dr_Lee") == "Dr_Lee" and all(len(s.encode()) < 200 for s in stems)


@pytest.mark.parametrize("name", ["", "   "])
def test_an_empty_name_is_refused(name):
    with pytest.raises(SettingsError, match="cannot be empty"):
        profile_file_name(name)


def _settings(tmp_path, **kw) -> Settings:
    return Settings(allow_hub=False, **{"profiles_dir": tmp_path / "profiles", **kw})


def test_enroll_needs_a_profiles_directory(tmp_path):
    clip = tmp_path / "a.wav"
    clip.write_bytes(b"RIFF")
    with pytest.raises(SettingsError, match="no profiles directory"):
        enroll(_settings(tmp_path, profiles_dir=None), "Alice", [clip])


def test_enroll_needs_a_clip(tmp_path):
    with pytest.raises(SettingsError, match="at least one clip"):
        enroll(_settings(tmp_path), "Alice", [])
    assert not (tmp_path / "profiles").exists(), "nothing written, no run folder"


def test_missing_clips_are_all_named_before_any_child_starts(tmp_path):
    there = tmp_path / "there.wav"
    there.write_bytes(b"RIFF")
    with pytest.raises(InputError, match="clip not found") as err:
        enroll(_settings(tmp_path), "Alice", [there, tmp_path / "gone1.wav", tmp_path / "gone2.wav"])
    assert (
        "gone1.wav" in str(err.value) and "gone2.wav" in str(err.value) and "there.wav" not in str(err.value)
    )
    assert not (tmp_path / "profiles").exists()


def test_a_folder_is_not_a_clip(tmp_path):
    with pytest.raises(InputError, match="clip not found"):
        enroll(_settings(tmp_path), "Alice", [tmp_path])


def test_an_empty_name_is_refused_before_any_child(tmp_path):
    clip = tmp_path / "a.wav"
    clip.write_bytes(b"RIFF")
    with pytest.raises(SettingsError, match="cannot be empty"):
        enroll(_settings(tmp_path), "  ", [clip])
    assert not (tmp_path / "profiles" / ".runs").exists()
