"""Word timing's cost and the ASR window: alignment time vs ASR time, 30 s vs 6 s windows, WER of each.

    .venv/bin/python bench/alignment.py [--copies 4] [--device cpu]

Inputs: the committed dialogues and speech.wav, ``--copies`` times each, plus ``--long``
inputs that join the three clips ``--joins`` times each (with 0.5 s of silence between),
so that the ASR's VAD windows reach their full 30 s. All in this process with the real
stages (no children: this measures the model work):

1. ASR with 30 s windows (the default) with and without its decode-time word
   timing, and with the old 6 s windows, the latter also without the short-piece
   cleaning (what the pipeline did before the 30 s windows);
2. the alignment stage on the 30 s transcripts (offline: Whisper cross-attention
   with the same model), without speakers: keeping the words the ASR stage timed
   (the default), and as a second pass of the model over transcripts without them
   (each batch's encoder input cut to its longest segment + 1 s, and with Whisper's
   full 30 s padding), with how far the word times differ.

Prints each stage's load and compute seconds, alignment as a fraction of ASR,
and WER per clip for each ASR variant.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MEDIA = ROOT / "tests" / "fixtures" / "media"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=4)
    parser.add_argument("--long", type=int, default=2, help="inputs of the clips joined (30 s windows)")
    parser.add_argument("--joins", type=int, default=3, help="times each long input repeats the three clips")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    import stages.asr as asr_module
    from contracts import AudioArtifact, StageRequest, TranscriptArtifact, WorkItem, load_artifact
    from stages.alignment import AlignmentStage
    from stages.audio import AudioStage
    from stages.whisper import align as whisper_align
    from tests.conftest import DIALOGUE_TEXT, SPEECH_TEXT, stage_settings, wer

    clips = {
        "host_guest": MEDIA / "speakers" / "host_guest.mp4",
        "host_stranger": MEDIA / "speakers" / "host_stranger.mp4",
        "speech": MEDIA / "speech.wav",
    }
    reference = {**DIALOGUE_TEXT, "speech": SPEECH_TEXT}
    ids = [f"{name}-{n}" for n in range(args.copies) for name in clips]
    work = Path(tempfile.mkdtemp(prefix="bench-alignment-"))
    sources = {i: clips[i.rsplit("-", 1)[0]] for i in ids}
    if args.long:
        sources.update(
            {
                f"long-{n}": path
                for n, path in enumerate([joined(clips.values(), args.joins, work)] * args.long)
            }
        )
        ids += [f"long-{n}" for n in range(args.long)]

    def request(stage, module, items, **settings):
        return StageRequest(
            request_id=stage,
            stage=stage,
            module=module,
            batch_size=16 if stage == "asr" else 8,
            device=args.device,
            result_path=str(work / f"{stage}-r.json"),
            settings=stage_settings(stage, **settings),
            items=items,
        )

    audio = AudioStage().run(
        request(
            "audio",
            "stages.audio",
            [
                WorkItem(
                    id=i,
                    inputs={"source": str(sources[i])},
                    output=str(work / i / "audio.json"),
                    fingerprint="x",
                )
                for i in ids
            ],
        )
    )
    assert all(r.ok for r in audio.items), audio.items

    def asr(tag, chunk, words=True):
        items = [
            WorkItem(
                id=i,
                inputs={"audio": str(work / i / "audio.json")},
                output=str(work / i / f"asr-{tag}.json"),
                fingerprint="x",
            )
            for i in ids
        ]
        result = asr_module.AsrStage().run(
            request("asr", "stages.asr", items, chunk_size=chunk, word_timestamps=words)
        )
        assert all(r.ok for r in result.items), result.items
        errors = {}
        for name in clips:
            text = " ".join(
                s.text
                for s in load_artifact(work / f"{name}-0" / f"asr-{tag}.json", TranscriptArtifact).segments
            )
            errors[name] = wer(reference[name], text)
        segs = sum(len(load_artifact(work / i / f"asr-{tag}.json", TranscriptArtifact).segments) for i in ids)
        return result, errors, segs

    asr("warm", 30)  # the process's first run pays one-off costs (thread pools, VAD model): not measured
    rows = {}
    rows["30 s windows, words timed"] = asr("30", 30)
    rows["30 s windows, no word timing"] = asr("30plain", 30, words=False)
    rows["6 s windows, no word timing"] = asr("6", 6, words=False)
    cleaning = asr_module.clean_pieces
    asr_module.clean_pieces = lambda pieces: [(float(a), float(b)) for a, b in pieces]
    try:
        rows["6 s windows, no cleaning (before)"] = asr("6raw", 6, words=False)
    finally:
        asr_module.clean_pieces = cleaning

    def run_alignment(tag, source="30plain"):
        items = [
            WorkItem(
                id=i,
                inputs={"asr": str(work / i / f"asr-{source}.json"), "audio": str(work / i / "audio.json")},
                output=str(work / i / f"transcript-{tag}.json"),
                fingerprint="x",
            )
            for i in ids
        ]
        t0 = time.perf_counter()
        result = AlignmentStage().run(
            request("alignment", "stages.alignment", items, align=True, speakers=False)
        )
        wall = time.perf_counter() - t0
        assert all(r.ok for r in result.items), result.items
        return result, wall

    kept, kept_wall = run_alignment("kept", source="30")
    align, align_wall = run_alignment("cut")
    margin = whisper_align.MARGIN_S
    whisper_align.MARGIN_S = -1.0
    try:
        padded, padded_wall = run_alignment("padded")
    finally:
        whisper_align.MARGIN_S = margin

    def differences(one: str, other: str) -> list[float]:
        diffs = []
        for i in ids:
            x_, y_ = (
                load_artifact(work / i / f"transcript-{t}.json", TranscriptArtifact) for t in (one, other)
            )
            a = [w for s in x_.segments for w in s.words or []]
            b = [w for s in y_.segments for w in s.words or []]
            assert [w.word for w in a] == [w.word for w in b], i
            diffs += [abs(x.start - y.start) for x, y in zip(a, b)] + [
                abs(x.end - y.end) for x, y in zip(a, b)
            ]
        return sorted(diffs)

    seconds = sum(load_artifact(work / i / "audio.json", AudioArtifact).duration_s for i in ids)

    print(
        f"{len(ids)} inputs ({args.copies} copies of {', '.join(clips)}; {args.long} of them joined "
        f"{args.joins} times), {seconds:.0f} s of audio, device {args.device}, work dir {work}"
    )
    print(f"{'ASR':36s} {'load s':>7s} {'compute s':>10s} {'segments':>9s}  WER " + " / ".join(clips))
    for tag, (result, errors, segs) in rows.items():
        print(
            f"{tag:36s} {result.load_s:7.2f} {result.compute_s:10.2f} {segs:9d}  "
            + " / ".join(f"{errors[n]:.3f}" for n in clips)
        )
    base = rows["30 s windows, no word timing"][0]
    timed = rows["30 s windows, words timed"][0]
    print(
        "6 s / 30 s ASR compute (no word timing): "
        f"{rows['6 s windows, no word timing'][0].compute_s / base.compute_s:.2f}x"
    )
    print(
        f"word timing inside the ASR stage: +{timed.compute_s - base.compute_s:.2f} s "
        f"({(timed.compute_s - base.compute_s) / base.compute_s:+.1%} of ASR compute)"
    )
    print("alignment stage (its compute and load+compute as a fraction of ASR without word timing):")
    for tag, (result, wall) in {
        "words timed by the ASR stage (kept)": (kept, kept_wall),
        "second pass, encoder input cut": (align, align_wall),
        "second pass, encoder input padded to 30 s": (padded, padded_wall),
    }.items():
        extra = timed.compute_s - base.compute_s if "kept" in tag else 0.0
        print(
            f"  {tag:44s} load {result.load_s:.2f} s, compute {result.compute_s:.2f} s, wall {wall:.2f} s: "
            f"{result.compute_s / base.compute_s:.1%}, "
            f"{(result.load_s + result.compute_s) / (base.load_s + base.compute_s):.1%}"
            + (
                f"; with the ASR stage's extra {(result.compute_s + extra) / base.compute_s:.1%}"
                if extra
                else ""
            )
        )
    for one, other in (("cut", "padded"), ("kept", "padded")):
        diffs = differences(one, other)
        print(
            f"word times, {one} vs padded ({len(diffs)} word edges): mean {1000 * sum(diffs) / len(diffs):.0f} ms, "
            f"p90 {1000 * diffs[int(0.9 * (len(diffs) - 1))]:.0f} ms, max {1000 * diffs[-1]:.0f} ms"
        )


def joined(paths, times: int, work: Path) -> Path:
    """One WAV of the clips one after another, ``times`` over, with 0.5 s of silence between them."""
    import av
    import numpy as np

    from bench.common import RATE, write_wav

    pieces = []
    for path in paths:
        with av.open(str(path)) as container:
            resampler = av.AudioResampler(format="flt", layout="mono", rate=RATE)
            frames = [f for frame in container.decode(audio=0) for f in resampler.resample(frame)]
            frames += resampler.resample(None)
        pieces.append(np.concatenate([f.to_ndarray().reshape(-1) for f in frames]))
    gap = np.zeros(RATE // 2, dtype=np.float32)
    out = work / "joined.wav"
    write_wav(out, np.concatenate([part for _ in range(times) for piece in pieces for part in (piece, gap)]))
    return out


if __name__ == "__main__":
    main()
