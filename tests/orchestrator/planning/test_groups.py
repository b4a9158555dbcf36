"""Join groups: fixed once per output folder, chunks of whole groups (orchestrator/planning/groups.py)."""

from __future__ import annotations

import json

from contracts import WorkItem
from contracts.artifacts import VocabularyFile, terms_sha256
from orchestrator import layout
from orchestrator.planning.groups import (
    GROUP_KEY,
    MEMBERS_KEY,
    assign_groups,
    load_groups,
    plan_groups,
    whole_group_chunks,
    with_groups,
)
from orchestrator.planning.inputs import Input
from orchestrator.planning.state import InputState
from orchestrator.planning.vocabulary import TermStore
from stages.whisper.windows import group_members


def test_new_inputs_form_groups_in_the_planned_order_and_known_ones_keep_theirs():
    ids = [f"c{n:02d}" for n in range(10)]
    first = assign_groups(ids, {}, size=4)
    assert [first[i] for i in ids] == ["g1"] * 4 + ["g2"] * 4 + ["g3"] * 2
    # one more file, planned between two others: the others keep their groups, it gets a new one
    more = ids[:5] + ["new"] + ids[5:]
    again = assign_groups(more, first, size=4)
    assert {i: again[i] for i in ids} == first and again["new"] == "g4"


def test_the_groups_are_recorded_once_and_read_back(tmp_path):
    ids = ["a", "b", "c"]
    groups = plan_groups(tmp_path, ids)
    assert load_groups(tmp_path) == groups and set(groups.values()) == {"g1"}
    stamp = layout.path(tmp_path, layout.JOIN_GROUPS).stat().st_mtime_ns
    assert plan_groups(tmp_path / "other", ids, size=2, dry=True) == {"a": "g1", "b": "g1", "c": "g2"}
    assert plan_groups(tmp_path, ["c", "a"]) == {"c": "g1", "a": "g1"}  # nothing new: not written again
    assert layout.path(tmp_path, layout.JOIN_GROUPS).stat().st_mtime_ns == stamp
    assert plan_groups(tmp_path, ["z"], dry=True) == {"z": "g2"} and "z" not in load_groups(tmp_path)
    layout.path(tmp_path, layout.JOIN_GROUPS).write_text("not json")
    assert load_groups(tmp_path) == {}


def test_chunks_hold_whole_groups_whatever_the_chunk_size():
    group_of = {f"c{n}": f"g{n // 3}" for n in range(8)}  # g0: c0-c2, g1: c3-c5, g2: c6-c7
    items = list(group_of)
    for size in (1, 2, 3, 4, 5, 7, 100):
        chunks = whole_group_chunks(items, group_of.get, size)
        assert [i for chunk in chunks for i in chunk] == items
        for chunk in chunks:  # every group of a chunk has all its members in it
            assert all(j in chunk for i in chunk for j in items if group_of[j] == group_of[i]), (size, chunks)
            assert len(chunk) <= max(size, 3)
    # members of one group apart in the planned order (a file added later) come together
    assert whole_group_chunks(["a", "x", "b"], {"a": "g1", "x": "g2", "b": "g1"}.get, 2) == [
        ["a", "b"],
        ["x"],
    ]


def test_work_items_name_their_group_and_all_its_members_audio_and_vocabulary(tmp_path):
    terms = VocabularyFile(level="folder", path=str(tmp_path / "vocabulary.txt"), terms=["Okonkwo"])
    states = [
        InputState(
            Input(
                id=i,
                source=tmp_path / f"{i}.wav",
                directory=tmp_path / i,
                vocabulary=(terms,) if i == "a" else (),
            )
        )
        for i in "abc"
    ]
    for state, group in zip(states, ["g1", "g1", "g2"]):
        state.group = group
    items = [WorkItem(id=s.id, inputs={"audio": "x"}, output="o", fingerprint="f") for s in states[1:]]
    out = with_groups(items, states[1:], states)  # "a" has nothing left to do: it is named all the same
    # a member not asked for carries its vocabulary: it shares the windows it shared when it was asked for
    members = json.loads(out[0].inputs[MEMBERS_KEY])
    assert out[0].inputs[GROUP_KEY] == "g1" and [m[:2] for m in members] == [
        ["a", str(tmp_path / "a" / ".work" / "audio.json")],
        ["b", str(tmp_path / "b" / ".work" / "audio.json")],
    ]
    assert [[VocabularyFile.model_validate(f) for f in m[2]] for m in members] == [[terms], []]
    assert out[1].inputs[GROUP_KEY] == "g2" and [m[0] for m in json.loads(out[1].inputs[MEMBERS_KEY])] == [
        "c"
    ]


def test_a_join_groups_members_name_their_vocabulary_by_reference_written_once_a_run(tmp_path):
    """Given ten short inputs of one join group under a folder vocabulary of 1,000 names, each work item
    lists the group's members with the vocabulary by reference: small, and the terms written once."""
    names = [f"Surname{n:04d}" for n in range(1_000)]
    folder = VocabularyFile(level="folder", path=str(tmp_path / "vocabulary.txt"), terms=names)
    states = [
        InputState(
            Input(
                id=f"c{n}", source=tmp_path / f"c{n}.wav", directory=tmp_path / f"c{n}", vocabulary=(folder,)
            )
        )
        for n in range(10)
    ]
    for state in states:
        state.group = "g"
    items = [WorkItem(id=s.id, inputs={"audio": "x"}, output="o", fingerprint="f") for s in states]
    store = TermStore(tmp_path / "run" / "vocabulary")
    out = with_groups(items, states, states, store)
    request = sum(len(item.model_dump_json()) for item in out)
    assert request < 60_000, request  # with the terms: 10 items x 10 members x 1,000 names, 1.5 MB
    (written,) = (tmp_path / "run" / "vocabulary").iterdir()
    assert json.loads(written.read_text()) == names
    members = group_members(out[3])
    assert [m[0] for m in members] == [s.id for s in states]
    ref = members[0][2][0]
    assert ref.terms == [] and ref.terms_file == str(written) and ref.count == 1_000
    assert ref.sha256 == terms_sha256(names) and written.name == f"{ref.sha256}.json"
