"""The embedded diarizer's two runtimes side by side: compute seconds and DER on real and committed audio.

    .venv/bin/python bench/diarization_runtime.py [--rounds 2] [--long 3] [--batch-size 16]

Audio: pyannote.audio's bundled real sample (30 s, two people on the phone,
its RTTM), the two committed espeak dialogues (their RTTM), and ``--long``
inputs of 120-180 s made the way ``bench/batch.py`` makes its realistic batch
(the fixtures joined; no reference, so no DER). Each runtime gets its own
:class:`~stages.diarization.EmbeddedDiarizer` in this process (the ONNX files are
exported at first use, before timing); rounds alternate the runtimes and the
fastest of each counts. DER is pyannote.metrics' with no forgiveness collar;
the two runtimes must give the same turns (the bench says whether they did).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import ROOT

SPEAKERS = ROOT / "tests" / "fixtures" / "media" / "speakers"
RUNTIMES = ("torch", "onnx")


def _reference(path: Path):
    from pyannote.core import Annotation, Segment

    ref = Annotation()
    for line in path.read_text().splitlines():
        f = line.split()
        ref[Segment(float(f[3]), float(f[3]) + float(f[4]))] = f[7]
    return ref


def inputs(work: Path, long: int) -> list[tuple[str, object, object]]:
    """(name, 16 kHz samples, reference or None)."""
    import numpy as np
    import pyannote.audio

    from bench.batch import mixed_inputs
    from stages.audio import STAGE as AUDIO
    from stages.audio import decode

    AUDIO.import_libraries()  # PyAV
    rows = []
    folder = Path(pyannote.audio.__file__).parent / "sample"  # (importing pyannote.audio.sample decodes it)
    samples, _ = decode(folder / "sample.wav")
    rows.append(("pyannote sample", samples, _reference(folder / "sample.rttm")))
    for name in ("host_guest", "host_stranger"):
        samples, _ = decode(SPEAKERS / f"{name}.mp4")
        rows.append((name, samples, _reference(SPEAKERS / f"{name}.rttm")))
    if long:
        paths, _ = mixed_inputs(work / "long", long, 120.0, 180.0, seed=4)
        for path in paths:
            samples, _ = decode(Path(path))
            rows.append((Path(path).stem, np.asarray(samples), None))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--long", type=int, default=3, help="long inputs (120-180 s) to time, no reference")
    parser.add_argument("--batch-size", type=int, default=16, help="DIARIZATION_BATCH_SIZE (default 16)")
    args = parser.parse_args()
    import logging

    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from pyannote.core import Annotation, Segment
    from pyannote.metrics.diarization import DiarizationErrorRate

    import stages.diarization as diarization

    diarization.STAGE.import_libraries()
    work = Path(tempfile.mkdtemp(prefix="bench-diarization-runtime-"))
    try:
        rows = inputs(work, args.long)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    diarizers = {r: diarization.EmbeddedDiarizer("cpu", None, args.batch_size, r) for r in RUNTIMES}
    best = {(r, name): float("inf") for r in RUNTIMES for name, _, _ in rows}
    turns = {}
    for _ in range(args.rounds):
        for runtime, diarizer in diarizers.items():
            for name, samples, _ in rows:
                t0 = time.perf_counter()
                turns[runtime, name] = diarization.relabel(diarizer(samples))
                best[runtime, name] = min(best[runtime, name], time.perf_counter() - t0)
    print(
        f"\ntorch {torch.__version__}, {torch.get_num_threads()} threads, load average "
        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs, batch size {args.batch_size}, best of {args.rounds}; "
        f"{', '.join(f'{r}: {d.runtime}' for r, d in diarizers.items())}\n"
    )
    print(
        f"{'audio':<18} {'audio s':>8} {'torch s':>8} {'onnx s':>8} {'speed-up':>9} {'DER torch':>10} "
        f"{'DER onnx':>9} {'same turns':>11}"
    )
    total = {r: 0.0 for r in RUNTIMES}
    for name, samples, ref in rows:
        der = {}
        for runtime in RUNTIMES:
            total[runtime] += best[runtime, name]
            if ref is not None:
                hyp = Annotation()
                for t in turns[runtime, name]:
                    hyp[Segment(t.start, t.end)] = t.speaker
                der[runtime] = (
                    f"{DiarizationErrorRate(collar=0.0)(ref, hyp, uem=Segment(0, samples.size / 16000)):.1%}"
                )
        same = [(t.start, t.end, t.speaker) for t in turns["torch", name]] == [
            (t.start, t.end, t.speaker) for t in turns["onnx", name]
        ]
        print(
            f"{name:<18} {samples.size / 16000:>8.1f} {best['torch', name]:>8.2f} {best['onnx', name]:>8.2f} "
            f"{best['torch', name] / best['onnx', name]:>8.2f}x {der.get('torch', '-'):>10} {der.get('onnx', '-'):>9} "
            f"{str(same):>11}"
        )
    print(
        f"\nall: torch {total['torch']:.1f} s, onnx {total['onnx']:.1f} s: {total['torch'] / total['onnx']:.2f}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
