"""Embeddings through the HTTP API vs raw in-process ``SentenceTransformer.encode``, for 1, 8 and 32 clients.

    .venv/bin/python bench/api.py [--texts 768] [--request-size 8] [--clients 1 8 32] [--max-batch 32]

Starts a real server (uvicorn on 127.0.0.1, one worker child with the embedded
all-MiniLM-L6-v2), warms it up, then for each number of concurrent clients
sends the same texts in requests of ``--request-size`` texts (each client a
thread with its own HTTP connection) and measures throughput (texts/s) and
request latency (p50, p99). The baseline encodes the same texts in this
process with ``SentenceTransformer.encode`` at the batch size the server
actually used for that run (its mean micro-batch, from /metrics), and reports
per-batch latency. Ratio = API texts/s / raw texts/s (goal >= 0.9).
"""

from __future__ import annotations

import argparse
import os
import queue
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

WORDS = ("the quick brown fox jumps over a lazy dog while she sells sea shells by the shore and "
         "please call stella to bring these things from the store meeting notes about quarterly budget "
         "planning speaker said we should ship the release next week after the review").split()


def make_texts(count: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 40))).capitalize() + "." for _ in range(count)]


def percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(pct / 100 * (len(ordered) - 1))))]


def run_api(url: str, texts: list[str], request_size: int, clients: int) -> tuple[float, list[float]]:
    from orchestrator.api.client import Client

    requests: queue.Queue[list[str]] = queue.Queue()
    for i in range(0, len(texts), request_size):
        requests.put(texts[i:i + request_size])
    latencies: list[float] = []
    lock = threading.Lock()
    barrier = threading.Barrier(clients + 1)

    def client() -> None:
        with Client(url) as api:
            api.health()  # open the connection before the clock starts
            barrier.wait()
            while True:
                try:
                    batch = requests.get_nowait()
                except queue.Empty:
                    return
                t0 = time.perf_counter()
                response = api.embed(batch, model="embedded")
                took = time.perf_counter() - t0
                assert len(response.data) == len(batch)
                with lock:
                    latencies.append(took)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    return len(texts) / (time.perf_counter() - t0), latencies


def run_raw(model, texts: list[str], batch_size: int) -> tuple[float, list[float]]:
    latencies = []
    t0 = time.perf_counter()
    for i in range(0, len(texts), batch_size):
        b0 = time.perf_counter()
        model.encode(texts[i:i + batch_size], batch_size=batch_size, normalize_embeddings=True,
                     convert_to_numpy=True, show_progress_bar=False)
        latencies.append(time.perf_counter() - b0)
    return len(texts) / (time.perf_counter() - t0), latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--texts", type=int, default=768)
    parser.add_argument("--request-size", type=int, default=8)
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--max-batch", type=int, default=32)
    parser.add_argument("--max-wait-ms", type=float, default=5.0)
    args = parser.parse_args()

    from orchestrator.api.client import Client
    from orchestrator.api.metrics import sample
    from orchestrator.api.server import start_in_thread
    from orchestrator.settings import Settings

    texts = make_texts(args.texts)
    work = Path(tempfile.mkdtemp(prefix="bench-api-"))
    server = start_in_thread(Settings(server_dir=work, port=0, embed_max_batch=args.max_batch,
                                      embed_max_wait_ms=args.max_wait_ms, device="cpu"))
    rows = []
    try:
        with Client(server.url) as api:
            api.embed(make_texts(64, seed=1), model="embedded")  # start and warm the worker
            for clients in args.clients:
                before = api.metrics()
                throughput, latencies = run_api(server.url, texts, args.request_size, clients)
                after = api.metrics()
                batches = (sample(after, "isostage_embedding_batch_size_count", profile="embedded")
                           - sample(before, "isostage_embedding_batch_size_count", profile="embedded"))
                rows.append({"clients": clients, "api": throughput, "p50": percentile(latencies, 50),
                             "p99": percentile(latencies, 99), "batch": len(texts) / batches if batches else float("nan")})
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer

    from stages.embeddings import embedded_model_path

    model = SentenceTransformer(str(embedded_model_path()), device="cpu")
    run_raw(model, make_texts(64, seed=1), 32)  # warm up
    for row in rows:
        size = max(1, round(row["batch"]))
        raw, raw_latencies = run_raw(model, texts, size)
        row.update(raw=raw, raw_batch=size, raw_p50=percentile(raw_latencies, 50), raw_p99=percentile(raw_latencies, 99))

    print(f"\n{len(texts)} texts, requests of {args.request_size}, max micro-batch {args.max_batch}, "
          f"max wait {args.max_wait_ms:g} ms, CPU, all-MiniLM-L6-v2 (torch threads: {os.cpu_count()} cores)\n")
    print(f"{'clients':>7} {'mean batch':>10} {'API texts/s':>11} {'p50 ms':>7} {'p99 ms':>7} | "
          f"{'raw batch':>9} {'raw texts/s':>11} {'p50 ms':>7} {'p99 ms':>7} | {'API/raw':>7}")
    for r in rows:
        print(f"{r['clients']:>7} {r['batch']:>10.1f} {r['api']:>11.1f} {r['p50'] * 1e3:>7.1f} {r['p99'] * 1e3:>7.1f} | "
              f"{r['raw_batch']:>9} {r['raw']:>11.1f} {r['raw_p50'] * 1e3:>7.1f} {r['raw_p99'] * 1e3:>7.1f} | "
              f"{r['api'] / r['raw']:>6.2f}x")
    print("\nAPI latency: one request of the given size, end to end over HTTP; raw latency: one encode call of the batch.")


if __name__ == "__main__":
    main()
