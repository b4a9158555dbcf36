"""Filtered searches by meaning (real LanceDB in a temp folder, the vector index forced on a small table): the
scalar indexes of the filtered columns, the exact path for a filter that keeps few rows and the vector
index's path for one that keeps many give the rows an exact search over the kept rows gives."""

from __future__ import annotations

import numpy as np
import pytest

from orchestrator.catalogue import store
from orchestrator.catalogue.rows import InputRows
from orchestrator.catalogue.search import Filters
from orchestrator.catalogue.store import Catalogue

DIM = 32
MODEL = "model-f"


def corpus(first: int, inputs: int, speakers: list[str], seed: int) -> list[InputRows]:
    """``inputs`` inputs of 40 segments under folders ``talks/<year>``, speakers and languages mixed."""
    rng = np.random.default_rng(seed)
    batch = []
    for n in range(first, first + inputs):
        item = f"talks/{2020 + n % 3}/{n:04d}"
        vectors = rng.normal(size=(40, DIM)).astype(np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        segments = []
        for s in range(40):
            speaker = speakers[int(rng.integers(len(speakers)))]
            segments.append(
                {
                    "input": item,
                    "folder": item.rpartition("/")[0],
                    "segment": s,
                    "start": float(s),
                    "end": s + 0.9,
                    "speaker": speaker,
                    "file_speaker": "SPEAKER_00",
                    "corpus_speaker": speaker,
                    "language": "de" if rng.random() < 0.1 else "en",
                    "text": f"line {s} of {item}",
                    "model": MODEL,
                }
            )
        record = {
            "input": item,
            "folder": item.rpartition("/")[0],
            "status": "ok",
            "duration_s": 40.0,
            "language": "en",
            "languages": "de,en",
            "asr_model": "whisper",
            "embedding_model": MODEL,
            "segments": 40,
            "fingerprint": "fp",
        }
        batch.append(InputRows(record, segments, vectors))
    return batch


def exact(batch: list[InputRows], query: np.ndarray, keep, k: int = 10) -> list[tuple[str, int]]:
    """The ``k`` rows nearest ``query`` among those ``keep`` keeps, by numpy."""
    rows = [(s, v) for b in batch for s, v in zip(b.segments, b.vectors) if keep(s)]
    order = np.argsort(-np.array([float(v @ query) for _, v in rows]), kind="stable")[:k]
    return [(rows[i][0]["input"], rows[i][0]["segment"]) for i in order]


def unit(rng) -> np.ndarray:
    vector = rng.normal(size=DIM).astype(np.float32)
    return vector / np.linalg.norm(vector)


def found(catalogue: Catalogue, query: np.ndarray, filters: Filters) -> list[tuple[str, int]]:
    return [(r["input"], r["segment"]) for r in catalogue.meaning(query, MODEL, filters.where(), 10)]


#: (filters, what they keep): a speaker, a language, a folder, an input, two at once
FILTERS = [
    (Filters(speaker="S03"), lambda s: s["corpus_speaker"] == "S03"),
    (Filters(language="de"), lambda s: s["language"] == "de"),
    (Filters(under="talks/2021"), lambda s: s["folder"] == "talks/2021"),
    (Filters(input="talks/2020/0030"), lambda s: s["input"] == "talks/2020/0030"),
    (Filters(speaker="S05", language="en"), lambda s: s["corpus_speaker"] == "S05" and s["language"] == "en"),
]


@pytest.fixture
def indexed(tmp_path, monkeypatch):
    """A catalogue of 3,000 segments with its vector index and filter indexes (built from 1,000 rows here)."""
    monkeypatch.setattr(store, "VECTOR_INDEX_ROWS", 1_000)
    batch = corpus(0, 75, [f"S{n:02d}" for n in range(1, 11)], seed=1)
    catalogue = Catalogue(tmp_path)
    catalogue.put(batch)
    catalogue.maintain()
    return catalogue, batch


def test_a_filter_that_keeps_few_rows_finds_what_an_exact_search_over_them_finds(indexed):
    # Given a catalogue whose vector index and filter indexes are built
    catalogue, batch = indexed
    table = catalogue.db.open_table(catalogue.table_of(MODEL))
    columns = {column for index in table.list_indices() for column in index.columns}
    assert set(store.FILTER_INDEXES) | {"vector", "text"} <= columns
    plan = (
        table.search(batch[0].vectors[0]).where(Filters(speaker="S03").where(), prefilter=True).explain_plan()
    )
    assert "ScalarIndexQuery" in plan, plan  # the filter is answered by the indexes, not by a scan
    rng = np.random.default_rng(9)
    for filters, keep in FILTERS:  # each keeps at most EXACT_ROWS of the 3,000 rows: the exact path
        for _ in range(3):
            query = unit(rng)
            # When a filtered search is made, then its hits are the exact search's over the rows it keeps
            assert found(catalogue, query, filters) == exact(batch, query, keep), filters


def test_a_filter_that_keeps_many_rows_searches_them_through_the_vector_index(indexed, monkeypatch):
    # Given the same catalogue, where every filter counts as keeping many rows (EXACT_ROWS 0)
    catalogue, batch = indexed
    monkeypatch.setattr(store, "EXACT_ROWS", 0)
    segments = {(s["input"], s["segment"]): s for b in batch for s in b.segments}
    rng = np.random.default_rng(9)
    recall = []
    for filters, keep in FILTERS:
        for _ in range(3):
            query = unit(rng)
            hits = found(catalogue, query, filters)
            # Then every hit is a row the filter keeps, and nearly all are the exact search's (IVF-PQ's
            # approximation on random vectors)
            assert hits and all(keep(segments[hit]) for hit in hits), filters
            recall.append(len(set(hits) & set(exact(batch, query, keep))) / 10)
    assert np.mean(recall) >= 0.9, recall


def test_rows_added_after_the_indexes_are_found_by_a_filter_before_and_after_upkeep(indexed):
    # Given an indexed catalogue and a new input whose only speaker is new, not yet in the filter indexes
    catalogue, batch = indexed
    new = corpus(100, 1, ["S99"], seed=2)
    catalogue.put(new)
    query = new[0].vectors[7]
    want = exact(new, query, lambda s: True)
    # When a search filters on the new speaker, then it finds the new rows, before and after the upkeep
    assert found(catalogue, query, Filters(speaker="S99")) == want
    catalogue.maintain()
    assert found(catalogue, query, Filters(speaker="S99")) == want
    assert found(catalogue, query, Filters(speaker="S99", language="fr")) == []
