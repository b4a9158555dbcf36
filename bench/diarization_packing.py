"""Embedded diarizer on many short clips: one input per request vs the chunk's inputs in shared batches.

    .venv/bin/python bench/diarization_packing.py [--clips 48] [--rounds 2] [--batch-size 16] [--device cpu]

The clips (4-10 s each, so one or two 10 s segmentation windows each) are cut
from the committed speech fixtures with a fixed seed (``bench/asr_packing.py``'s
clips). The diarization stage runs in this process two ways over the same
decoded audio; each figure is the stage's own compute seconds (segmentation,
speaker embeddings, clustering; no import or load), summed over its requests.
Rounds alternate the modes, and the fastest of each counts.

- per input: one request per clip (what a stage that diarizes one file at a time does)
- packed: one request of all clips: the segmentation windows of successive inputs share batches, then
  their local-speaker clips share embedding batches (the stage's default)

Both must give the same speaker turns; the bench checks it.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.asr_packing import decode, make_clips


def diarize(
    audio_jsons: list[Path], out: Path, batch_size: int, device: str, one_by_one: bool
) -> tuple[float, dict[str, list]]:
    """Compute seconds summed over the requests, and each input's turns."""
    from contracts import DiarizationArtifact, StageRequest, WorkItem, load_artifact
    from orchestrator.registry import stage_settings
    from orchestrator.settings import Settings
    from stages.diarization import STAGE

    out.mkdir(parents=True, exist_ok=True)
    items = [
        WorkItem(
            id=p.name.split(".")[0],
            inputs={"audio": str(p)},
            output=str(out / f"{p.name.split('.')[0]}.json"),
            fingerprint="x",
        )
        for p in audio_jsons
    ]
    settings = stage_settings("diarization", Settings(diarization_model="embedded")).model_dump(mode="json")
    groups = [[item] for item in items] if one_by_one else [items]
    compute, turns = 0.0, {}
    for n, group in enumerate(groups):
        result = STAGE.run(
            StageRequest(
                request_id=f"d{n}",
                stage="diarization",
                module="stages.diarization",
                batch_size=batch_size,
                device=device,
                settings=settings,
                result_path=str(out / "r.json"),
                items=group,
            )
        )
        assert all(r.ok for r in result.items), [r.error for r in result.items if not r.ok]
        compute += result.compute_s
        for r in result.items:
            turns[r.id] = [
                (t.start, t.end, t.speaker) for t in load_artifact(r.output, DiarizationArtifact).turns
            ]
    return compute, turns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clips", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16, help="DIARIZATION_BATCH_SIZE (default 16)")
    parser.add_argument("--seed", type=int, default=14)
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-diarization-"))
    try:
        clips, _, seconds = make_clips(work, args.clips, args.seed)
        audio = decode(clips, work / "audio")
        best = {"per input": float("inf"), "packed": float("inf")}
        turns = {}
        for r in range(args.rounds):
            for mode in best:
                s, turns[mode] = diarize(
                    audio, work / f"{mode}-{r}", args.batch_size, args.device, one_by_one=mode == "per input"
                )
                best[mode] = min(best[mode], s)
        same = turns["per input"] == turns["packed"]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(
        f"\n{args.clips} clips, {seconds:.0f} s of audio; embedded diarizer, {args.device}, batch size "
        f"{args.batch_size}, best of {args.rounds}\n"
    )
    print(f"{'mode':<12} {'compute':>9} {'vs per input':>13}")
    for mode, s in best.items():
        print(f"{mode:<12} {s:>8.1f}s {best['per input'] / s:>12.2f}x")
    print(f"\nsame turns packed and per input: {same}")


if __name__ == "__main__":
    main()
