"""The embedding profiles' full shapes on this CPU: texts/s and peak RSS of ``speed`` (bge-small-en-v1.5, BERT
12 x 384) beside ``quality`` (gte-Qwen2-1.5B-instruct, Qwen2 28 x 1536, 1.5 B parameters in its base model).

Each profile runs in its own fresh process (so its peak RSS is its own): a one-layer directory of the real
configuration and tokenizer (:func:`bench.device.models.build`, the GPT-2 byte-level BPE standing in for
Qwen2's, about as many tokens for English) is loaded through the embeddings stage's own loader
(``stages.embeddings.load_sentence_transformer``: left padding for last-token pooling), then its transformer
is replaced by the FULL shape with random float32 weights (no 6 GB on disk). The texts are transcript-like
segments (4 to 40 words); they are cut at ``--max-tokens`` (the sequence limit), sorted by length and
batched by tokens: a batch holds as many texts as fit ``--batch-tokens`` padded tokens. Vectors are the
stage's (normalized).

    PYTHONPATH=$PWD .venv/bin/python -m bench.embeddings_profiles [--texts-speed 512] [--texts-quality 32]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORDS = (
    "the a we it that to and of in this is for you on with be have not but so what can just like think know "
    "people meeting budget quarter release customer team plan week next data model question really right "
    "number time work going yeah okay well there about said because would could need make want see"
).split()


def texts(count: int, seed: int = 0) -> list[str]:
    """Transcript-like segments: 4 to 40 words each."""
    rng = random.Random(seed)
    return [
        " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 40))).capitalize() + "."
        for _ in range(count)
    ]


def token_batches(lengths: list[int], budget: int) -> list[list[int]]:
    """Indices of texts grouped so that each batch's padded size (longest x count) stays within ``budget``
    tokens, shortest texts first (one text alone may exceed it)."""
    batches: list[list[int]] = []
    current: list[int] = []
    for index in sorted(range(len(lengths)), key=lengths.__getitem__):
        if current and lengths[index] * (len(current) + 1) > budget:
            batches.append(current)
            current = []
        current.append(index)
    if current:
        batches.append(current)
    return batches


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(profile: str, count: int, max_tokens: int, batch_tokens: int) -> dict:
    import torch
    from transformers import AutoConfig, AutoModel

    from bench.device.models import build, shape_spec
    from stages.embeddings import last_token_pooling, load_sentence_transformer

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / profile
        build(profile, folder, device="cpu", layers=1)
        model = load_sentence_transformer(str(folder), "cpu", False)
    spec = shape_spec(profile)
    config = {
        k: v for k, v in spec["config"].items() if k not in ("architectures", "model_type", "torch_dtype")
    }
    torch.manual_seed(0)
    full = AutoModel.from_config(AutoConfig.for_model(spec["config"]["model_type"], **config)).float().eval()
    transformer = model[0]
    # sentence-transformers 5 holds the model as ``model`` (``auto_model`` is a read-only property), 3-4 as
    # ``auto_model``; the module's own forward must run the full shape
    if isinstance(getattr(type(transformer), "auto_model", None), property):
        transformer.model = full
    else:
        transformer.auto_model = full
    assert transformer.auto_model is full, "the full shape is not the one that runs"
    del transformer
    parameters = sum(p.numel() for p in full.parameters())
    built_s = time.perf_counter() - started
    rss_loaded = _rss_mb()
    model.max_seq_length = min(model.max_seq_length or max_tokens, max_tokens)
    tokenizer = model.tokenizer
    batch = texts(count)
    lengths = [min(len(ids), max_tokens) for ids in tokenizer(batch, add_special_tokens=True)["input_ids"]]
    groups = token_batches(lengths, batch_tokens)
    model.encode(batch[:2], normalize_embeddings=True)  # warm-up: first-call allocations
    started = time.perf_counter()
    rows = 0
    for group in groups:
        vectors = model.encode(
            [batch[i] for i in group],
            batch_size=len(group),
            normalize_embeddings=True,
            show_progress_bar=False,
        )
        rows += vectors.shape[0]
    encode_s = time.perf_counter() - started
    return {
        "profile": profile,
        "hub_id": spec["hub_id"],
        "layers": model[0].auto_model.config.num_hidden_layers,
        "hidden": full.config.hidden_size,
        "parameters": parameters,
        "dimension": int(vectors.shape[1]),
        "dtype": str(next(full.parameters()).dtype).removeprefix("torch."),
        "padding_side": tokenizer.padding_side,
        "last_token_pooling": last_token_pooling(model),
        "texts": rows,
        "tokens": sum(lengths),
        "mean_tokens": round(sum(lengths) / len(lengths), 1),
        "batches": len(groups),
        "max_tokens": max_tokens,
        "batch_tokens": batch_tokens,
        "build_s": round(built_s, 1),
        "encode_s": round(encode_s, 2),
        "texts_per_s": round(rows / encode_s, 2),
        "tokens_per_s": round(sum(lengths) / encode_s, 1),
        "rss_loaded_mb": round(rss_loaded),
        "peak_rss_mb": round(_rss_mb()),
        "threads": torch.get_num_threads(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--texts-speed", type=int, default=512)
    parser.add_argument("--texts-quality", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=512, help="sequence limit")
    parser.add_argument("--batch-tokens", type=int, default=4096, help="padded tokens per batch")
    parser.add_argument("--profiles", default="speed,quality")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.count, args.max_tokens, args.batch_tokens)))
        return 0
    results = []
    for profile in args.profiles.split(","):
        count = args.texts_speed if profile == "speed" else args.texts_quality
        done = subprocess.run(
            [sys.executable, "-m", "bench.embeddings_profiles", "--child", profile, "--count", str(count)]
            + ["--max-tokens", str(args.max_tokens), "--batch-tokens", str(args.batch_tokens)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"},
        )
        if done.returncode:
            print(done.stderr[-3000:], file=sys.stderr)
            return done.returncode
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(json.dumps(results[-1]), flush=True)
    print(
        "\n| profile | model | layers x hidden | parameters | dtype | texts | mean tokens | texts/s | tokens/s "
        "| peak RSS |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['profile']} | {r['hub_id']} | {r['layers']} x {r['hidden']} | {r['parameters'] / 1e6:.0f} M "
            f"| {r['dtype']} | {r['texts']} | {r['mean_tokens']} | {r['texts_per_s']} | {r['tokens_per_s']} "
            f"| {r['peak_rss_mb'] / 1024:.2f} GiB |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
