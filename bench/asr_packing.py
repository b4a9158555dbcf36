"""ASR compute on many short clips: one input at a time vs packed batches vs one joined stream (#14).

    .venv/bin/python bench/asr_packing.py [--clips 48] [--rounds 2] [--batch-size 16]

The clips (4-10 s each) are cut at random places from the committed speech
fixtures (several voices and sentences), with a fixed seed. The ASR stage is
loaded once in this process and run three ways over the same decoded audio;
each mode's figure is the stage's own compute time (VAD, language and decoding,
no import or load). Rounds alternate the modes, and the fastest of each counts.

- per input: ``ASR_PACK_INPUTS=false`` (what whisperX does, one file at a time; the default on the CPU)
- packed: the windows of successive inputs share decoder batches (the default on CUDA)
- joined: all clips in one input with 1 s of silence between them (the limit)

Goal: packed at least 1.8x faster than per input, and within 1.1x of joined.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import wave
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import ROOT  # noqa: E402

RATE = 16000
MEDIA = ROOT / "tests" / "fixtures" / "media"
FIXTURES = [MEDIA / "speech.wav", *sorted((MEDIA / "speakers").glob("*.mp4")), *sorted((MEDIA / "speakers").glob("*.wav"))]


def decode(paths: list[Path], out: Path, ids: list[str] | None = None) -> list[Path]:
    """The audio stage, in this process: one audio.json per path."""
    from contracts import StageRequest, WorkItem
    from orchestrator.registry import stage_settings
    from orchestrator.settings import Settings
    from stages.audio import STAGE as AUDIO

    ids = ids or [p.stem for p in paths]
    items = [WorkItem(id=i, inputs={"source": str(p)}, output=str(out / f"{i}.audio.json"), fingerprint="x")
             for i, p in zip(ids, paths)]
    AUDIO.import_libraries()
    result = AUDIO.run(StageRequest(request_id="a", stage="audio", module="stages.audio", batch_size=1,
                                    settings=stage_settings("audio", Settings()).model_dump(mode="json"), result_path=str(out / "a.json"),
                                    items=items))
    assert all(r.ok for r in result.items), [r.error for r in result.items if not r.ok]
    return [out / f"{i}.audio.json" for i in ids]


def write_wav(path: Path, samples) -> None:
    import numpy as np

    pcm = (np.clip(samples, -1, 1) * 32767).astype("<i2")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(RATE)
        w.writeframes(pcm.tobytes())


def make_clips(work: Path, count: int, seed: int) -> tuple[list[Path], Path, float]:
    """``count`` clips of 4-10 s cut from the fixtures, and the same clips joined with 1 s gaps."""
    import numpy as np

    from contracts import AudioArtifact, load_artifact

    pool = []
    for path in decode(FIXTURES, work, [f"fixture{i}" for i in range(len(FIXTURES))]):
        audio = load_artifact(path, AudioArtifact)
        pool.append(np.load(path.parent / audio.sidecar))
        pool.append(np.zeros(RATE // 2, dtype=np.float32))
    pool = np.concatenate(pool)
    rng = random.Random(seed)
    clips, gap, joined = [], np.zeros(RATE, dtype=np.float32), []
    (work / "clips").mkdir()
    for i in range(count):
        length = int(rng.uniform(4.0, 10.0) * RATE)
        start = rng.randrange(0, len(pool) - length)
        piece = pool[start:start + length]
        path = work / "clips" / f"clip{i:03d}.wav"
        write_wav(path, piece)
        clips.append(path)
        joined += [piece, gap]
    joined_path = work / "joined.wav"
    write_wav(joined_path, np.concatenate(joined))
    return clips, joined_path, sum(len(c) for c in joined[::2]) / RATE


def asr(stage, audio_jsons: list[Path], out: Path, batch_size: int, pack: bool, device: str) -> tuple[float, int]:
    """The stage's compute seconds, and how many speech windows it decoded (segments with text)."""
    from contracts import StageRequest, TranscriptArtifact, WorkItem, load_artifact
    from orchestrator.registry import stage_settings
    from orchestrator.settings import Settings

    out.mkdir(parents=True, exist_ok=True)
    items = [WorkItem(id=p.name.split(".")[0], inputs={"audio": str(p)}, output=str(out / f"{p.name.split('.')[0]}.json"),
                      fingerprint="x") for p in audio_jsons]
    settings = stage_settings("asr", Settings(asr_pack_inputs=pack, asr_chunk_size=30)).model_dump(mode="json")
    result = stage.run(StageRequest(request_id="b", stage="asr", module="stages.asr", batch_size=batch_size,
                                    device=device, settings=settings, result_path=str(out / "r.json"), items=items))
    assert all(r.ok for r in result.items), [r.error for r in result.items if not r.ok]
    windows = sum(len(load_artifact(r.output, TranscriptArtifact).segments) for r in result.items)
    return result.compute_s, windows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clips", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=14)
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    args = parser.parse_args()

    import logging
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    logging.basicConfig(level=logging.WARNING)
    from stages.asr import AsrStage

    work = Path(tempfile.mkdtemp(prefix="bench-asr-packing-"))
    try:
        clips, joined, speech_s = make_clips(work, args.clips, args.seed)
        clip_audio = decode(clips, work / "clips")
        joined_audio = decode([joined], work)
        stage = AsrStage()
        times: dict[str, list[float]] = {"per input": [], "packed": [], "joined": []}
        windows: dict[str, int] = {}
        for r in range(args.rounds):
            for mode, audio, pack in (("per input", clip_audio, False), ("packed", clip_audio, True),
                                      ("joined", joined_audio, True)):
                seconds, windows[mode] = asr(stage, audio, work / f"{mode[:6]}{r}", args.batch_size, pack, args.device)
                times[mode].append(seconds)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    best = {mode: min(t) for mode, t in times.items()}
    print(f"\n{args.clips} clips of 4-10 s ({speech_s:.0f} s of audio), embedded tiny.en, {args.device}, "
          f"batch size {args.batch_size}, best of {args.rounds}\n")
    print(f"{'mode':<12} {'compute':>9} {'windows':>8} {'s/window':>9}   all rounds")
    for mode, t in times.items():
        print(f"{mode:<12} {best[mode]:>8.1f}s {windows[mode]:>8} {best[mode] / max(1, windows[mode]):>9.2f}   "
              f"{' '.join(f'{x:.1f}' for x in t)}")
    print(f"\npacked vs per input: {best['per input'] / best['packed']:.2f}x faster (goal >= 1.8x)")
    print(f"packed vs joined stream: {best['packed'] / best['joined']:.2f}x the time (goal <= 1.1x)")


if __name__ == "__main__":
    main()
