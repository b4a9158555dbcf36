"""Corpus speakers: how well voices across files become one id each, and what the corpus step costs.

    .venv/bin/python bench/corpus_speakers.py [--distances 0.2,0.3,0.4,0.5,0.6] [--inputs 1000]

Quality: the committed dialogues' turns re-paired into six files (``tests.fixtures.generate.CORPUS_FILES``:
three espeak voices, each in four files, every pairing and order), diarized by the real embedded
diarizer (in this process, one model load), then placed into corpus speakers
(``orchestrator.corpus.speakers.assign``) at each distance: all files at once, and one file at a time as
successive runs would. Purity / coverage by speaking time against the true voices.

Cost: ``--inputs`` inputs' stored diarization artifacts synthesised (2 speakers each, drawn from
``--inputs`` / 5 voices, 192-d CAM++-sized vectors with noise) into an output folder, then the corpus
step as ``process`` and ``pipeline speakers cluster`` run it (``place``: read every artifact, cluster,
save ``speakers.json``), timed: all inputs new at once; a rerun with nothing new; a chunk of 50 new
inputs joining the 1,000. No model runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def diarize_corpus(tmp: Path):
    """The six files written, decoded and diarized; their artifacts in ``tmp/out/<name>/diarization.json``."""
    from contracts import DiarizationArtifact, StageRequest, WorkItem, load_artifact
    from orchestrator.registry import stage_settings
    from stages.audio import AudioStage
    from stages.diarization import DiarizationStage
    from tests.fixtures.generate import speaker_corpus

    files = speaker_corpus(tmp / "media")
    out = tmp / "out"

    def request(stage, items, **settings):
        return StageRequest(
            request_id=stage,
            stage=stage,
            module=f"stages.{stage}",
            items=items,
            batch_size=4,
            device="cpu",
            settings=stage_settings(stage, **settings).model_dump(mode="json"),
            result_path=str(tmp / f"{stage}.result.json"),
        )

    AudioStage().run(
        request(
            "audio",
            [
                WorkItem(
                    id=n, inputs={"source": str(p)}, output=str(tmp / "a" / n / "audio.json"), fingerprint="a"
                )
                for n, (p, _) in files.items()
            ],
        )
    )
    started = time.perf_counter()
    result = DiarizationStage().run(
        request(
            "diarization",
            [
                WorkItem(
                    id=n,
                    inputs={"audio": str(tmp / "a" / n / "audio.json")},
                    output=str(out / n / "diarization.json"),
                    fingerprint=f"d-{n}",
                )
                for n in files
            ],
            model="embedded",
        )
    )
    assert all(r.ok for r in result.items), result.items
    seconds = time.perf_counter() - started
    (out / ".ids.json").write_text(json.dumps({str(p): n for n, (p, _) in files.items()}))
    arts = {n: load_artifact(out / n / "diarization.json", DiarizationArtifact) for n in files}
    return out, arts, {n: t for n, (_, t) in files.items()}, seconds


def quality(distances: list[float], tmp: Path) -> None:
    from orchestrator.corpus.speakers import assign, read_voices
    from tests.fixtures.generate import corpus_scores

    out, arts, truths, seconds = diarize_corpus(tmp)
    print(
        f"quality: {len(arts)} files, {sum(a.duration_s for a in arts.values()):.0f} s of audio diarized in "
        f"{seconds:.1f} s; speakers per file: {', '.join(f'{n} {len(a.speakers)}' for n, a in arts.items())}"
    )
    voices = {n: read_voices(out / n, n) for n in arts}
    print(f"{'distance':>8} {'mode':>12} {'speakers':>8} {'purity':>7} {'coverage':>8}  split / merged")
    for distance in distances:
        at_once = assign(None, [v for n in arts for v in voices[n]], distance).corpus
        corpus = None
        for n in arts:  # one file a run
            corpus = assign(corpus, voices[n], distance).corpus
        for mode, c in (("all at once", at_once), ("file by file", corpus)):
            s = corpus_scores(c, arts, truths)
            print(
                f"{distance:>8.2f} {mode:>12} {s['speakers']:>8} {s['purity']:>7.3f} {s['coverage']:>8.3f}  "
                f"{','.join(s['split']) or '-'} / {','.join(s['merged']) or '-'}"
            )


def synthesise(out: Path, inputs: int, seed: int = 0, first: int = 0) -> None:
    """``inputs`` input folders with a diarization artifact of 2 speakers each (voices with noise)."""
    import numpy as np

    from contracts import DiarizationArtifact, SpeakerTurn, save_model

    rng = np.random.default_rng(seed)
    people = rng.standard_normal((max(2, inputs // 5), 192))
    people /= np.linalg.norm(people, axis=1, keepdims=True)
    ids = json.loads((out / ".ids.json").read_text()) if (out / ".ids.json").exists() else {}
    for n in range(first, first + inputs):
        item = f"in{n:05d}"
        a, b = rng.choice(len(people), 2, replace=False)
        voices = {}
        for label, p in (("SPEAKER_00", a), ("SPEAKER_01", b)):
            v = people[p] + 0.03 * rng.standard_normal(192)
            voices[label] = [float(x) for x in v / np.linalg.norm(v)]
        turns = [
            SpeakerTurn(start=10.0 * k, end=10.0 * k + 9.0, speaker=f"SPEAKER_0{k % 2}") for k in range(60)
        ]
        save_model(
            DiarizationArtifact(
                item_id=item,
                fingerprint=f"fp{n}",
                source=f"/media/{item}.wav",
                turns=turns,
                model="synthetic",
                requested_model="embedded",
                device="cpu",
                duration_s=600.0,
                voices=voices,
                voice_encoder="campplus:synthetic",
            ),
            out / item / "diarization.json",
        )
        ids[f"/media/{item}.wav"] = item
    (out / ".ids.json").write_text(json.dumps(ids))


def cost(inputs: int, tmp: Path) -> None:
    from orchestrator.corpus.speakers import place
    from orchestrator.settings import Settings

    out = tmp / "scale"
    out.mkdir()
    synthesise(out, inputs)
    settings = Settings(output_dir=out)
    rows = []
    t0 = time.perf_counter()
    placed = place(settings, out)
    rows.append((f"{inputs} new inputs at once", time.perf_counter() - t0, len(placed.corpus.speakers)))
    t0 = time.perf_counter()
    again = place(settings, out)
    rows.append(("rerun, nothing new", time.perf_counter() - t0, len(again.corpus.speakers)))
    synthesise(out, 50, seed=0, first=inputs)
    t0 = time.perf_counter()
    chunk = place(settings, out, [f"in{n:05d}" for n in range(inputs, inputs + 50)])
    rows.append((f"a chunk of 50 new joining {inputs}", time.perf_counter() - t0, len(chunk.corpus.speakers)))
    size = (out / "speakers.json").stat().st_size
    print(f"\ncost: stored embeddings only, {inputs} inputs x 2 speakers; speakers.json {size / 1e6:.1f} MB")
    for what, seconds, speakers in rows:
        print(f"{what:>36}: {seconds:7.2f} s  ({speakers} corpus speakers)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--distances", default="0.2,0.3,0.4,0.5,0.6")
    parser.add_argument("--inputs", type=int, default=1000)
    parser.add_argument("--skip-quality", action="store_true")
    args = parser.parse_args()
    import logging

    logging.basicConfig(level=logging.WARNING)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    tmp = Path(tempfile.mkdtemp(prefix="bench-corpus-"))
    if not args.skip_quality:
        quality([float(d) for d in args.distances.split(",")], tmp)
    cost(args.inputs, tmp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
