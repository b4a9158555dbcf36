"""Upkeep of the catalogue's Lance tables at a cost that follows what is new, not what the table holds.

LanceDB's ``Table.optimize()`` compacts every fragment smaller than a million rows and merges new rows into
each index's last version, so at 400,000 segments one upkeep took 12 s (bench/search.py): the cost of a
chunk grew with the corpus. The Lance dataset API under it says how:

- compaction joins only the fragments below :data:`FRAGMENT_ROWS` rows (the chunks appended since the last
  upkeep); the big ones are left as they are;
- an index gets the new rows as a *delta* of its own, and the newest deltas are merged only while what is
  merged is at least :data:`MERGE_RATIO` of the next one (:func:`merge_count`), so a row is merged again a
  logarithmic number of times and an index holds a logarithmic number of deltas;
- versions older than :data:`KEEP_VERSIONS` are deleted: a reader kept open moves to the latest within a
  second (``store.READ_CONSISTENCY``), and LanceDB's default (a week) held ten times the live data.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import timedelta

log = logging.getLogger(__name__)

#: fragments below this many rows are compacted together; bigger ones are left as they are
FRAGMENT_ROWS = 100_000
#: an index's newest deltas are merged with the new rows while what is merged is at least this share of
#: the next delta
MERGE_RATIO = 0.5
#: table versions older than this are deleted
KEEP_VERSIONS = timedelta(minutes=10)


def merge_count(new_rows: int, deltas: Sequence[int], ratio: float = MERGE_RATIO) -> int:
    """How many of an index's deltas (their rows, newest first) to merge with ``new_rows`` unindexed rows:
    the newest ones, as long as the rows merged so far are at least ``ratio`` of the next delta's."""
    merged, count = new_rows, 0
    for rows in deltas:
        if merged < ratio * rows:
            break
        merged += rows
        count += 1
    return count


def tidy(table) -> None:
    """Compact ``table``'s small fragments, index its new rows (deltas merged by :func:`merge_count`) and
    delete its old versions."""
    import lance

    dataset = table.to_lance()
    uri = dataset.uri
    dataset.optimize.compact_files(target_rows_per_fragment=FRAGMENT_ROWS)
    dataset = lance.dataset(uri)
    entries = dataset.list_indices()
    for name in sorted({entry["name"] for entry in entries}):
        stats = dataset.stats.index_stats(name)
        new = int(stats.get("num_unindexed_rows") or 0)
        if not new:
            continue
        versions = [entry["version"] for entry in entries if entry["name"] == name]
        per_delta = list(stats.get("num_indexed_rows_per_delta") or [])
        deltas = [rows for _, rows in sorted(zip(versions, per_delta), key=lambda vr: -vr[0])]
        merge = merge_count(new, deltas)
        dataset.optimize.optimize_indices(index_names=[name], num_indices_to_merge=merge)
        dataset = lance.dataset(uri)
        log.debug("catalogue: %s: %d new rows indexed, %d of %d deltas merged", name, new, merge, len(deltas))
    dataset.cleanup_old_versions(older_than=KEEP_VERSIONS)
