"""Embeddings through the HTTP API vs a raw ``SentenceTransformer.encode``, each side in its own process.

    .venv/bin/python bench/api.py [--texts 768] [--request-size 8] [--clients 1 8 32 128 400 1000] [--deadline 10]

- the server is started as users start it: ``pipeline serve`` in its own process (one worker child
  with the embedded all-MiniLM-L6-v2 on the CPU), warmed up with one request;
- the clients run in another process (``--client``): asyncio + aiohttp (``--client-lib httpx``: httpx), one
  connection per client,
  each client sending the next request of ``--request-size`` texts as soon as its last one is answered;
- the raw baseline runs in a third process (``--raw``) after the server is stopped: the same texts, in
  arrival order, encoded ``--max-batch`` at a time (what a server without length grouping would compute);
  then all of them in one ``encode`` call, which sorts them by length first (the bound: every text known
  up front, no HTTP, no waiting).

The texts are of mixed lengths (mostly short, some long enough to be truncated). Reported per number of
clients: texts/s, tokens/s (the usage the server reports), request latency p50/p99, and API / raw.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WORDS = (
    "the quick brown fox jumps over a lazy dog while she sells sea shells by the shore and "
    "please call stella to bring these things from the store meeting notes about quarterly budget "
    "planning speaker said we should ship the release next week after the review"
).split()


def make_texts(count: int, seed: int = 0) -> list[str]:
    """Mixed lengths: 70 % of 4-20 words, 25 % of 20-80, 5 % of 150-300 (beyond the model's 256 tokens)."""
    rng = random.Random(seed)
    texts = []
    for _ in range(count):
        roll = rng.random()
        words = (
            rng.randint(4, 20)
            if roll < 0.7
            else rng.randint(20, 80)
            if roll < 0.95
            else rng.randint(150, 300)
        )
        texts.append(" ".join(rng.choice(WORDS) for _ in range(words)).capitalize() + ".")
    return texts


def percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    return (
        ordered[min(len(ordered) - 1, int(round(pct / 100 * (len(ordered) - 1))))]
        if ordered
        else float("nan")
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(server_dir: Path, env: dict[str, str] | None = None, timeout_s: float = 300.0):
    """``pipeline serve`` (this interpreter's ``orchestrator.cli``, what ``bin/pipeline`` runs) on 127.0.0.1 and a
    free port, in its own process; (process, url) once it answers."""
    import httpx

    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "orchestrator.cli",
            "serve",
            "--port",
            str(port),
            "--server-dir",
            str(server_dir),
        ],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("the server did not start")
        time.sleep(0.2)


def stop_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class _Aiohttp:
    """One aiohttp session with a connection per client (the default: see ``--client-lib``)."""

    def __init__(self, url: str, clients: int) -> None:
        import aiohttp

        self.errors = (aiohttp.ClientError, asyncio.TimeoutError)
        self.session = aiohttp.ClientSession(
            base_url=url,
            connector=aiohttp.TCPConnector(limit=clients, limit_per_host=clients),
            timeout=aiohttp.ClientTimeout(total=600),
        )

    async def get(self, path: str) -> None:
        async with self.session.get(path) as response:
            await response.read()

    async def post(self, path: str, payload: dict) -> tuple[int, str, dict | None]:
        async with self.session.post(path, json=payload) as response:
            body = await response.json() if response.status == 200 else (await response.read() and None)
            return response.status, response.headers.get("retry-after", "1"), body

    async def close(self) -> None:
        await self.session.close()


class _Httpx(_Aiohttp):
    """One httpx AsyncClient with a connection per client."""

    def __init__(self, url: str, clients: int) -> None:
        import httpx

        self.errors = (httpx.HTTPError,)
        self.session = httpx.AsyncClient(
            base_url=url,
            timeout=600,
            limits=httpx.Limits(max_connections=clients, max_keepalive_connections=clients),
        )

    async def get(self, path: str) -> None:
        await self.session.get(path)

    async def post(self, path: str, payload: dict) -> tuple[int, str, dict | None]:
        response = await self.session.post(path, json=payload)
        body = response.json() if response.status_code == 200 else None
        return response.status_code, response.headers.get("retry-after", "1"), body

    async def close(self) -> None:
        await self.session.aclose()


CLIENT_LIBS = {"aiohttp": _Aiohttp, "httpx": _Httpx}


async def _clients(url: str, texts: list[str], request_size: int, clients: int, lib: str = "aiohttp") -> dict:
    requests: asyncio.Queue[list[str]] = asyncio.Queue()
    for i in range(0, len(texts), request_size):
        requests.put_nowait(texts[i : i + request_size])
    latencies: list[float] = []
    refused: list[float] = []  # how long a refusal took to arrive
    statuses: Counter = Counter()
    tokens = 0
    session = CLIENT_LIBS[lib](url, clients)
    cpu0 = time.process_time()
    try:
        await asyncio.gather(*(session.get("/health") for _ in range(clients)))  # open the connections first

        async def one_client() -> None:
            nonlocal tokens
            while True:
                try:
                    batch = requests.get_nowait()
                except asyncio.QueueEmpty:
                    return
                t0 = time.perf_counter()
                try:
                    status, retry, body = await session.post(
                        "/v1/embeddings", {"input": batch, "model": "embedded"}
                    )
                except session.errors as exc:
                    statuses[type(exc).__name__] += 1
                    requests.put_nowait(batch)
                    continue
                statuses[status] += 1
                if status != 200:
                    if status == 429:
                        refused.append(time.perf_counter() - t0)
                    await asyncio.sleep(float(retry))
                    requests.put_nowait(batch)
                    continue
                latencies.append(time.perf_counter() - t0)
                assert len(body["data"]) == len(batch)
                tokens += body["usage"]["total_tokens"]

        t0 = time.perf_counter()
        await asyncio.gather(*(one_client() for _ in range(clients)))
        wall = time.perf_counter() - t0
    finally:
        await session.close()
    return {
        "clients": clients,
        "texts": len(texts),
        "texts_s": len(texts) / wall,
        "tokens_s": tokens / wall,
        "p50": percentile(latencies, 50),
        "p99": percentile(latencies, 99),
        "max": max(latencies),
        "refusal_p99": percentile(refused, 99),
        "client_cpu_s": time.process_time() - cpu0,
        "wall_s": wall,
        "statuses": {str(k): v for k, v in sorted(statuses.items(), key=str)},
    }


def _raw(texts: list[str], batch: int) -> dict:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer

    from stages.embeddings import embedded_model_path

    model = SentenceTransformer(str(embedded_model_path()), device="cpu")
    model.encode(make_texts(64, seed=1), batch_size=32, show_progress_bar=False)  # warm up
    tokenizer, limit = model.tokenizer, model.max_seq_length
    tokens = sum(len(ids) for ids in tokenizer(texts, truncation=True, max_length=limit)["input_ids"])
    latencies = []
    t0 = time.perf_counter()
    for i in range(0, len(texts), batch):
        b0 = time.perf_counter()
        model.encode(
            texts[i : i + batch],
            batch_size=batch,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        latencies.append(time.perf_counter() - b0)
    wall = time.perf_counter() - t0
    t0 = time.perf_counter()  # the best a batch job could do: every text known up front, sorted by length
    model.encode(
        texts, batch_size=batch, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
    )
    sorted_wall = time.perf_counter() - t0
    return {
        "texts_s": len(texts) / wall,
        "tokens_s": tokens / wall,
        "p50": percentile(latencies, 50),
        "p99": percentile(latencies, 99),
        "sorted_texts_s": len(texts) / sorted_wall,
        "sorted_tokens_s": tokens / sorted_wall,
    }


def _in_process(*args: str) -> dict:
    done = subprocess.run(
        [sys.executable, __file__, *args], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--texts", type=int, default=768)
    parser.add_argument("--request-size", type=int, default=8)
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32, 128, 400, 1000])
    parser.add_argument(
        "--deadline",
        type=float,
        default=10.0,
        help="PIPELINE_REQUEST_TIMEOUT_S of the server: admission refuses what cannot meet it",
    )
    parser.add_argument(
        "--client-lib",
        choices=sorted(CLIENT_LIBS),
        default="aiohttp",
        help="what the client process sends with (the clients' own CPU shares the machine)",
    )
    parser.add_argument(
        "--server-loop",
        choices=["auto", "asyncio"],
        default="auto",
        help="auto: uvloop + httptools (the default server); asyncio: asyncio + h11 (pure Python)",
    )
    parser.add_argument("--max-batch", type=int, default=32)
    parser.add_argument("--max-wait-ms", type=float, default=5.0)
    parser.add_argument("--client", metavar="URL", help=argparse.SUPPRESS)  # the client process
    parser.add_argument("--raw", action="store_true", help=argparse.SUPPRESS)  # the baseline process
    args = parser.parse_args()
    texts = make_texts(args.texts)
    if args.client:
        print(
            json.dumps(
                asyncio.run(_clients(args.client, texts, args.request_size, args.clients[0], args.client_lib))
            )
        )
        return
    if args.raw:
        print(json.dumps(_raw(texts, args.max_batch)))
        return

    work = Path(tempfile.mkdtemp(prefix="bench-api-"))
    env = {
        "EMBEDDING_MAX_BATCH": str(args.max_batch),
        "EMBEDDING_MAX_WAIT_MS": str(args.max_wait_ms),
        "PIPELINE_DEVICE": "cpu",
        "PIPELINE_REQUEST_TIMEOUT_S": str(args.deadline),
        "PIPELINE_API_LOOP": args.server_loop,
        "PIPELINE_API_HTTP": "auto" if args.server_loop == "auto" else "h11",
    }
    rows = []
    proc, url = start_server(work, env)
    try:
        _in_process("--client", url, "--clients", "4", "--texts", "64")  # start and warm the worker
        for clients in args.clients:  # every client sends at least two requests
            count = max(args.texts, 2 * clients * args.request_size)
            rows.append(
                _in_process(
                    "--client",
                    url,
                    "--clients",
                    str(clients),
                    "--texts",
                    str(count),
                    "--request-size",
                    str(args.request_size),
                    "--client-lib",
                    args.client_lib,
                )
            )
            print(f"measured: {json.dumps(rows[-1])}", flush=True)  # kept if a later level is cut short
    finally:
        stop_server(proc)
        shutil.rmtree(work, ignore_errors=True)
    raw = _in_process("--raw", "--texts", str(args.texts), "--max-batch", str(args.max_batch))

    print(
        f"\n{len(texts)} mixed-length texts, requests of {args.request_size}, max micro-batch {args.max_batch}, "
        f"max wait {args.max_wait_ms:g} ms, CPU ({os.cpu_count()} cores), all-MiniLM-L6-v2\n"
    )
    print(
        f"deadline {args.deadline:g} s (PIPELINE_REQUEST_TIMEOUT_S); clients honour Retry-After and resend; "
        "texts/s is goodput (texts answered 200 per second of wall time)"
    )
    print(
        f"server: {'uvloop + httptools' if args.server_loop == 'auto' else 'asyncio + h11'}; clients: "
        f"{args.client_lib} (client CPU: the client process's CPU seconds over the level's wall time)\n"
    )
    print(
        f"{'clients':>7} {'texts':>6} {'texts/s':>8} {'tokens/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} "
        f"{'API/raw':>8}  {'429 p99 ms':>10}  {'client CPU':>10}  statuses"
    )
    for r in rows:
        print(
            f"{r['clients']:>7} {r['texts']:>6} {r['texts_s']:>8.1f} {r['tokens_s']:>9.0f} {r['p50'] * 1e3:>8.1f} "
            f"{r['p99'] * 1e3:>8.1f} {r['max'] * 1e3:>8.1f} {r['texts_s'] / raw['texts_s']:>7.2f}x  "
            f"{r['refusal_p99'] * 1e3:>10.1f}  {r['client_cpu_s'] / r['wall_s']:>9.0%}  {r['statuses']}"
        )
    print(
        f"{'raw':>7} {raw['texts_s']:>8.1f} {raw['tokens_s']:>9.0f} {raw['p50'] * 1e3:>8.1f} {raw['p99'] * 1e3:>8.1f}"
        f" {'1.00x':>8}  (encode of {args.max_batch} texts at a time, arrival order; latency per encode)"
    )
    print(
        f"{'sorted':>7} {raw['sorted_texts_s']:>8.1f} {raw['sorted_tokens_s']:>9.0f} {'':>8} {'':>8}"
        f" {raw['sorted_texts_s'] / raw['texts_s']:>7.2f}x  (one encode of all the texts: sentence-transformers "
        f"sorts them by length; a bound no server can beat)"
    )
    print(
        "\nAPI latency: one request end to end over HTTP (server, clients and baseline in separate processes)."
    )


if __name__ == "__main__":
    main()
