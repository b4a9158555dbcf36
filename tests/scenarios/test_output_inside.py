"""The output folder inside the input folder (`cd talks && bin/pipeline process .`): the walk of the
inputs never takes what the pipeline wrote (the audio copy each input keeps, `OUT/<id>/audio.ogg`), so a
rerun plans the one input again and redoes nothing, and an earlier run's output folder under another name
is left out too, and named."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from tests.conftest import MEDIA, ROOT

CLIP = MEDIA / "languages" / "en.ogg"


def pipeline(cwd, *args: str) -> subprocess.CompletedProcess:
    """`bin/pipeline` run inside ``cwd`` (this worktree's code, whatever the current folder)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [str(ROOT / "bin" / "pipeline"), *args], cwd=cwd, capture_output=True, text=True, timeout=600, env=env
    )


@pytest.fixture(scope="module")
def talks(tmp_path_factory):
    """A folder holding one input, processed twice from inside it: with the default output (./out), then
    with `--output out` (the same folder)."""
    talks = tmp_path_factory.mktemp("talks")
    shutil.copy(CLIP, talks / "talk.ogg")
    runs = [pipeline(talks, "process", ".", "--no-speakers", *extra) for extra in ([], ["--output", "out"])]
    for done in runs:
        assert done.returncode == 0, done.stderr[-3000:]
    return talks, runs


@pytest.mark.slow
def test_a_rerun_plans_the_one_input_and_redoes_nothing(talks):
    folder, runs = talks
    assert (folder / "out" / folder.name / "talk" / "audio.ogg").is_file(), "the audio copy the rerun meets"
    report = json.loads((folder / "out" / "run-report.json").read_text())
    assert [item["source"] for item in report["inputs"]] == ["talk.ogg"], report["inputs"]
    assert {s["status"] for s in report["inputs"][0]["stages"].values()} == {"reused"}
    ids = json.loads((folder / "out" / ".ids.json").read_text())
    assert list(ids.values()) == [f"{folder.name}/talk"], "no id for a file of the output"
    assert not (folder / "out" / "out").exists() and not (folder / "out" / folder.name / "out").exists()
    assert runs[1].stderr.count("skipped out: the pipeline's output") == 1, runs[1].stderr[-3000:]


@pytest.mark.slow
def test_an_earlier_output_folder_under_another_name_is_skipped_and_named(talks):
    folder, _ = talks
    old = folder / "old-results"
    shutil.copytree(folder / "out", old, symlinks=True)  # an earlier run's output, since moved in here
    try:
        done = pipeline(folder, "process", ".", "--no-speakers", "--dry-run")
        assert done.returncode == 0, done.stderr[-3000:]
        lines = done.stdout.splitlines()
        assert lines[0].startswith("1 input(s): 1 complete, 0 with work to do"), done.stdout
        assert sorted(line for line in lines if line.startswith("skipped ")) == [
            "skipped old-results: the pipeline's output, not an input",
            "skipped out: the pipeline's output, not an input",
        ], done.stdout
        # a new output folder elsewhere: the one input is new work; neither output folder is an input
        fresh = pipeline(folder, "process", ".", "--no-speakers", "--dry-run", "--output", "../elsewhere")
        assert fresh.returncode == 0, fresh.stderr[-3000:]
        assert fresh.stdout.startswith("1 input(s): 0 complete, 1 with work to do"), fresh.stdout
        assert not (folder.parent / "elsewhere").exists(), "a dry run writes nothing"
    finally:
        shutil.rmtree(old)
