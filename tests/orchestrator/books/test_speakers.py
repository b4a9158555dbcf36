"""The corpus speakers' store: a chunk writes what it places; what a kill leaves reads as a consistent corpus;
an earlier version's speakers.json is brought in; a rebuilt catalogue keeps the speakers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from contracts import save_model
from contracts.corpus import CorpusSpeakers
from orchestrator.books.speakers import MEMBERS, SPEAKERS, SpeakerStore
from orchestrator.catalogue.sync import sync
from orchestrator.corpus.labels import corpus_labels, read_corpus
from orchestrator.corpus.speakers import Voice, assign, export_corpus, save_corpus

ROOT = Path(__file__).resolve().parents[3]
RNG = np.random.default_rng(11)
#: 40 voices far apart (random 192-d directions)
PEOPLE = [v / np.linalg.norm(v) for v in RNG.standard_normal((40, 192))]


def voices(item: str, *people: int) -> list[Voice]:
    out = []
    for n, p in enumerate(people):
        v = PEOPLE[p] + 0.03 * RNG.standard_normal(192)
        out.append(
            Voice(item, f"SPEAKER_{n:02d}", v / np.linalg.norm(v), 5.0 + n, f"fp-{item}", "campplus:x")
        )
    return out


def chunk(first: int, count: int) -> list[Voice]:
    """``count`` inputs, each with two of the 40 voices."""
    return [v for i in range(first, first + count) for v in voices(f"in{i:04d}", i % 40, (i * 7 + 3) % 40)]


def vectors(found: list[Voice]) -> dict:
    return {(v.item_id, v.speaker): v.vector for v in found}


def table_rows(out: Path, name: str) -> int:
    return SpeakerStore(out).db.open_table(name).count_rows()


def test_a_chunk_writes_only_the_rows_it_places_and_reads_back_equal(tmp_path):
    # Given a corpus of 100 inputs saved in the store
    first = chunk(0, 100)
    before = assign(None, first, 0.4).corpus
    save_corpus(tmp_path, before, None, vectors(first))
    assert read_corpus(tmp_path) == before
    # When a chunk of 5 new inputs is placed and saved
    new = chunk(100, 5)
    placed = assign(before, new, 0.4)
    written = SpeakerStore(tmp_path).save(before, placed.corpus, vectors(new))
    # Then only its 10 members and the speakers they joined are written, and the store reads back as placed
    joined = {s.id for s in placed.corpus.speakers if any(m.item_id.startswith("in01") for m in s.members)}
    assert written[MEMBERS] == 10 and written[SPEAKERS] == len(joined) <= 10, written
    assert table_rows(tmp_path, MEMBERS) == 210
    assert read_corpus(tmp_path) == placed.corpus

    # the upkeep joins the small fragments the saves appended, and the store reads the same
    def fragments() -> int:
        return len(SpeakerStore(tmp_path).db.open_table(MEMBERS).to_lance().get_fragments())

    appended = fragments()
    SpeakerStore(tmp_path).tidy()
    assert fragments() == 1 < appended
    assert read_corpus(tmp_path) == placed.corpus
    # and no speakers.json is written by a save (it is an export)
    assert not (tmp_path / "speakers.json").exists()
    # the labels of some inputs are read from their rows alone, as the whole corpus gives them
    labels = corpus_labels(placed.corpus)
    assert SpeakerStore(tmp_path).labels({"in0003", "in0101"}) == {k: labels[k] for k in ("in0003", "in0101")}


def test_name_merge_and_a_replaced_input_are_written_as_changes(tmp_path):
    found = chunk(0, 20)
    corpus = assign(None, found, 0.4).corpus
    save_corpus(tmp_path, corpus, None, vectors(found))
    a, b = corpus.speakers[0], corpus.speakers[1]
    # a name, then a merge (b's members move to a; b is gone and merged into a)
    named = corpus.model_copy(
        update={"speakers": [a.model_copy(update={"name": "Dr. Lee"}), *corpus.speakers[1:]]}
    )
    SpeakerStore(tmp_path).save(corpus, named)
    assert read_corpus(tmp_path) == named
    merged_speaker = named.speakers[0].model_copy(
        update={"members": sorted([*a.members, *b.members], key=lambda m: (m.item_id, m.speaker))}
    )
    merged = CorpusSpeakers(
        encoder=named.encoder,
        distance=named.distance,
        next_id=named.next_id,
        merged={b.id: a.id},
        speakers=[merged_speaker, *named.speakers[2:]],
        updated_at=named.updated_at,
    )
    SpeakerStore(tmp_path).save(named, merged)
    assert read_corpus(tmp_path) == merged
    # an input diarized again: its members are replaced (its old speaker labels are gone)
    redo = [Voice("in0000", "SPEAKER_07", PEOPLE[39], 9.0, "fp-again", "campplus:x")]
    again = assign(
        merged,
        redo,
        0.4,
        vectors=SpeakerStore(tmp_path).vectors(
            (m.item_id, m.speaker) for s in merged.speakers for m in s.members if m.item_id != "in0000"
        ),
    )
    SpeakerStore(tmp_path).save(merged, again.corpus, vectors(redo))
    loaded = read_corpus(tmp_path)
    assert loaded == again.corpus
    assert [
        (m.speaker, m.fingerprint) for s in loaded.speakers for m in s.members if m.item_id == "in0000"
    ] == [("SPEAKER_07", "fp-again")]


def test_a_save_stopped_between_its_tables_reads_as_a_consistent_corpus(tmp_path, monkeypatch):
    found = chunk(0, 30)
    before = assign(None, found, 0.4).corpus
    save_corpus(tmp_path, before, None, vectors(found))
    new = chunk(30, 10) + voices("in9999", 39)
    placed = assign(before, new, 0.4).corpus
    real = SpeakerStore._table

    def dies_at(name):
        def table(self, table_name, schema):
            if table_name == name:
                raise KeyboardInterrupt  # the process dies here
            return real(self, table_name, schema)

        return table

    # stopped after the meta, before the members: the corpus as before (its ids never given again)
    monkeypatch.setattr(SpeakerStore, "_table", dies_at(MEMBERS))
    with pytest.raises(KeyboardInterrupt):
        SpeakerStore(tmp_path).save(before, placed, vectors(new))
    loaded = read_corpus(tmp_path)
    assert loaded.speakers == before.speakers and loaded.next_id == placed.next_id
    # stopped after the members, before the speakers: members as placed, centroids made from their voices
    monkeypatch.setattr(SpeakerStore, "_table", dies_at(SPEAKERS))
    with pytest.raises(KeyboardInterrupt):
        SpeakerStore(tmp_path).save(before, placed, vectors(new))
    loaded = read_corpus(tmp_path)
    members = lambda c: {(m.item_id, m.speaker): s.id for s in c.speakers for m in s.members}  # noqa: E731
    assert members(loaded) == members(placed)
    for got, want in zip(loaded.speakers, placed.speakers, strict=True):
        assert float(np.dot(got.centroid, want.centroid)) > 0.99, got.id
    # the next save, from what was read, leaves the store as placed
    monkeypatch.setattr(SpeakerStore, "_table", real)
    SpeakerStore(tmp_path).save(loaded, placed)
    assert members(read_corpus(tmp_path)) == members(placed)


KILLED = textwrap.dedent(
    """
    import sys
    import numpy as np
    sys.path.insert(0, {root!r})
    from tests.orchestrator.books.test_speakers import chunk, vectors
    from orchestrator.corpus.labels import read_corpus
    from orchestrator.corpus.speakers import assign, save_corpus
    out = {out!r}
    corpus = read_corpus(out)
    start = sum(len({{m.item_id for m in s.members}}) for s in corpus.speakers) if corpus else 0
    for n, first in enumerate(range(1000 + start, 100000, 8)):
        new = chunk(first, 8)
        placed = assign(corpus, new, 0.4).corpus
        save_corpus(out, placed, corpus, vectors(new))
        corpus = placed
        if n == 0:
            print("ready", flush=True)  # one save done: the kill lands in a later one
    """
)


def test_kill_9_during_saves_leaves_a_store_that_loads_whole(tmp_path):
    """A real SIGKILL at random moments of chunk after chunk of saves: each time the store loads, validates,
    and every input has all of its speakers placed or none."""
    rng = np.random.default_rng(5)
    for attempt in range(3):
        child = subprocess.Popen(
            [sys.executable, "-c", KILLED.format(root=str(ROOT), out=str(tmp_path))],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        assert child.stdout.readline().strip() == "ready"
        time.sleep(float(rng.uniform(0.3, 2.0)))
        child.send_signal(signal.SIGKILL)
        child.wait()
        corpus = read_corpus(tmp_path)  # validated: ids unique, members once, centroids unit
        assert corpus is not None and corpus.speakers, attempt
        placed: dict[str, int] = {}
        for s in corpus.speakers:
            for m in s.members:
                placed[m.item_id] = placed.get(m.item_id, 0) + 1
        assert set(placed.values()) == {2}, (attempt, [i for i, n in placed.items() if n != 2])


def test_an_earlier_versions_speakers_json_is_brought_in_and_a_rebuild_keeps_the_store(tmp_path):
    # Given a folder whose corpus an earlier version kept in speakers.json, with a name and a merge
    found = chunk(0, 6)
    corpus = assign(None, found, 0.4).corpus
    first = corpus.speakers[0].model_copy(update={"name": "Host"})
    corpus = corpus.model_copy(
        update={"speakers": [first, *corpus.speakers[1:]], "merged": {"S0099": first.id}}
    )
    corpus = CorpusSpeakers.model_validate({**corpus.model_dump(), "next_id": 100})
    save_model(corpus, tmp_path / "speakers.json")
    exported = (tmp_path / "speakers.json").read_bytes()
    assert read_corpus(tmp_path) == corpus and not SpeakerStore(tmp_path).exists()
    # When the next chunk is placed
    new = chunk(6, 2)
    placed = assign(corpus, new, 0.4).corpus
    save_corpus(tmp_path, placed, corpus, vectors(new))
    # Then the store holds the whole corpus (name, merge, next id kept) and the file is left as it was
    assert read_corpus(tmp_path) == placed and placed.speakers[0].name == "Host" and placed.next_id >= 100
    assert (tmp_path / "speakers.json").read_bytes() == exported
    # a rebuilt catalogue keeps the corpus speakers (a person's names and merges are not derived)
    sync(tmp_path, rebuild=True)
    assert read_corpus(tmp_path) == placed
    export_corpus(tmp_path, placed)
    assert json.loads((tmp_path / "speakers.json").read_text())["speakers"][0]["name"] == "Host"
