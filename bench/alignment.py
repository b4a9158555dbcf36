"""Word timing's cost and the ASR window: alignment time vs ASR time, 30 s vs 6 s windows, WER of each.

    .venv/bin/python bench/alignment.py [--copies 4] [--device cpu]

Inputs: the committed dialogues and speech.wav, ``--copies`` times each. All in
this process with the real stages (no children: this measures the model work):

1. ASR with 30 s windows (the default) and with the old 6 s windows, the latter
   also without the short-piece cleaning (what the pipeline did before issue 13);
2. the alignment stage on the 30 s transcripts (offline: Whisper cross-attention
   with the same model), without speakers.

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
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    import stages.asr as asr_module
    from contracts import StageRequest, TranscriptArtifact, WorkItem, load_artifact
    from stages.alignment import AlignmentStage
    from stages.audio import AudioStage
    from tests.conftest import DIALOGUE_TEXT, SPEECH_TEXT, stage_settings, wer

    clips = {"host_guest": MEDIA / "speakers" / "host_guest.mp4", "host_stranger": MEDIA / "speakers" / "host_stranger.mp4",
             "speech": MEDIA / "speech.wav"}
    reference = {**DIALOGUE_TEXT, "speech": SPEECH_TEXT}
    ids = [f"{name}-{n}" for n in range(args.copies) for name in clips]
    work = Path(tempfile.mkdtemp(prefix="bench-alignment-"))

    def request(stage, module, items, **settings):
        return StageRequest(request_id=stage, stage=stage, module=module, batch_size=16 if stage == "asr" else 8,
                            device=args.device, result_path=str(work / f"{stage}-r.json"),
                            settings=stage_settings(stage, **settings), items=items)

    audio = AudioStage().run(request("audio", "stages.audio", [
        WorkItem(id=i, inputs={"source": str(clips[i.rsplit("-", 1)[0]])}, output=str(work / i / "audio.json"),
                 fingerprint="x") for i in ids]))
    assert all(r.ok for r in audio.items), audio.items

    def asr(tag, chunk):
        items = [WorkItem(id=i, inputs={"audio": str(work / i / "audio.json")}, output=str(work / i / f"asr-{tag}.json"),
                          fingerprint="x") for i in ids]
        result = asr_module.AsrStage().run(request("asr", "stages.asr", items, chunk_size=chunk))
        assert all(r.ok for r in result.items), result.items
        errors = {}
        for name in clips:
            text = " ".join(s.text for s in load_artifact(work / f"{name}-0" / f"asr-{tag}.json", TranscriptArtifact).segments)
            errors[name] = wer(reference[name], text)
        segs = sum(len(load_artifact(work / i / f"asr-{tag}.json", TranscriptArtifact).segments) for i in ids)
        return result, errors, segs

    rows = {}
    rows["30 s windows"] = asr("30", 30)
    rows["6 s windows"] = asr("6", 6)
    cleaning = asr_module.clean_pieces
    asr_module.clean_pieces = lambda pieces: [(float(a), float(b)) for a, b in pieces]
    try:
        rows["6 s windows, no cleaning (before)"] = asr("6raw", 6)
    finally:
        asr_module.clean_pieces = cleaning

    items = [WorkItem(id=i, inputs={"asr": str(work / i / "asr-30.json"), "audio": str(work / i / "audio.json")},
                      output=str(work / i / "transcript.json"), fingerprint="x") for i in ids]
    t0 = time.perf_counter()
    align = AlignmentStage().run(request("alignment", "stages.alignment", items, align=True, speakers=False))
    align_wall = time.perf_counter() - t0
    assert all(r.ok for r in align.items), align.items
    first = load_artifact(work / ids[0] / "transcript.json", TranscriptArtifact)

    print(f"{len(ids)} inputs ({args.copies} copies of {', '.join(clips)}), device {args.device}, work dir {work}")
    print(f"{'ASR':36s} {'load s':>7s} {'compute s':>10s} {'segments':>9s}  WER " + " / ".join(clips))
    for tag, (result, errors, segs) in rows.items():
        print(f"{tag:36s} {result.load_s:7.2f} {result.compute_s:10.2f} {segs:9d}  "
              + " / ".join(f"{errors[n]:.3f}" for n in clips))
    base = rows["30 s windows"][0]
    print(f"6 s / 30 s ASR compute: {rows['6 s windows'][0].compute_s / base.compute_s:.2f}x")
    print(f"alignment ({first.aligner}): load {align.load_s:.2f} s, compute {align.compute_s:.2f} s, wall {align_wall:.2f} s")
    print(f"alignment / ASR (30 s windows): compute {align.compute_s / base.compute_s:.1%}, "
          f"load+compute {(align.load_s + align.compute_s) / (base.load_s + base.compute_s):.1%}")


if __name__ == "__main__":
    main()
