"""The catalogue's tables, in LanceDB (``OUT/.catalogue/``).

- ``inputs``: one row per input indexed (its outputs fingerprint from the journal, status, duration, languages,
  models, segment count). An input gets a pending row (no fingerprint) before its segments and its real row
  after them, so an input whose row is missing, pending or stale is redone by the next
  :func:`~orchestrator.catalogue.sync.update`: a kill -9 anywhere leaves nothing that is trusted and wrong.
- ``segments_<model>``: one table per embeddings model (a vector space of its own: a search compares a query
  only with vectors of the model that embedded it), one row per segment with its text, times, speakers,
  language and vector. A new input's rows are appended (a chunk costs what it holds, whatever the table
  holds); an input indexed before has its rows replaced in one commit (``merge_insert`` on input and
  segment, deleting the rows it no longer has), so a reader sees its old rows or its new ones.

Readers open the tables while a run appends (Lance's versions: each commit is a snapshot). New rows are
searched at once (an index covers the rows it was built or last optimized with; the rest is scanned), and
:meth:`Catalogue.maintain` compacts them and adds them to the indexes every :data:`OPTIMIZE_EVERY` commits,
at a cost that follows the new rows (:mod:`~orchestrator.catalogue.upkeep`); a run's writer does it in a child
process (:func:`upkeep_in_child`): building the vector index took about 600 MiB that the allocator kept, and
a run's parent peaked at 1,720 MiB at 100,000 inputs. The child's memory goes back when it exits; it dies
with the run. The vector index (IVF-PQ,
refined by exact distances) is built once a table holds :data:`VECTOR_INDEX_ROWS` rows: below that an exact
scan is fast enough. With it come scalar indexes of the filtered columns (:data:`FILTER_INDEXES`), and a
filtered search that keeps few rows (:data:`EXACT_ROWS`) compares them all instead of probing the index.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np

from orchestrator import layout
from orchestrator.catalogue.rows import InputRows
from orchestrator.catalogue.upkeep import tidy

log = logging.getLogger(__name__)

#: where the catalogue lives in an output folder
CATALOGUE_DIR = layout.CATALOGUE
INPUTS = "inputs"
#: rows a segments table needs before its vector index is built (an exact scan is fast enough below)
VECTOR_INDEX_ROWS = 100_000
#: commits between two optimizations (compaction, new rows folded into the indexes)
OPTIMIZE_EVERY = 20
#: a run's upkeep child that runs longer is stopped (the next upkeep does its work)
UPKEEP_TIMEOUT_S = 3600.0
#: the vector search's IVF partitions probed and the candidates re-ranked by exact distance, per hit asked
#: (bench/catalogue.py at 200,000 segments: recall@10 0.972 in 13 ms p50; refining, not probing, sets recall)
NPROBES = 20
REFINE_FACTOR = 30
#: a filtered search by meaning compares the query with every row the filter keeps when it keeps at most this
#: many (exact, recall 1); above, it probes the vector index. The IVF probes see only the partitions nearest
#: the query: with a filter that keeps a few hundred rows most of them lie elsewhere (at 1M segments, 40 rows
#: kept: recall@10 0.60 by the index; 207: 0.88), while an exact comparison of 1,000 rows took 26 ms, as long
#: as the index's search (docs/benchmarks.md, "Corpus search").
EXACT_ROWS = 2_000
#: the scalar indexes of the columns the search filters (``search.Filters``), built with the vector index and
#: kept up like it: without them every filtered search scanned the filter's columns over the whole table
#: (45 of its 67 ms at 1M segments, and its p99). BITMAP suits a column of a few values, BTREE the others
#: (it also answers ``folder LIKE 'x/%'``).
FILTER_INDEXES = {
    "speaker": "BTREE",
    "corpus_speaker": "BTREE",
    "folder": "BTREE",
    "input": "BTREE",
    "language": "BITMAP",
}
#: how stale a reader kept open may be: it sees a writer's commits within this (``Catalogue(reader=True)``)
READ_CONSISTENCY = timedelta(seconds=1)

SEGMENT_COLUMNS = (
    "input",
    "folder",
    "segment",
    "start",
    "end",
    "speaker",
    "file_speaker",
    "corpus_speaker",
    "language",
    "text",
    "model",
)


def _schemas(dimension: int | None = None):
    import pyarrow as pa

    inputs = pa.schema(
        [
            ("input", pa.string()),
            ("folder", pa.string()),
            ("status", pa.string()),
            ("duration_s", pa.float64()),
            ("language", pa.string()),
            ("languages", pa.string()),
            ("asr_model", pa.string()),
            ("embedding_model", pa.string()),
            ("segments", pa.int32()),
            ("fingerprint", pa.string()),
            ("indexed_at", pa.string()),
        ]
    )
    if dimension is None:
        return inputs, None
    segments = pa.schema(
        [
            ("input", pa.string()),
            ("folder", pa.string()),
            ("segment", pa.int32()),
            ("start", pa.float64()),
            ("end", pa.float64()),
            ("speaker", pa.string()),
            ("file_speaker", pa.string()),
            ("corpus_speaker", pa.string()),
            ("language", pa.string()),
            ("text", pa.string()),
            ("model", pa.string()),
            ("vector", pa.list_(pa.float32(), dimension)),
        ]
    )
    return inputs, segments


def segments_table(model: str, dimension: int) -> str:
    """The name of the segments table of ``model``'s vectors (letters, digits and ``_`` only)."""
    slug = re.sub(r"[^A-Za-z0-9]+", "_", model).strip("_")[:40]
    digest = hashlib.sha256(f"{model}/{dimension}".encode()).hexdigest()[:8]
    return f"segments_{slug}_{dimension}_{digest}"


def quote(value: str) -> str:
    """``value`` as an SQL string literal of a Lance filter."""
    return "'" + value.replace("'", "''") + "'"


def in_list(column: str, values) -> str:
    return f"{column} IN ({', '.join(quote(v) for v in values)})"


class Catalogue:
    """An output folder's catalogue (created on first write; ``exists`` says whether one was).

    ``reader``: a catalogue kept open for many searches (``pipeline serve``): its table handles stay open and
    see other processes' commits within :data:`READ_CONSISTENCY`, and the per-model input counts are read
    again only when the ``inputs`` table has a new version."""

    def __init__(self, out: Path, reader: bool = False, upkeep_in_child: bool = False) -> None:
        """``reader``: kept open by a searcher (sees other processes' commits within a second);
        ``upkeep_in_child``: the upkeep every :data:`OPTIMIZE_EVERY` commits runs in a child process
        (:func:`upkeep_in_child`: a run's writer, whose memory it would keep)."""
        import lancedb

        self.path = Path(out) / CATALOGUE_DIR
        self.exists = self.path.is_dir()
        self.reader = reader
        self.db = lancedb.connect(
            str(self.path), read_consistency_interval=READ_CONSISTENCY if reader else None
        )
        self._commits = 0
        self.upkeep_in_child = upkeep_in_child
        self._open: dict[str, object] = {}
        self._models: tuple[int, dict[str, int]] | None = None
        self._table_of: dict[str, str] = {}

    def _table(self, name: str):
        """``name``'s table (a reader keeps it open)."""
        if not self.reader:
            return self.db.open_table(name)
        if name not in self._open:
            self._open[name] = self.db.open_table(name)
        return self._open[name]

    # -- reading -----------------------------------------------------------------------------------

    def _names(self) -> list[str]:
        result = self.db.table_names() if hasattr(self.db, "table_names") else self.db.list_tables().tables
        return list(result)

    def segment_tables(self) -> list[str]:
        return [name for name in self._names() if name.startswith("segments_")]

    def inputs(self, columns: tuple[str, ...] = ("input", "fingerprint"), ids=None) -> list[dict]:
        """The ``inputs`` table's rows (only ``columns``; only ``ids``, when given)."""
        if INPUTS not in self._names():
            return []
        search = self._table(INPUTS).search().select(list(columns))
        if ids is not None:
            if not ids:
                return []
            search = search.where(in_list("input", sorted(ids)))
        return search.limit(None).to_list()

    def indexed(self, ids=None) -> dict[str, str]:
        """input id -> the outputs fingerprint it was indexed with (only ``ids``, when given)."""
        return {row["input"]: row["fingerprint"] for row in self.inputs(ids=ids)}

    def models(self) -> dict[str, int]:
        """embeddings model -> inputs indexed with its vectors (a reader counts again only after a commit)."""
        version = self._table(INPUTS).version if self.reader and INPUTS in self._names() else None
        if version is not None and self._models is not None and self._models[0] == version:
            return self._models[1]
        counts: dict[str, int] = {}
        for row in self.inputs(("embedding_model",)):
            counts[row["embedding_model"]] = counts.get(row["embedding_model"], 0) + 1
        if version is not None:
            self._models = (version, counts)
        return counts

    def table_of(self, model: str) -> str | None:
        """The segments table holding ``model``'s vectors (None: no input has them)."""
        if model in self._table_of:
            return self._table_of[model]
        prefix = f"segments_{re.sub(r'[^A-Za-z0-9]+', '_', model).strip('_')[:40]}_"
        for name in self.segment_tables():
            if name.startswith(prefix):
                table = self._table(name)
                first = table.search().select(["model"]).limit(1).to_list()
                if first and first[0]["model"] == model:
                    self._table_of[model] = name  # a table keeps its name: known once found
                    return name
        return None

    def words(self, query: str, where: str | None, limit: int) -> list[dict]:
        """Full-text (BM25) hits over every segments table, best first (``_score``)."""
        hits: list[dict] = []
        for name in self.segment_tables():
            table = self._table(name)
            search = table.search(query, query_type="fts", fts_columns="text").select(
                [*SEGMENT_COLUMNS, "_score"]
            )
            if where:
                search = search.where(where, prefilter=True)
            hits.extend(search.limit(limit).to_list())
        hits.sort(key=lambda hit: -hit["_score"])
        return hits[:limit]

    def meaning(self, vector: np.ndarray, model: str, where: str | None, limit: int) -> list[dict]:
        """The segments of ``model``'s table nearest ``vector`` by cosine, best first (``_distance``)."""
        name = self.table_of(model)
        if name is None:
            return []
        table = self._table(name)
        search = (
            table.search(np.asarray(vector, dtype=np.float32), vector_column_name="vector")
            .metric("cosine")
            .select([*SEGMENT_COLUMNS, "_distance"])
        )
        if where:
            search = search.where(where, prefilter=True)
        if _has_vector_index(table):
            if where and table.count_rows(where) <= EXACT_ROWS:  # the filter indexes answer the count
                search = search.bypass_vector_index()
            else:
                search = search.nprobes(NPROBES).refine_factor(REFINE_FACTOR)
        return search.limit(limit).to_list()

    # -- writing -----------------------------------------------------------------------------------

    def put(self, batch: list[InputRows]) -> None:
        """Index (or index again) these inputs. Each gets a pending ``inputs`` row first (no fingerprint),
        then its segments, then its ``inputs`` row with its fingerprint: a kill anywhere leaves a pending
        row or none, and the next :func:`~orchestrator.catalogue.sync.update` redoes the input. An input
        with no ``inputs`` row at all has no segments (they come after the pending row), so its segments
        are appended, costing what the chunk costs whatever the table holds; one that was indexed (or
        pending) has its segments replaced in one ``merge_insert`` per model's table."""
        if not batch:
            return
        import pyarrow as pa

        ids = [rows.input["input"] for rows in batch]
        inputs_schema, _ = _schemas()
        inputs_table = self._open_or_create(INPUTS, inputs_schema)
        known = {row["input"] for row in self.inputs(("input",), ids=set(ids))}
        stamp = datetime.now(UTC).isoformat()
        if known:
            inputs_table.delete(in_list("input", sorted(known)))
        pending = [{**rows.input, "fingerprint": "", "indexed_at": stamp} for rows in batch]
        inputs_table.add(pa.Table.from_pylist(pending, schema=inputs_schema))
        by_table: dict[str, list[InputRows]] = {}
        dims: dict[str, int] = {}
        for rows in batch:
            if rows.vectors is None or not rows.segments:
                continue
            dimension = int(rows.vectors.shape[1])
            name = segments_table(rows.input["embedding_model"], dimension)
            by_table.setdefault(name, []).append(rows)
            dims[name] = dimension
        if known:  # an input indexed before with another model (or none now)
            for name in self.segment_tables():
                if name not in by_table:
                    self.db.open_table(name).delete(in_list("input", sorted(known)))
        for name, members in by_table.items():
            _, schema = _schemas(dims[name])
            table = self._open_or_create(name, schema)
            fresh = [rows for rows in members if rows.input["input"] not in known]
            again = [rows for rows in members if rows.input["input"] in known]
            if fresh:
                table.add(_segments_data(fresh, schema, dims[name]))
            if again:
                (
                    table.merge_insert(["input", "segment"])
                    .when_matched_update_all()
                    .when_not_matched_insert_all()
                    .when_not_matched_by_source_delete(in_list("input", [r.input["input"] for r in again]))
                    .execute(_segments_data(again, schema, dims[name]))
                )
            _ensure_text_index(table)
        inputs_table.delete(in_list("input", ids))
        records = [{**rows.input, "indexed_at": stamp} for rows in batch]
        inputs_table.add(pa.Table.from_pylist(records, schema=inputs_schema))
        self._commits += 1
        if self._commits % OPTIMIZE_EVERY == 0:
            if self.upkeep_in_child:
                upkeep_in_child(self.path.parent)
            else:
                self.maintain()

    def drop(self, ids: list[str]) -> None:
        """Forget these inputs (their ``inputs`` rows first)."""
        if not ids:
            return
        for name in [INPUTS, *self.segment_tables()]:
            if name in self._names():
                self.db.open_table(name).delete(in_list("input", ids))

    def maintain(self) -> None:
        """Build a segments table's vector index once it is big enough, and keep every table compact with its
        new rows indexed, at a cost that follows the rows added since the last time
        (:func:`~orchestrator.catalogue.upkeep.tidy`)."""
        for name in [INPUTS, *self.segment_tables()]:
            if name not in self._names():
                continue
            table = self.db.open_table(name)
            if name != INPUTS and not _has_vector_index(table) and table.count_rows() >= VECTOR_INDEX_ROWS:
                log.info("catalogue: building the vector index of %s (%d rows)", name, table.count_rows())
                table.create_index(metric="cosine", vector_column_name="vector", index_type="IVF_PQ")
            if name != INPUTS and _has_vector_index(table):
                _ensure_filter_indexes(table)
            try:
                tidy(table)
            except Exception as exc:  # noqa: BLE001 - a later run tidies again; the data is intact
                log.warning("catalogue: %s not tidied: %s", name, exc)

    def _open_or_create(self, name: str, schema):
        if name in self._names():
            return self.db.open_table(name)
        return self.db.create_table(name, schema=schema, exist_ok=True)


def _segments_data(members: list[InputRows], schema, dimension: int):
    """These inputs' segment rows as one Arrow table of ``schema``."""
    import pyarrow as pa

    columns = {column: [s[column] for rows in members for s in rows.segments] for column in SEGMENT_COLUMNS}
    vectors = np.concatenate([rows.vectors for rows in members]).astype(np.float32, copy=False)
    return pa.table(
        {
            **{
                column: pa.array(values, type=schema.field(column).type) for column, values in columns.items()
            },
            "vector": pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), dimension),
        },
        schema=schema,
    )


def _has_vector_index(table) -> bool:
    return any("vector" in index.columns for index in table.list_indices())


def _ensure_text_index(table) -> None:
    if not any(
        "text" in index.columns and "FTS" in str(index.index_type).upper() for index in table.list_indices()
    ):
        table.create_fts_index("text", replace=True)


def _ensure_filter_indexes(table) -> None:
    """The scalar indexes of :data:`FILTER_INDEXES` that ``table`` lacks (0.3 s each at 1M rows)."""
    from lancedb.index import Bitmap, BTree

    have = {column for index in table.list_indices() for column in index.columns}
    for column, kind in FILTER_INDEXES.items():
        if column not in have:
            log.info("catalogue: building the %s index of %s.%s", kind, table.name, column)
            table.create_index(column, config=Bitmap() if kind == "BITMAP" else BTree(), replace=False)


def upkeep_in_child(out: Path, timeout_s: float = UPKEEP_TIMEOUT_S) -> bool:
    """``Catalogue(out).maintain()`` in a child process (``python -m orchestrator.catalogue.store``), waited
    for; its memory goes back when it exits. False (and a warning) when it failed: the data is intact, and
    the next upkeep does what this one did not."""
    command = [sys.executable, "-m", "orchestrator.catalogue.store", str(out), str(os.getpid())]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("catalogue: upkeep not done: %s", " ".join(str(exc).split())[:300])
        return False
    if done.returncode != 0:
        tail = " ".join(done.stderr.split())[-300:]
        log.warning("catalogue: upkeep child exited %d: %s", done.returncode, tail)
        return False
    return True


def main(argv: list[str]) -> int:
    """The upkeep child: ``OUT PARENT_PID``; it dies with the parent."""
    from orchestrator.process.toolkit import die_with_parent

    out, parent = argv
    die_with_parent(int(parent))
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    Catalogue(Path(out)).maintain()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
