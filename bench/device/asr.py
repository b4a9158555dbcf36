"""The device run's ASR section: Whisper on the torch runtime, alone and through the whole pipeline.

Measured, each as audio-hours per hour (= times real time):

- ``base_alone``: the embedded multilingual Whisper base (real weights, converted from its CTranslate2 files) on
  the torch runtime, 30 s windows of a synthetic corpus decoded in batches, greedy and beam 5, float16 on CUDA;
- ``large_v3_shape``: a Whisper large-v3 shape (its real configuration, random weights: 1.5 B parameters cannot
  travel) at a fixed decode length, the comparison with insanely-fast-whisper's figure;
- ``pipeline``: the whole pipeline (decode, ASR, alignment, embeddings; speakers off) with whisper-base through
  the real orchestrator, its stage children on the GPU;
- ``one_process``: the same models in one process (decode, ASR, embeddings in turn), the baseline the
  stage-major pipeline is compared with (``pipeline.wall_s / one_process.wall_s``).

The corpus is built on the machine from the committed fixtures: files of about a minute, English speech of
several voices, 1 s of silence between pieces (``--minutes`` of audio in all).
"""

from __future__ import annotations

import logging
import time
import traceback
import wave
from pathlib import Path

from bench.device.common import ROOT, Context

log = logging.getLogger(__name__)

SAMPLE_RATE = 16_000
#: English speech of several voices (an English corpus: each input's language is still identified)
SOURCES = [
    "tests/fixtures/media/speech.wav",
    "tests/fixtures/media/languages/en.ogg",
    "tests/fixtures/media/speakers/caller_1.ogg",
    "tests/fixtures/media/speakers/host_guest.mp4",
    "tests/fixtures/media/speakers/caller_2.ogg",
]
#: Whisper large-v3's configuration (openai/whisper-large-v3 config.json): 32+32 layers of width 1280, 20 heads,
#: 128 mel bins, 51866 tokens
LARGE_V3 = {
    "vocab_size": 51866,
    "num_mel_bins": 128,
    "d_model": 1280,
    "encoder_layers": 32,
    "decoder_layers": 32,
    "encoder_attention_heads": 20,
    "decoder_attention_heads": 20,
    "encoder_ffn_dim": 5120,
    "decoder_ffn_dim": 5120,
    "max_source_positions": 1500,
    "max_target_positions": 448,
    "decoder_start_token_id": 50258,
    "bos_token_id": 50257,
    "eos_token_id": 50257,
    "pad_token_id": 50256,
}
#: tokens decoded per window in the large-v3 shape (end-of-text suppressed): about 30 s of fast speech
FIXED_TOKENS = 100


def _decode(path: Path):
    import av
    import numpy as np

    with av.open(str(path)) as container:
        resampler = av.AudioResampler(format="flt", layout="mono", rate=SAMPLE_RATE)
        frames = [
            f.to_ndarray().reshape(-1)
            for frame in container.decode(audio=0)
            for f in resampler.resample(frame)
        ]
    return np.concatenate(frames).astype(np.float32)


def make_corpus(work: Path, minutes: float, file_s: float = 60.0) -> tuple[list[Path], float]:
    """WAV files of about ``file_s`` seconds (16 kHz mono) made of the fixtures' speech, ``minutes`` in all."""
    import numpy as np

    pieces = [_decode(ROOT / source) for source in SOURCES]
    gap = np.zeros(SAMPLE_RATE, dtype=np.float32)
    folder = work / "corpus"
    folder.mkdir(parents=True, exist_ok=True)
    files, total, k = [], 0.0, 0
    while total < minutes * 60:
        parts, length = [], 0.0
        while length < min(file_s, minutes * 60 - total) or not parts:
            piece = pieces[k % len(pieces)]
            parts += [piece, gap]
            length += (len(piece) + len(gap)) / SAMPLE_RATE
            k += 1
        audio = np.concatenate(parts)
        path = folder / f"talk_{len(files):03d}.wav"
        with wave.open(str(path), "wb") as out:
            out.setnchannels(1)
            out.setsampwidth(2)
            out.setframerate(SAMPLE_RATE)
            out.writeframes((np.clip(audio, -1, 1) * 32767).astype(np.int16).tobytes())
        files.append(path)
        total += len(audio) / SAMPLE_RATE
    return files, total


def _windows(files: list[Path]) -> list:
    """Every file cut into 30 s windows (the torch runtime's windows where no VAD runs)."""
    out = []
    for path in files:
        audio = _decode(path)
        out += [audio[i : i + 30 * SAMPLE_RATE] for i in range(0, len(audio), 30 * SAMPLE_RATE)]
    return out


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _throughput(whisper, prompt, windows, batch_size: int, device: str, **search) -> dict:
    """Encode and decode every window in batches of ``batch_size``: audio seconds per second."""
    import torch

    audio_s = sum(len(w) for w in windows) / SAMPLE_RATE
    tokens = 0
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    _sync(device)
    started = time.perf_counter()
    for first in range(0, len(windows), batch_size):
        batch = windows[first : first + batch_size]
        encoded = whisper.encode(whisper.features(batch))
        results = whisper.generate(encoded, [prompt] * len(batch), **search)
        tokens += sum(len(r.sequences_ids[0]) for r in results)
    _sync(device)
    wall = time.perf_counter() - started
    out = {
        "batch_size": batch_size,
        "windows": len(windows),
        "audio_s": round(audio_s, 1),
        "wall_s": round(wall, 3),
        "x_realtime": round(audio_s / wall, 1),
        "tokens": tokens,
        "tokens_per_s": round(tokens / wall, 1),
    }
    if device.startswith("cuda"):
        out["peak_allocated_mib"] = round(torch.cuda.max_memory_allocated() / 2**20)
    return out


def base_alone(ctx: Context, files: list[Path], base_dir: Path) -> dict:
    from stages.whisper.torch_model import TorchWhisper, TorchWhisperModel

    whisper = TorchWhisper(str(base_dir), ctx.device)
    tokenizer = TorchWhisperModel(whisper).tokenizer("en")
    prompt = [*tokenizer.sot_sequence, tokenizer.no_timestamps]
    windows = _windows(files)
    first = whisper.generate(whisper.encode(whisper.features(windows[:1])), [prompt], beam_size=5)[0]
    out = {
        "model": str(base_dir.name),
        "dtype": whisper.compute_type,
        "first_window_text": tokenizer.decode(first.sequences_ids[0]),
        "runs": [],
    }
    sizes = [4] if ctx.quick else [16, 32, 64]
    for size in sizes:
        out["runs"].append({"search": "greedy", **_throughput(whisper, prompt, windows, size, ctx.device)})
    out["runs"].append(
        {"search": "beam 5", **_throughput(whisper, prompt, windows, sizes[0], ctx.device, beam_size=5)}
    )
    return out


def large_v3_shape(ctx: Context, files: list[Path], tokenizer_dir: Path) -> dict:
    import torch
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    from stages.whisper.torch_model import TorchWhisper, TorchWhisperModel

    shape = dict(LARGE_V3)
    if ctx.quick:  # the same code on the CPU, a shape that runs in seconds
        shape.update(d_model=256, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4)
        shape.update(decoder_attention_heads=4, encoder_ffn_dim=1024, decoder_ffn_dim=1024)
    started = time.perf_counter()
    with torch.device(ctx.device):
        model = WhisperForConditionalGeneration(WhisperConfig(**shape))
    whisper = TorchWhisper("", ctx.device, model=model, tokenizer_path=str(tokenizer_dir))
    built = time.perf_counter() - started
    tokenizer = TorchWhisperModel(whisper).tokenizer("en")
    prompt = [*tokenizer.sot_sequence, tokenizer.no_timestamps]
    windows = _windows(files)
    # end-of-text suppressed; at most max_length // 2 new tokens (CTranslate2's rule, which generate follows)
    fixed = {"suppress_tokens": [tokenizer.eot], "max_length": 2 * FIXED_TOKENS}
    _throughput(whisper, prompt, windows[:2], 2, ctx.device, **fixed)  # warm-up
    out = {
        "config": shape,
        "parameters_m": round(sum(p.numel() for p in model.parameters()) / 1e6),
        "built_s": round(built, 1),
        "dtype": whisper.compute_type,
        "tokens_per_window": FIXED_TOKENS,
        "runs": [],
    }
    for size in [2] if ctx.quick else [16, 32]:
        out["runs"].append(
            {"search": "greedy", **_throughput(whisper, prompt, windows, size, ctx.device, **fixed)}
        )
    return out


def pipeline(ctx: Context, files: list[Path], base_dir: Path, embedding_model: str | None) -> dict:
    """The real orchestrator over the corpus: every stage a child on the GPU."""
    import shutil

    from orchestrator import Orchestrator, Settings

    out_dir = ctx.work / "pipeline-out"
    shutil.rmtree(out_dir, ignore_errors=True)
    settings = Settings(
        output_dir=out_dir,
        device=ctx.device,
        asr_runtime="torch",
        asr_model=str(base_dir),
        speakers=False,
        corpus_speakers=False,
        embedding_profile=embedding_model or "embedded",
        chunk_size=max(len(files), 1),
    )
    started = time.perf_counter()
    with Orchestrator(settings) as orchestrator:
        report = orchestrator.process(files)
    wall = time.perf_counter() - started
    audio_s = sum(_duration(p) for p in files)
    done = len(list(out_dir.rglob("transcript.json")))
    return {
        "inputs": len(files),
        "transcripts": done,
        "audio_s": round(audio_s, 1),
        "wall_s": round(wall, 1),
        "x_realtime": round(audio_s / wall, 1),
        "report": _report_summary(report),
    }


def one_process(ctx: Context, files: list[Path], base_dir: Path, embedding_model: str | None) -> dict:
    """The same work in one process, models loaded in turn: decode every file, transcribe its 30 s windows on
    the torch runtime (batch 16, beam 5: the pipeline's defaults), embed the segments' text."""
    started = time.perf_counter()
    from stages.whisper.torch_model import TorchWhisper, TorchWhisperModel

    whisper = TorchWhisper(str(base_dir), ctx.device)
    tokenizer = TorchWhisperModel(whisper).tokenizer("en")
    prompt = [*tokenizer.sot_sequence, tokenizer.no_timestamps]
    windows = _windows(files)
    texts = []
    for first in range(0, len(windows), 16):
        batch = windows[first : first + 16]
        results = whisper.generate(
            whisper.encode(whisper.features(batch)), [prompt] * len(batch), beam_size=5
        )
        texts += [tokenizer.decode(r.sequences_ids[0]) for r in results]
    del whisper
    embedded = 0
    if embedding_model:
        from sentence_transformers import SentenceTransformer

        model = SentenceTransformer(embedding_model, device=ctx.device)
        embedded = len(model.encode([t for t in texts if t.strip()], batch_size=128))
    wall = time.perf_counter() - started
    audio_s = sum(len(w) for w in windows) / SAMPLE_RATE
    return {"audio_s": round(audio_s, 1), "wall_s": round(wall, 1), "texts": len(texts), "embedded": embedded}


def _duration(path: Path) -> float:
    with wave.open(str(path)) as f:
        return f.getnframes() / f.getframerate()


def _report_summary(report) -> dict:
    """Per stage: attempts (batch size, outcome), seconds, and the GPU figures each child recorded."""
    try:
        data = report.model_dump(mode="json")
    except AttributeError:
        return {"repr": repr(report)[:500]}
    keep = ("batch_size", "outcome", "ok", "failed", "wall_s", "load_s", "compute_s", "peak_vram_mb")
    keep += ("gpu_process_peak_mib", "gpu_tree_after_mib", "pid")
    out = {"failed": data.get("failed")}
    for stage in data.get("stages") or []:
        out[f"{stage['stage']}-{stage.get('chunk')}"] = [
            {k: (round(v, 2) if isinstance(v, float) else v) for k, v in a.items() if k in keep}
            for a in stage.get("attempts") or []
        ]
    return out


def run(ctx: Context) -> dict:
    result: dict = {"device": ctx.device, "quick": ctx.quick}
    base_dir = ctx.weights / "whisper-base-transformers"
    embedding = ctx.weights / "bge-small"
    embedding_model = str(embedding) if embedding.is_dir() else None
    try:
        files, total = make_corpus(ctx.work, 0.6 if ctx.quick else 24.0, 20.0 if ctx.quick else 60.0)
        result["corpus"] = {"files": len(files), "audio_s": round(total, 1)}
    except Exception as exc:  # noqa: BLE001 - recorded; nothing else can run without a corpus
        result["corpus"] = {
            "error": f"{type(exc).__name__}: {exc}",
            "traceback": traceback.format_exc()[-2000:],
        }
        ctx.write("asr", result)
        return result
    # the pipeline first, while this process has no CUDA context of its own
    parts = [
        ("pipeline", lambda: pipeline(ctx, files, base_dir, embedding_model)),
        ("one_process", lambda: one_process(ctx, files, base_dir, embedding_model)),
        ("base_alone", lambda: base_alone(ctx, files, base_dir)),
        ("large_v3_shape", lambda: large_v3_shape(ctx, files, base_dir)),
    ]
    for name, part in parts:
        if ctx.left() < 30:
            result[name] = {"skipped": f"out of time ({ctx.left():.0f} s left)"}
            continue
        started = time.perf_counter()
        try:
            result[name] = part()
        except Exception as exc:  # noqa: BLE001 - one part's failure is recorded; the others still run
            result[name] = {
                "error": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc()[-3000:],
            }
        result[name]["section_s"] = round(time.perf_counter() - started, 1)
        log.warning("asr: %s done in %.1f s", name, time.perf_counter() - started)
        ctx.write("asr", result)
    if "wall_s" in result.get("pipeline", {}) and "wall_s" in result.get("one_process", {}):
        result["stage_major_vs_one_process"] = round(
            result["pipeline"]["wall_s"] / result["one_process"]["wall_s"], 3
        )
    ctx.write("asr", result)
    return result
