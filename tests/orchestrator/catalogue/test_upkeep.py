"""The catalogue's upkeep: which index deltas are merged (a pure rule), a real table tidied, and a run's upkeep
in a child process."""

from __future__ import annotations

import lance

from orchestrator.catalogue import store
from orchestrator.catalogue.store import Catalogue, upkeep_in_child
from orchestrator.catalogue.upkeep import merge_count
from tests.orchestrator.catalogue.test_store import rows


def test_new_rows_merge_with_the_newest_deltas_only_while_they_are_not_much_smaller():
    assert merge_count(2_000, []) == 0
    assert merge_count(2_000, [1_000_000]) == 0  # a big index is not rewritten for a chunk
    assert merge_count(2_000, [2_000, 4_000, 1_000_000]) == 2  # 4k merged >= 2k, 8k >= 4k; not 1M
    assert merge_count(600_000, [1_000_000]) == 1  # enough new rows: one index again
    assert merge_count(40_000, [40_000, 120_000, 400_000]) == 3  # 80k >= 60k, 200k >= 200k
    assert merge_count(40_000, [40_000, 120_000, 400_000], ratio=1.0) == 1


def test_a_row_is_merged_a_logarithmic_number_of_times():
    deltas: list[int] = []  # newest first
    merges = 0
    for _ in range(1_000):  # a thousand upkeeps of 40,000 new rows each
        k = merge_count(40_000, deltas)
        merges += sum(deltas[:k])
        deltas = [40_000 + sum(deltas[:k]), *deltas[k:]]
    assert len(deltas) <= 12  # an index of 40 million rows in a dozen deltas at most
    assert merges / 40_000_000 <= 12  # each row merged again about log2(1000) times, not 1000


def test_tidying_compacts_the_chunks_and_indexes_their_rows_without_losing_any(tmp_path):
    catalogue = Catalogue(tmp_path)
    for n in range(6):
        catalogue.put([rows(f"f/{n}", [f"sentence {n} about harbours", "another line"])])
    table = catalogue.db.open_table(catalogue.segment_tables()[0])
    before = len(table.to_lance().get_fragments())
    catalogue.maintain()
    table = catalogue.db.open_table(catalogue.segment_tables()[0])
    dataset = lance.dataset(table.to_lance().uri)
    assert len(dataset.get_fragments()) < before
    assert dataset.stats.index_stats("text_idx")["num_unindexed_rows"] == 0
    assert table.count_rows() == 12
    hits = catalogue.words("harbours", None, 10)
    assert sorted(hit["input"] for hit in hits) == [f"f/{n}" for n in range(6)]


def test_a_writer_does_its_upkeep_in_a_child_process_whose_memory_goes_with_it(tmp_path, monkeypatch):
    def not_here(self):
        raise AssertionError("the upkeep ran in the writer's process")

    monkeypatch.setattr(Catalogue, "maintain", not_here)  # this process only: the child has its own
    monkeypatch.setattr(store, "OPTIMIZE_EVERY", 3)
    catalogue = Catalogue(tmp_path, upkeep_in_child=True)
    for n in range(3):  # the third commit's upkeep: a child
        catalogue.put([rows(f"f/{n}", [f"sentence {n} about harbours", "another line"])])
    table = catalogue.db.open_table(catalogue.segment_tables()[0])
    dataset = lance.dataset(table.to_lance().uri)
    assert len(dataset.get_fragments()) < 3  # the three chunks' fragments compacted, by the child
    assert dataset.stats.index_stats("text_idx")["num_unindexed_rows"] == 0
    assert table.count_rows() == 6


def test_an_upkeep_child_that_fails_is_a_warning_and_the_data_stays(tmp_path, caplog):
    catalogue = Catalogue(tmp_path)
    catalogue.put([rows("f/0", ["a line"])])
    (tmp_path / ".catalogue" / "inputs.lance" / "_versions").rename(tmp_path / "hidden")  # unreadable table
    assert not upkeep_in_child(tmp_path)
    assert "upkeep child exited 1" in caplog.text
    (tmp_path / "hidden").rename(tmp_path / ".catalogue" / "inputs.lance" / "_versions")
    assert Catalogue(tmp_path).indexed() == {"f/0": "fp1"}
