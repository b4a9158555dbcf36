"""Section ``embeddings``: texts/s of the embedding profiles' shapes through the pipeline, plain, and the API.

For each profile (``speed``: bge-small-en-v1.5, ``quality``: gte-Qwen2-1.5B-instruct) a sentence-transformers
directory of the real architecture and configuration with random weights is built on ``ctx.device``
(:mod:`bench.device.models`), then the same texts are embedded three ways:

- ``stage``: the embeddings stage in its real child, as ``pipeline process`` runs it: the registry's stage
  spec, ``StageRunner`` and the executor (spawn, GPU guard, pid files), over transcript artifacts of
  ``SEGMENTS`` segments each; texts/s over the child's ``compute_s`` (after import and model load: reading
  transcripts, encoding in the stage's groups of ``GROUP_BATCHES`` batches, writing artifacts and ``.npy``
  sidecars), and end to end (spawn to exit);
- ``plain``: ``SentenceTransformer(dir).encode(texts, batch_size=B)`` in one fresh process, loaded with the
  same arguments as the stage (on CUDA: bfloat16 for Qwen2, float16 otherwise; no key/value cache; left
  padding for last-token pooling) and the environment stage children get: the first call
  (``cold``: what the stage's compute also pays), a second one (``warm``), and the texts in the stage's
  groups (``grouped``, warm), then the stage's artifacts for those rows written as the stage writes them
  (``artifact_writes_s``: atomic, fsynced, one JSON and one ``.npy`` per input): where a gap between the two
  comes from; ``stage_vs_plain`` = stage / plain cold (the goal: at least 0.95), ``stage_vs_plain_warm`` =
  stage / plain warm;
- ``api``: ``POST /v1/embeddings`` of the real server (``python -m orchestrator.cli serve`` on 127.0.0.1,
  its embedding worker on ``ctx.device``, default micro-batching), called with httpx by 1 to 64 concurrent
  clients sending requests of ``API_REQUEST_TEXTS`` texts (base64, as the official OpenAI client asks),
  honouring ``Retry-After``.

Nothing that imports torch runs in this process (model building and the plain run are subprocesses), so the
parent holds no CUDA context. Every part of every profile records its error text and the rest goes on.
``ctx.write("embeddings", ...)`` runs after each part.

    python -m bench.device.embeddings [--quick] [--device cpu] [--out DIR]   # this section alone
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import logging
import os
import random
import re
import socket
import statistics
import subprocess
import sys
import time
import traceback
from collections import Counter
from importlib import metadata
from pathlib import Path

from bench.device.common import ROOT, Context

log = logging.getLogger(__name__)

NAME = "embeddings"
PROFILES = ("speed", "quality")
#: the stage's default ``EMBEDDING_BATCH_SIZE``; the plain run uses the same
BATCH = 128
#: texts embedded by the stage and the plain run (each profile), and sent through the API
TEXTS = {"speed": 16_000, "quality": 4_000}
API_TEXTS = {"speed": 8_000, "quality": 2_000}
QUICK_TEXTS = 100
#: transcript segments per input of the stage
SEGMENTS = 40
#: concurrent API clients, one level after another
API_CLIENTS = (1, 8, 64)
QUICK_API_CLIENTS = (1, 4)
API_REQUEST_TEXTS = 16
#: the quick rehearsal's layers (None: the real number); the device run builds the real shapes
QUICK_LAYERS = {"speed": None, "quality": 2}
#: a part does not start with less than this many seconds of the run's budget left
MIN_LEFT_S = 20.0
#: what each profile goes through, in order
PARTS = ("model", "plain", "stage", "api")
#: an API level stops sending after this long (what was answered by then is measured)
LEVEL_LIMIT_S = 120.0


# -- the texts -------------------------------------------------------------------------------------------


def _sentences() -> tuple[list[str], str]:
    """English sentences of ordinary length, and where they come from: the prose of Python's own help
    topics (``pydoc_data``, in every CPython), without code; a fixed word list when that module is missing."""
    try:
        from pydoc_data.topics import topics
    except ImportError:
        topics = {}
    text = " ".join(" ".join(topics.values()).split())
    sentences = [
        s
        for s in re.split(r"(?<=[.!?])\s+", text)
        if 4 <= len(s.split()) <= 60 and s[:1].isupper() and not re.search(r"[{}\[\]=<>|\\]|\*\*|::|>>>", s)
    ]
    if len(sentences) >= 500:
        return sentences, "pydoc_data.topics sentences"
    words = (
        "the meeting starts at nine and we will go over the budget before the release next week so please "
        "bring your notes about the quarterly numbers and the customer calls we had since the last review"
    ).split()
    rng = random.Random(1)
    made = [
        " ".join(rng.choice(words) for _ in range(rng.randint(5, 30))).capitalize() + "." for _ in range(2000)
    ]
    return made, "random sentences of a fixed word list (no pydoc_data)"


def make_texts(count: int, seed: int = 0) -> list[str]:
    """``count`` transcript-like segments: 85 % one sentence, 15 % two to four (long segments)."""
    pool, _ = _sentences()
    rng = random.Random(seed)
    return [
        " ".join(rng.choice(pool) for _ in range(1 if rng.random() < 0.85 else rng.randint(2, 4)))
        for _ in range(count)
    ]


# -- the section -----------------------------------------------------------------------------------------


def run(ctx: Context, profiles: tuple[str, ...] = PROFILES) -> dict:
    """Build each profile's shape, then measure stage, plain and API on the same texts (see the module)."""
    result: dict = {
        "device": ctx.device,
        "gpu": None,
        "quick": ctx.quick,
        "batch_size": BATCH,
        "segments_per_transcript": SEGMENTS,
        "api_request_texts": API_REQUEST_TEXTS,
        "text_source": _sentences()[1],
        "versions": _versions(),
        "profiles": {},
    }
    work = ctx.work / NAME
    work.mkdir(parents=True, exist_ok=True)
    for profile in profiles:
        entry: dict = {}
        result["profiles"][profile] = entry
        count = QUICK_TEXTS if ctx.quick else TEXTS[profile]
        texts = make_texts(count)
        entry["texts"] = len(texts)
        entry["words_per_text"] = round(statistics.mean(len(t.split()) for t in texts), 1)
        for part in PARTS:
            if part != "model" and "error" in entry.get("model", {}):
                entry[part] = {"skipped": "the model was not built"}
                continue
            if ctx.left() < MIN_LEFT_S:
                entry[part] = {"skipped": f"budget: {ctx.left():.0f}s left"}
                continue
            started = time.monotonic()
            try:
                entry[part] = _part(ctx, part, profile, entry, texts, work)
            except Exception as exc:
                log.exception("embeddings: %s %s failed", profile, part)
                entry[part] = {"error": _error(exc)}
            entry[part]["part_s"] = round(time.monotonic() - started, 2)
            if entry[part].get("gpu") and not result.get("gpu"):
                result["gpu"] = entry[part]["gpu"]
            _ratios(entry)
            ctx.write(NAME, result)
    ctx.write(NAME, result)
    return result


def _part(ctx: Context, part: str, profile: str, entry: dict, texts: list[str], work: Path) -> dict:
    if part == "model":
        return _build(ctx, profile, work)
    if part == "plain":
        return _plain(ctx, entry, texts, work)
    if part == "stage":
        return _stage(ctx, entry, texts, work / f"{profile}-stage")
    return _api(
        ctx, entry, texts[: QUICK_TEXTS if ctx.quick else API_TEXTS[profile]], work / f"{profile}-api"
    )


def _ratios(entry: dict) -> None:
    stage, plain = entry.get("stage", {}), entry.get("plain", {})
    if "texts_s" in stage and "cold_texts_s" in plain:
        entry["stage_vs_plain"] = round(stage["texts_s"] / plain["cold_texts_s"], 3)
        entry["stage_vs_plain_warm"] = round(stage["texts_s"] / plain["warm_texts_s"], 3)
    api = entry.get("api", {})
    if "levels" in api and "warm_texts_s" in plain:
        for level in api["levels"]:
            if "texts_s" in level:
                level["vs_plain_warm"] = round(level["texts_s"] / plain["warm_texts_s"], 3)


def _error(exc: BaseException) -> str:
    text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    return text[-3000:]


def _versions() -> dict:
    """Installed versions, read without importing (this process imports no torch)."""
    out = {"python": sys.version.split()[0]}
    names = ("torch", "transformers", "sentence-transformers", "tokenizers", "numpy", "httpx")
    for name in (*names, "fastapi", "uvicorn", "uvloop", "httptools"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def _child_env(ctx: Context) -> dict[str, str]:
    """The environment the stage's children get (offline hub, allocator, heap, tokenizers single-threaded),
    for the processes this section starts itself, so both sides run under the same conditions."""
    from orchestrator.settings import Settings

    env = os.environ | Settings(device=ctx.device, allow_hub=False).child_env()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return env


def _python(ctx: Context, args: list[str], timeout_s: float, log_path: Path) -> dict:
    """Run ``python -m <args>`` here, its output to ``log_path``; its last stdout line as JSON."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as err:
        done = subprocess.run(
            [sys.executable, "-m", *args],
            cwd=ROOT,
            env=_child_env(ctx),
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            timeout=timeout_s,
        )
    if done.returncode != 0:
        raise RuntimeError(f"exit {done.returncode}: {_tail(log_path)}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _tail(path: Path, chars: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError as exc:
        return f"(no log: {exc})"


def _timeout(ctx: Context) -> float:
    return max(30.0, min(ctx.left(), 600.0))


# -- the model -------------------------------------------------------------------------------------------


def _model_dir(work: Path, profile: str) -> Path:
    from bench.device.models import SHAPES

    return work / "models" / SHAPES[profile]


def _build(ctx: Context, profile: str, work: Path) -> dict:
    layers = QUICK_LAYERS[profile] if ctx.quick else None
    args = ["bench.device.models", "build", profile, str(_model_dir(work, profile)), "--device", ctx.device]
    if layers is not None:
        args += ["--layers", str(layers)]
    return _python(ctx, args, _timeout(ctx), work / f"{profile}-build.log")


# -- (b) plain sentence-transformers ---------------------------------------------------------------------


def _plain(ctx: Context, entry: dict, texts: list[str], work: Path) -> dict:
    profile_dir = Path(entry["model"]["path"])
    texts_path = work / f"{profile_dir.name}-texts.json"
    texts_path.write_text(json.dumps(texts))
    args = ["bench.device.embeddings", "--plain", str(profile_dir), "--texts", str(texts_path)]
    args += [
        "--device",
        ctx.device,
        "--batch",
        str(BATCH),
        "--writes",
        str(work / f"{profile_dir.name}-writes"),
    ]
    return _python(ctx, args, _timeout(ctx), work / f"{profile_dir.name}-plain.log")


def plain_main(model_dir: str, texts_path: str, device: str, batch: int, writes: str | None = None) -> dict:
    """The plain side, in its own process: load as the stage loads, encode three ways (see the module);
    then, into ``writes``, the artifacts the stage would write for these rows (``SEGMENTS`` per input), timed:
    the part of the stage's compute that is no model work."""
    import numpy as np
    import torch
    from sentence_transformers import SentenceTransformer

    from stages.embeddings import GROUP_BATCHES, cuda_dtype, dtype_kwargs, last_token_pooling

    texts = json.loads(Path(texts_path).read_text())
    cuda = device.startswith("cuda")
    kwargs = {}
    # as stages.embeddings.load_sentence_transformer: bfloat16 for Qwen2 (float16 overflows in it), float16 otherwise
    if cuda:
        model_type = json.loads((Path(model_dir) / "config.json").read_text()).get("model_type")
        dtype = cuda_dtype(model_type, torch.cuda.is_bf16_supported())
        kwargs = {"model_kwargs": dtype_kwargs(getattr(torch, dtype))}
    started = time.perf_counter()
    model = SentenceTransformer(
        model_dir, device=device, local_files_only=True, config_kwargs={"use_cache": False}, **kwargs
    )  # as the stage: no key/value cache
    if last_token_pooling(model):  # as the stage: left padding for last-token pooling
        model.tokenizer.padding_side = "left"
    load_s = time.perf_counter() - started
    limit = model.max_seq_length
    counts = [len(ids) for ids in model.tokenizer(texts, truncation=True, max_length=limit)["input_ids"]]

    def encode(part: list[str]):
        return model.encode(
            part, batch_size=batch, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
        )

    def timed(fn) -> float:
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    if cuda:
        torch.cuda.reset_peak_memory_stats()
    vectors = []
    cold = timed(lambda: vectors.append(encode(texts)))
    warm = timed(lambda: encode(texts))
    group = GROUP_BATCHES * batch
    grouped = timed(lambda: [encode(texts[i : i + group]) for i in range(0, len(texts), group)])
    n = len(texts)
    written = _write_like_the_stage(vectors[0], Path(writes), model_dir, device, batch) if writes else None
    return {
        "model_dir": model_dir,
        "device": device,
        "gpu": torch.cuda.get_device_name() if cuda else None,
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "attention": _attention(model),
        "tokenizer_class": type(model.tokenizer).__name__,
        "max_seq_length": limit,
        "dimension": int(vectors[0].shape[1]),
        "finite": bool(np.isfinite(vectors[0]).all()),
        "batch_size": batch,
        "group_texts": group,
        "tokens": int(sum(counts)),
        "tokens_per_text": {
            "mean": round(statistics.mean(counts), 1),
            "p50": int(statistics.median(counts)),
            "max": max(counts),
        },
        "load_s": round(load_s, 3),
        "cold_s": round(cold, 3),
        "warm_s": round(warm, 3),
        "grouped_s": round(grouped, 3),
        "cold_texts_s": round(n / cold, 1),
        "warm_texts_s": round(n / warm, 1),
        "grouped_texts_s": round(n / grouped, 1),
        "warm_tokens_s": round(sum(counts) / warm, 1),
        "artifact_writes_s": written,
        "grouped_and_writes_texts_s": round(n / (grouped + written), 1) if written is not None else None,
        "peak_vram_mb": round(torch.cuda.max_memory_allocated() / 2**20, 1) if cuda else None,
        "versions": {
            "torch": torch.__version__,
            "transformers": _version("transformers"),
            "sentence-transformers": _version("sentence-transformers"),
        },
    }


def _write_like_the_stage(vectors, out: Path, model_dir: str, device: str, batch: int) -> float:
    """Seconds to write one embeddings artifact and its ``.npy`` sidecar per ``SEGMENTS`` rows, as the
    stage writes them (atomic, fsynced, sha256)."""
    from contracts import EmbeddingsArtifact, save_model
    from stages.runtime.base import save_array

    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    for number, start in enumerate(range(0, len(vectors), SEGMENTS)):
        rows = vectors[start : start + SEGMENTS].astype("float32", copy=False)
        sidecar = out / f"t{number:05d}.npy"
        digest = save_array(sidecar, rows)
        artifact = EmbeddingsArtifact(
            item_id=f"t{number:05d}",
            fingerprint="bench",
            source="/bench",
            sidecar=sidecar.name,
            sha256=digest,
            profile=model_dir,
            dimension=int(rows.shape[1]),
            count=int(rows.shape[0]),
            normalized=True,
            model=model_dir,
            requested_model=model_dir,
            device=device,
            batch_size=batch,
        )
        save_model(artifact, out / f"t{number:05d}.json")
    return round(time.perf_counter() - started, 3)


def _attention(model) -> str | None:
    try:
        return model[0].auto_model.config._attn_implementation
    except AttributeError:
        return None


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


# -- (a) the stage in its real child ---------------------------------------------------------------------


def _stage(ctx: Context, entry: dict, texts: list[str], work: Path) -> dict:
    from contracts import EmbeddingsArtifact, TranscriptArtifact, WorkItem, load_artifact, save_model
    from orchestrator.registry import BY_NAME
    from orchestrator.run.pipeline import make_executor
    from orchestrator.run.runner import StageRunner
    from orchestrator.settings import Settings

    model_dir = entry["model"]["path"]
    settings = Settings(
        output_dir=work / "out",
        device=ctx.device,
        allow_hub=False,
        embedding_profile=model_dir,
        embedding_fallback=False,  # a model that does not load is an error here, not a measured fallback
        embedding_batch_size=BATCH,
        pid_dir=work / "pids",
    )
    spec = BY_NAME["embeddings"].spec(settings)
    items = []
    for number, start in enumerate(range(0, len(texts), SEGMENTS)):
        part = texts[start : start + SEGMENTS]
        item_id = f"t{number:05d}"
        transcript = TranscriptArtifact(
            item_id=item_id,
            fingerprint=f"transcript-{item_id}",
            source=f"/bench/{item_id}.wav",
            language="en",
            segments=[
                {"id": i, "start": 5.0 * i, "end": 5.0 * i + 4.5, "text": text} for i, text in enumerate(part)
            ],
            model="bench",
            requested_model="bench",
            device="cpu",
            compute_type="float16",
            batch_size=1,
            duration_s=5.0 * len(part),
        )
        path = save_model(transcript, work / item_id / "transcript.json")
        items.append(
            WorkItem(
                id=item_id,
                inputs={"transcript": str(path)},
                output=str(work / item_id / "embeddings.json"),
                fingerprint=f"embeddings-{item_id}",
            )
        )
    executor = make_executor(settings)
    runner = StageRunner(
        executor,
        work / "run",
        settings.child_env(),
        settings.device,
        settings.max_signal_retries,
        memory=settings.memory(),
    )
    try:
        started = time.perf_counter()
        outcomes, stage_run = runner.run(spec, items, reuse=False)
        wall = time.perf_counter() - started
    finally:
        executor.close()
    failed = {k: o.error for k, o in outcomes.items() if not o.ok}
    attempts = [a.model_dump(mode="json", exclude_none=True) for a in stage_run.attempts]
    out: dict = {"items": len(items), "attempts": attempts, "wall_s": round(wall, 3)}
    if failed:
        out["error"] = f"{len(failed)} of {len(items)} item(s) failed, e.g. {next(iter(failed.values()))}"
        out["log_tail"] = _tail(max((work / "run").glob("*.log"), key=os.path.getmtime, default=work))
        return out
    first = load_artifact(Path(items[0].output), EmbeddingsArtifact)
    counted = sum(load_artifact(Path(i.output), EmbeddingsArtifact).count for i in items)
    last = stage_run.attempts[-1]
    out |= {
        "model": first.model,
        "requested_model": first.requested_model,
        "device": first.device,
        "dimension": first.dimension,
        "rows": counted,
        "batch_size": last.batch_size,
        "import_s": last.import_s,
        "load_s": last.load_s,
        "compute_s": last.compute_s,
        "peak_vram_mb": last.peak_vram_mb,
        "texts_s": round(len(texts) / last.compute_s, 1),
        "end_to_end_texts_s": round(len(texts) / wall, 1),
    }
    if first.model != model_dir or counted != len(texts) or len(stage_run.attempts) != 1:
        out["error"] = (
            f"not the model asked for, or not every text, or retried: model {first.model}, "
            f"{counted} rows for {len(texts)} texts, {len(stage_run.attempts)} attempt(s)"
        )
    return out


# -- (c) the HTTP API ------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _api(ctx: Context, entry: dict, texts: list[str], work: Path) -> dict:
    import httpx

    model_dir = entry["model"]["path"]
    work.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = _child_env(ctx) | {
        "PIPELINE_DEVICE": ctx.device,
        "PIPELINE_ALLOW_HUB": "false",
        "EMBEDDING_MODELS": json.dumps([model_dir]),
        "EMBEDDING_FALLBACK": "false",
    }
    server_log = work / "server.log"
    from orchestrator.settings import Settings

    defaults = Settings()
    out: dict = {
        "texts": len(texts),
        "encoding_format": "base64",
        # the server runs with these (not overridden here): its micro-batching and its event loop
        "server_settings": {
            name: getattr(defaults, name)
            for name in (
                "embed_max_batch",
                "embed_max_wait_ms",
                "embed_max_batch_tokens",
                "api_loop",
                "api_http",
            )
        },
        "levels": [],
    }
    with open(server_log, "w") as sink:
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "orchestrator.cli",
                "serve",
                "--port",
                str(port),
                "--server-dir",
                str(work),
            ],
            cwd=ROOT,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        started = time.perf_counter()
        deadline = time.monotonic() + 120
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"the server exited with {server.returncode}: {_tail(server_log)}")
            try:
                if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the server did not answer within 120 s: {_tail(server_log)}")
            time.sleep(0.2)
        out["server_start_s"] = round(time.perf_counter() - started, 2)
        # the first request starts the worker (import, model load): timed apart from the levels
        started = time.perf_counter()
        first = httpx.post(
            f"{url}/v1/embeddings",
            json={"input": texts[:API_REQUEST_TEXTS], "model": model_dir, "encoding_format": "base64"},
            timeout=_timeout(ctx),
        )
        out["first_request_s"] = round(time.perf_counter() - started, 2)
        if first.status_code != 200:
            raise RuntimeError(f"first request: HTTP {first.status_code}: {first.text[:500]}")
        out["model"] = first.json()["model"]
        health = httpx.get(f"{url}/health", timeout=10).json()
        out["workers"] = health.get("workers")
        levels = QUICK_API_CLIENTS if ctx.quick else API_CLIENTS
        for clients in levels:
            if ctx.left() < MIN_LEFT_S:
                out["levels"].append({"clients": clients, "skipped": f"budget: {ctx.left():.0f}s left"})
                continue
            try:
                level = asyncio.run(_level(url, model_dir, texts, clients, API_REQUEST_TEXTS, ctx))
            except Exception as exc:  # noqa: BLE001 - one level's failure is recorded, the others go on
                level = {"clients": clients, "error": _error(exc)}
            out["levels"].append(level)
        out["workers_after"] = httpx.get(f"{url}/health", timeout=10).json().get("workers")
    except Exception as exc:  # noqa: BLE001 - recorded with what was measured before it
        out["error"] = _error(exc)
        out["server_log_tail"] = _tail(server_log)
        worker_logs = sorted((work / "workers").glob("*.log")) if (work / "workers").exists() else []
        if worker_logs:
            out["worker_log_tail"] = _tail(worker_logs[-1])
    finally:
        server.terminate()
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    return out


async def _level(url: str, model: str, texts: list[str], clients: int, size: int, ctx: Context) -> dict:
    """``clients`` concurrent clients, each sending its next request of ``size`` texts when the last is
    answered, until every text is; 429 / 503 are retried after ``Retry-After``."""
    import httpx
    import numpy as np

    pending = [texts[i : i + size] for i in range(0, len(texts), size)]
    pending.reverse()
    latencies: list[float] = []
    statuses: Counter = Counter()
    failures: list[str] = []
    models: set[str] = set()
    tokens = done_texts = 0
    dimension = None
    deadline = time.monotonic() + min(LEVEL_LIMIT_S, max(30.0, ctx.left() - MIN_LEFT_S))
    unavailable = 0  # 503s: retried a few times (a worker being replaced), then the level fails
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as client:

        async def one_client() -> None:
            nonlocal tokens, done_texts, dimension, unavailable
            while pending and time.monotonic() < deadline:
                batch = pending.pop()
                t0 = time.perf_counter()
                try:
                    response = await client.post(
                        "/v1/embeddings", json={"input": batch, "model": model, "encoding_format": "base64"}
                    )
                except httpx.HTTPError as exc:
                    statuses[type(exc).__name__] += 1
                    failures.append(f"{type(exc).__name__}: {exc}"[:300])
                    continue
                statuses[response.status_code] += 1
                unavailable += response.status_code == 503
                if response.status_code == 429 or (response.status_code == 503 and unavailable <= 3):
                    pending.append(batch)
                    await asyncio.sleep(float(response.headers.get("retry-after", "1")))
                    continue
                if response.status_code != 200:
                    failures.append(f"HTTP {response.status_code}: {response.text[:300]}")
                    continue
                latencies.append(time.perf_counter() - t0)
                body = response.json()
                if len(body["data"]) != len(batch):
                    failures.append(f"{len(body['data'])} rows for {len(batch)} texts")
                dimension = len(np.frombuffer(base64.b64decode(body["data"][0]["embedding"]), dtype="<f4"))
                tokens += body["usage"]["total_tokens"]
                done_texts += len(batch)
                models.add(body["model"])

        started = time.perf_counter()
        await asyncio.gather(*(one_client() for _ in range(clients)))
        wall = time.perf_counter() - started
    level = {
        "clients": clients,
        "requests": len(latencies),
        "texts": done_texts,
        "wall_s": round(wall, 3),
        "texts_s": round(done_texts / wall, 1),
        "tokens_s": round(tokens / wall, 1),
        "latency_p50_ms": round(1e3 * statistics.median(latencies), 1) if latencies else None,
        "latency_p99_ms": round(1e3 * _percentile(latencies, 99), 1) if latencies else None,
        "statuses": {str(k): v for k, v in sorted(statuses.items(), key=str)},
        "models": sorted(models),
        "dimension": dimension,
    }
    if pending:
        level["unsent_requests"] = len(pending)
    if failures:
        level["error"] = f"{len(failures)} failure(s), e.g. {failures[0]}"
    return level


def _percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(pct / 100 * (len(ordered) - 1))))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, default=Path("/tmp/device-out"))
    parser.add_argument("--work", type=Path, default=Path("/tmp/device-run"))
    parser.add_argument("--budget-s", type=float, default=420.0)
    parser.add_argument("--profiles", nargs="+", choices=PROFILES, default=list(PROFILES))
    parser.add_argument("--plain", metavar="MODEL_DIR", help=argparse.SUPPRESS)  # the plain side's process
    parser.add_argument("--texts", help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, default=BATCH, help=argparse.SUPPRESS)
    parser.add_argument("--writes", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.plain:
        print(json.dumps(plain_main(args.plain, args.texts, args.device, args.batch, args.writes)))
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    ctx = Context(out=args.out, device=args.device, quick=args.quick, work=args.work, budget_s=args.budget_s)
    print(json.dumps(run(ctx, tuple(args.profiles)), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
