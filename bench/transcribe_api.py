"""``/v1/audio/transcriptions`` once warm: the latency of one clip, request after request.

    .venv/bin/python bench/transcribe_api.py [--requests 6] [--clip tests/fixtures/media/speech.wav]
        [--speakers]

``pipeline serve`` runs in its own process (``bench/api.py``'s ``start_server``: the CPU, the embedded
models; speakers off unless ``--speakers``); the official ``openai`` client sends the clip, waits for the
answer, and sends the next. Each request's file differs (the clip with a few more milliseconds of silence
at its end), so that no request is answered from an earlier one's artifacts. The first request pays the
fork server's imports; the later ones are "warm" as the server is today (each request is one job: every
stage child forked and its model loaded again).
Printed: each request's seconds and the p50 of the warm ones (every request but the first). No timing
asserts: figures only.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.api import start_server, stop_server  # noqa: E402


def variant(clip: Path, path: Path, n: int) -> Path:
    """``clip`` (a WAV file) with ``10 * (n + 1)`` ms of silence at its end: other bytes, the same speech."""
    import wave

    with wave.open(str(clip), "rb") as source:
        params = source.getparams()
        frames = source.readframes(source.getnframes())
    pad = int(params.framerate * 0.01 * (n + 1)) * params.sampwidth * params.nchannels
    with wave.open(str(path), "wb") as target:
        target.setparams(params)
        target.writeframes(frames + b"\0" * pad)
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=6)
    ap.add_argument("--clip", type=Path, default=ROOT / "tests" / "fixtures" / "media" / "speech.wav")
    ap.add_argument("--speakers", action="store_true")
    args = ap.parse_args()
    import openai

    state = Path(tempfile.mkdtemp(prefix="transcribe-bench-"))
    env = {
        "PIPELINE_DEVICE": "cpu",
        "PIPELINE_SPEAKERS": "true" if args.speakers else "false",
        "ASR_MODEL": "embedded",
        "EMBEDDING_PROFILE": "embedded",
    }
    proc, url = start_server(state, env)
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=900)
    seconds = []
    try:
        for n in range(args.requests):
            clip = variant(args.clip, state / f"clip-{n}.wav", n)
            started = time.perf_counter()
            with open(clip, "rb") as audio:
                answer = client.audio.transcriptions.create(model="whisper-1", file=audio)
            seconds.append(time.perf_counter() - started)
            print(f"request {n + 1}: {seconds[-1]:.1f} s  {answer.text[:60]!r}", flush=True)
    finally:
        stop_server(proc)
    warm = seconds[1:]
    print(
        f"\nclip {args.clip.name}; first request {seconds[0]:.1f} s; warm p50 {statistics.median(warm):.1f} s "
        f"(min {min(warm):.1f}, max {max(warm):.1f}) over {len(warm)}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
