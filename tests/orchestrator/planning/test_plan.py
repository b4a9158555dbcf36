"""Planning at corpus scale: ids by construction, duplicates, credentials, the index."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from orchestrator import layout
from orchestrator.planning.inputs import (
    Found,
    assign_ids,
    find_inputs,
    load_ids,
    plan_inputs,
    save_ids,
    source_key,
)
from tests.conftest import ROOT
from tests.fixtures.generate import speech, write_wav


def _corpus(root, names):
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(b"x")
    return root


def test_a_folder_corpus_keeps_its_relative_paths_as_ids(tmp_path):
    # Given the layout that collided by chance: <meeting>/audio.wav, thousands of times
    meetings = _corpus(
        tmp_path / "meetings",
        [f"{n:06d}/audio.wav" for n in range(2000)] + ["016437/audio.wav", "016437/Audio.WAV"],
    )
    # When it is planned
    found = find_inputs([meetings])
    ids = assign_ids(found)
    # Then every id mirrors the corpus, readable, and no two are equal in any case
    assert ids[0] == "meetings/000000/audio"
    assert {i for i in ids if i.startswith("meetings/016437/")} == {
        "meetings/016437/Audio",
        "meetings/016437/audio-2",
    }
    assert len({i.lower() for i in ids}) == len(ids) == 2002
    assert all(i.startswith("meetings/") for i in ids)
    assert "meetings/001999/audio" in ids
    assert not any("-" in i.split("/")[-1] for i in ids if not i.startswith("meetings/016437/")), (
        "no suffix needed"
    )


def test_clashes_left_get_a_suffix_that_is_checked_free(tmp_path):
    a = _corpus(tmp_path / "a" / "talks", ["x.wav", "x-2.wav"])
    b = _corpus(tmp_path / "b" / "talks", ["x.wav"])
    loose = tmp_path / "talks.wav"
    loose.write_bytes(b"x")
    ids = assign_ids(find_inputs([a, b, loose]))
    # the second folder named "talks" would reuse talks/x: its suffix skips "x-2", which a file holds
    assert ids == ["talks/x-2", "talks/x", "talks/x-3", "talks-2"], ids
    # an id never sits inside another input's folder: the loose "talks" did not take the folder's place


def test_an_id_never_takes_a_run_level_name_whatever_is_added_later(tmp_path, monkeypatch):
    files = [tmp_path / f"{name}.wav" for name in sorted(layout.RUN_LEVEL)]
    ids = assign_ids([Found(f, (f.stem,)) for f in files])
    assert not any(layout.reserved(i) for i in ids)
    # a run-level name added to the layout is reserved at once: there is no second list to keep in step
    monkeypatch.setattr(layout, "_LOWER", layout._LOWER | {"summary.pdf"})
    [new] = assign_ids([Found(tmp_path / "summary.pdf.wav", ("summary.pdf",))])
    assert new == "summary.pdf-2"


def test_the_same_source_given_twice_is_one_input_with_a_note(tmp_path):
    corpus = _corpus(tmp_path / "talks", ["a.wav", "b.wav"])
    link = tmp_path / "alias.wav"
    link.symlink_to(corpus / "a.wav")
    out = tmp_path / "out"
    inputs = plan_inputs([corpus, corpus / "a.wav", str(corpus / "b.wav"), corpus / "b.wav", link], out)
    assert [i.id for i in inputs] == ["talks/a", "talks/b"]
    assert inputs[0].notes == (f"given 3 times (also as {corpus / 'a.wav'}, {link}); processed once",)
    assert "given 3 times" in inputs[1].notes[0]


def test_credentials_are_never_stored_and_a_password_change_is_the_same_source(tmp_path):
    out = tmp_path / "out"
    [first] = plan_inputs(["sftp://alice:secret@127.0.0.1:1/talks/talk.wav"], out)
    index = (out / layout.IDS).read_text()
    assert "secret" not in index and "alice" not in index
    assert first.shown == "sftp://alice:***@127.0.0.1:1/talks/talk.wav"
    [again] = plan_inputs(["sftp://alice:changed@127.0.0.1:1/talks/talk.wav"], out)
    assert again.id == first.id == "talk"
    assert source_key("sftp://bob:x@127.0.0.1:1/talks/talk.wav") == "sftp://127.0.0.1:1/talks/talk.wav"


def test_an_earlier_versions_index_still_wins_and_its_shared_ids_are_split(tmp_path):
    out = tmp_path / "out"
    one, two = tmp_path / "meetings" / "016437" / "audio.wav", tmp_path / "meetings" / "038347" / "audio.wav"
    _corpus(tmp_path / "meetings", ["016437/audio.wav", "038347/audio.wav"])
    # an index as earlier versions wrote it: a hashed id that two sources shared, and credentials
    save_ids(
        out,
        {
            source_key(one): "audio-085936de",
            source_key(two): "audio-085936de",
            "sftp://alice:secret@host/x.wav": "x",
        },
    )
    assert load_ids(out) == {source_key(one): "audio-085936de", "sftp://host/x.wav": "x"}
    inputs = plan_inputs([tmp_path / "meetings"], out)
    assert [i.id for i in inputs] == ["audio-085936de", "meetings/038347/audio"]
    assert "secret" not in (out / layout.IDS).read_text()


def test_odd_directory_arguments_name_their_inputs(tmp_path, monkeypatch):
    corpus = _corpus(tmp_path / "corpus", ["x.wav", ".hidden/y.wav", os.fsdecode(b"caf\xe9/z.wav")])
    monkeypatch.chdir(corpus)
    ids = assign_ids(find_inputs(["."]))
    assert ids == ["corpus/hidden/y", "corpus/caf_/z", "corpus/x"]


def test_the_walk_leaves_out_every_output_folder_and_names_each_once(tmp_path, monkeypatch):
    # Given a folder of talks holding this run's output, an earlier run's under another name, and a
    # folder whose name looks like output but is not one (no marker)
    talks = _corpus(
        tmp_path / "talks",
        ["talk.wav", "out/talks/talk/audio.ogg", "old/talks/talk/audio.ogg", "results/x.wav"],
    )
    (talks / "old" / layout.RUNS).mkdir()
    monkeypatch.chdir(talks)
    skipped: list[str] = []
    # When it is planned from inside, twice (the first run made ./out an output folder)
    first = plan_inputs(["."], tmp_path / "talks" / "out", skipped=skipped)
    again = plan_inputs([".", "."], tmp_path / "talks" / "out", skipped=skipped)
    # Then only the talks are inputs, and each output folder is named once per plan
    assert [i.id for i in first] == [i.id for i in again] == ["talks/results/x", "talks/talk"]
    assert skipped == ["old", "out"] * 2
    # and a walk that starts in an input's folder of an output folder takes nothing
    assert [f.source for f in find_inputs(["out/talks"])] == [Path("out/talks")]


def test_an_output_folder_that_is_the_input_folder_keeps_its_inputs_and_not_its_outputs(tmp_path):
    # Given `process talks --output talks` run once: the inputs' folders and .runs sit among the talks
    talks = _corpus(tmp_path / "talks", ["talk.wav", "b/talk.wav"])
    first = plan_inputs([talks], talks)
    (talks / layout.RUNS / "run").mkdir(parents=True)
    for inp in first:
        (inp.directory / "audio.ogg").parent.mkdir(parents=True, exist_ok=True)
        (inp.directory / "audio.ogg").write_bytes(b"x")
    # When it is planned again, Then the same inputs, none of the pipeline's files
    assert [i.source for i in plan_inputs([talks], talks)] == [talks / "b" / "talk.wav", talks / "talk.wav"]
    assert [i.id for i in first] == ["talks/b/talk", "talks/talk"]


@pytest.mark.slow
def test_a_corpus_of_same_named_files_and_repeated_arguments_through_bin_pipeline(tmp_path):
    """With real children: three meetings' audio.wav of different lengths, the
    folder and one file given again. Each comes out in its own folder with its own transcript; the
    repeated file is one input with a note, and a rerun reuses everything."""
    voice = speech()
    meetings = tmp_path / "meetings"
    lengths = {"016437": 1.5, "038347": 2.5, "500000": 3.5}
    for name, seconds in lengths.items():
        write_wav(meetings / name / "audio.wav", voice[: int(seconds * 16000)], 16000)
    out = tmp_path / "out"
    args = [
        str(ROOT / "bin" / "pipeline"),
        "process",
        str(meetings),
        str(meetings / "038347" / "audio.wav"),
        str(meetings / "038347" / "audio.wav"),
        "--output",
        str(out),
        "--no-speakers",
        "--offline",
        "--embedding-profile",
        "embedded",
    ]
    done = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((out / layout.REPORT).read_text())
    assert [i["id"] for i in report["inputs"]] == [f"meetings/{n}/audio" for n in lengths]
    for name, seconds in lengths.items():
        transcript = json.loads((out / "meetings" / name / "audio" / "transcript.json").read_text())
        assert transcript["duration_s"] == pytest.approx(seconds, abs=0.01), "each folder holds its own input"
    [note] = report["inputs"][1]["notes"]
    assert note.startswith("given 3 times") and note.endswith("processed once")
    again = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    rerun = json.loads((out / layout.REPORT).read_text())
    assert all(s["attempts"] == [] for s in rerun["stages"]), "a rerun starts no child"


def test_ids_do_not_depend_on_the_order_the_sources_are_given_in(tmp_path):
    """The chaos test gives its files shuffled: which of Talk.wav and talk.wav gets the suffix must not change."""
    files = [tmp_path / "odd" / name for name in ("talk.wav", "Talk.wav", "x.wav")] + [
        tmp_path / "other" / "x.wav"
    ]
    found = [Found(f, (f.stem,)) for f in files]
    forward = dict(zip(files, assign_ids(found)))
    backward = dict(zip(reversed(files), assign_ids(list(reversed(found)))))
    assert forward == backward
    assert (
        forward[tmp_path / "odd" / "Talk.wav"] == "Talk"
        and forward[tmp_path / "odd" / "talk.wav"] == "talk-2"
    )


#: a pre-signed URL (AWS SigV4) of one object on a host that refuses at once, under two signatures
_SIGNED = (
    "https://127.0.0.1:1/bucket/talks/talk.wav?versionId=7&X-Amz-Algorithm=AWS4-HMAC-SHA256"
    "&X-Amz-Credential=AKIAEXAMPLE%2F20260101%2Fus-east-1%2Fs3%2Faws4_request&X-Amz-Date=20260101T000000Z"
    "&X-Amz-Expires=3600&X-Amz-SignedHeaders=host&X-Amz-Security-Token=SESSIONTOKEN&X-Amz-Signature={}"
)


def test_a_new_signature_of_the_same_object_keeps_its_id_and_no_signature_is_stored(tmp_path):
    out = tmp_path / "out"
    [first] = plan_inputs([_SIGNED.format("aaaasig1")], out)
    index = (out / layout.IDS).read_text()
    assert not any(secret in index for secret in ("aaaasig1", "SESSIONTOKEN", "AKIAEXAMPLE", "X-Amz"))
    assert "versionId=7" in index  # what tells objects apart stays
    assert "aaaasig1" not in first.shown and "SESSIONTOKEN" not in first.shown
    assert "X-Amz-Signature=***" in first.shown
    [again] = plan_inputs([_SIGNED.format("bbbbsig2")], out)
    assert again.id == first.id == "talk"  # not talk-2
    assert again.url == _SIGNED.format("bbbbsig2")  # what is fetched still carries its signature
    # the same object given under two signatures in one run is one input
    assert len(plan_inputs([_SIGNED.format("c"), _SIGNED.format("d")], out)) == 1


def test_an_earlier_index_with_signed_urls_keeps_the_first_id_and_loses_the_signatures(tmp_path):
    out = tmp_path / "out"
    save_ids(out, {_SIGNED.format("aaaasig1"): "talk", _SIGNED.format("bbbbsig2"): "talk-2"})
    [inp] = plan_inputs([_SIGNED.format("ccccsig3")], out)
    assert inp.id == "talk"
    assert "sig1" not in (out / layout.IDS).read_text()
