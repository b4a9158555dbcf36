"""A run's Indexer: what the catalogue holds is read once, so chunks whose inputs are indexed as they are (a
resumed run's) commit nothing; an input no longer complete is dropped, once."""

from __future__ import annotations

from orchestrator.catalogue.store import INPUTS, Catalogue
from orchestrator.catalogue.sync import Indexer
from tests.orchestrator.catalogue.test_store import rows


def versions(out) -> int:
    return Catalogue(out).db.open_table(INPUTS).version


def test_chunks_indexed_as_they_are_cost_no_commit_and_a_changed_input_is_redone(tmp_path):
    Catalogue(tmp_path).put([rows(f"in{n}", [f"text {n}"], fingerprint=f"fp{n}") for n in range(6)])
    before = versions(tmp_path)
    indexer = Indexer(tmp_path)
    for first in (0, 3):  # two chunks of a resumed run: every input as the catalogue holds it
        indexer.chunk_done({f"in{n}": f"fp{n}" for n in range(first, first + 3)}, {})
    assert versions(tmp_path) == before and indexer.failed == 0
    # an input no longer complete (a later run failed it): dropped, the others left as they are
    indexer.chunk_done({"in1": None, "in2": "fp2"}, {})
    assert indexer.failed == 0 and versions(tmp_path) > before
    assert set(Catalogue(tmp_path).indexed()) == {"in0", "in2", "in3", "in4", "in5"}
    # the indexer knows it is gone: the same chunk again commits nothing
    after = versions(tmp_path)
    indexer.chunk_done({"in1": None, "in2": "fp2"}, {})
    assert versions(tmp_path) == after
