"""The Python API: planning, a real run in a parent that never loads torch, and reuse on rerun."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from orchestrator.planning.inputs import expand_inputs, item_ids
from tests.conftest import MEDIA, ROOT
from tests.orchestrator.test_isolation import HEAVY


def test_same_stem_in_different_folders_gets_distinct_ids(tmp_path):
    a, b = tmp_path / "a" / "talk.mp4", tmp_path / "b" / "talk.mp4"
    ids = item_ids([a, b, tmp_path / "other.wav"])
    assert ids == ["talk", "talk-2", "other"], (
        "loose files keep their stem; a clash gets a checked-free suffix"
    )


def test_unicode_and_spaces_are_kept_readable():
    assert item_ids([ROOT / "vidéo de réunion.mp4"]) == ["vidéo de réunion"]
    assert item_ids([ROOT / ".hidden.mp4"]) == ["hidden"]


def test_directories_expand_to_their_media_files_in_stable_order(tmp_path):
    (tmp_path / "sub").mkdir()
    for name in ("b.mp4", "a.wav", "notes.txt", "sub/c.MKV"):
        (tmp_path / name).write_bytes(b"x")
    assert [p.relative_to(tmp_path).as_posix() for p in expand_inputs([tmp_path])] == [
        "a.wav",
        "b.mp4",
        "sub/c.MKV",
    ]
    assert expand_inputs([tmp_path / "missing.mp4"]) == [tmp_path / "missing.mp4"]
    (tmp_path / "empty").mkdir()
    assert expand_inputs([tmp_path / "empty"]) == [tmp_path / "empty"], "kept, to fail alone with a reason"


RUN = """
import json, sys
from orchestrator import Orchestrator, Settings
with Orchestrator(Settings(output_dir=sys.argv[1], embedding_profile="embedded")) as orch:
    report = orch.process([sys.argv[2]])
heavy = sorted(n for n in sys.modules if n.split('.')[0] in {heavy!r})
print(json.dumps({{"report": json.loads(report.model_dump_json()), "heavy": heavy}}))
"""


def _api_run(out) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", RUN.format(heavy=HEAVY), str(out), str(MEDIA / "speech.wav")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.slow
def test_real_run_never_loads_torch_in_the_parent_and_a_rerun_reuses_everything(tmp_path):
    first = _api_run(tmp_path)
    assert first["heavy"] == [], "the parent process imported a model library"
    assert first["report"]["ok"] == 1
    assert [s["stage"] for s in first["report"]["stages"]] == [
        "audio",
        "asr",
        "diarization",
        "alignment",
        "embeddings",
    ]
    assert [len(s["attempts"]) for s in first["report"]["stages"]] == [1, 1, 1, 1, 1]
    srt = (tmp_path / "speech" / "transcript.srt").read_text()

    second = _api_run(tmp_path)
    # transcript and embeddings are valid and current, so no child runs at all; the decoded
    # audio (scratch, removed after success) is not needed and not redone either
    assert second["report"]["stages"] == []
    assert {s["status"] for s in second["report"]["inputs"][0]["stages"].values()} == {"reused"}
    assert second["report"]["ok"] == 1 and second["report"]["throughput"] is None
    assert (tmp_path / "speech" / "transcript.srt").read_text() == srt


def test_per_stage_ray_resources_for_a_stage_that_does_not_exist_are_refused_before_the_run():
    from contracts.errors import SettingsError
    from orchestrator import Orchestrator, Settings

    # Given resources for "asr" and a misspelt "embedding" (the stage is "embeddings")
    settings = Settings(ray_stage_resources={"asr": {"GPU": 1}, "embedding": {"GPU": 1}}, device="cpu")
    # Then planning refuses with both the bad name and the real ones, instead of silently ignoring it
    with pytest.raises(
        SettingsError, match=r"names no stage 'embedding': the stages are audio, asr, .*embeddings"
    ):
        Orchestrator(settings).stage_specs()
    # and the right names pass
    assert Orchestrator(settings.replace(ray_stage_resources={"asr": {"GPU": 1}})).stage_specs()
