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


def synthesise(out: Path, inputs: int, seed: int = 0, first: int = 0, people=None) -> None:
    """``inputs`` input folders with a diarization artifact of 2 speakers each (voices with noise; from
    ``people``, else ``inputs`` / 5 voices of their own)."""
    import numpy as np

    from contracts import DiarizationArtifact, SpeakerTurn, save_model

    rng = np.random.default_rng(seed)
    if people is None:
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


def grown(out: Path, inputs: int, seed: int = 1):
    """A corpus of ``inputs`` inputs (2 speakers each from ``inputs`` / 5 voices) made without clustering and
    saved in the store in one go, as ``inputs`` inputs' runs would have left it; returns it and the voices."""
    import numpy as np

    from contracts.corpus import CorpusMember, CorpusSpeaker, CorpusSpeakers, speaker_id
    from orchestrator.books.speakers import SpeakerStore

    rng = np.random.default_rng(seed)
    people = rng.standard_normal((max(2, inputs // 5), 192))
    people /= np.linalg.norm(people, axis=1, keepdims=True)
    members: dict[int, list] = {}
    voices = {}
    for n in range(inputs):
        item = f"in{n:06d}"
        for label, p in zip(
            ("SPEAKER_00", "SPEAKER_01"), rng.choice(len(people), 2, replace=False), strict=True
        ):
            v = people[p] + 0.03 * rng.standard_normal(192)
            voices[(item, label)] = v / np.linalg.norm(v)
            members.setdefault(int(p), []).append(
                CorpusMember(item_id=item, speaker=label, seconds=270.0, fingerprint=f"fp{n}")
            )
    speakers = [
        CorpusSpeaker(id=speaker_id(p + 1), centroid=[float(x) for x in people[p]], members=found)
        for p, found in sorted(members.items())
    ]
    corpus = CorpusSpeakers(encoder="campplus", distance=0.3, next_id=len(people) + 1, speakers=speakers)
    SpeakerStore(out).save(None, corpus, voices)
    return corpus, people


def chunk_cost(sizes: list[int], chunks: int, tmp: Path) -> None:
    """A chunk of 50 new inputs placed into a corpus of each size, as a run places them (``place``: the
    chunk's artifacts read, the voices clustered and joined, the change written to the store), beside what
    the same chunk cost before the store: ``speakers.json`` rewritten whole."""
    import numpy as np

    from bench.catalogue import disk_bytes
    from contracts import save_model
    from orchestrator.corpus.labels import read_corpus
    from orchestrator.corpus.speakers import place
    from orchestrator.settings import Settings

    print(
        f"\nchunk cost: {chunks} chunks of 50 new inputs (2 speakers each), the store's upkeep every 20 saves"
    )
    print(
        f"{'corpus inputs':>14} {'first chunk s':>14} {'chunk s p50':>12} {'chunk s mean':>13} {'KB per chunk':>13} "
        f"{'speakers.json MB':>17} {'its write s':>12}"
    )
    for size in sizes:
        out = tmp / f"grown-{size}"
        out.mkdir()
        t0 = time.perf_counter()
        corpus, people = grown(out, size)
        made = time.perf_counter() - t0
        settings = Settings(output_dir=out, corpus_speaker_distance=0.3)
        synthesise(out, 50 * chunks, seed=size, first=size, people=people)  # the corpus's voices again
        t0 = time.perf_counter()
        corpus = read_corpus(out)
        read = time.perf_counter() - t0
        seconds, sizes_kb = [], []
        for c in range(chunks):
            ids = [f"in{n:05d}" for n in range(size + 50 * c, size + 50 * (c + 1))]
            before = disk_bytes(out / ".catalogue")
            t0 = time.perf_counter()
            placed = place(settings, out, ids, corpus)
            seconds.append(time.perf_counter() - t0)
            sizes_kb.append((disk_bytes(out / ".catalogue") - before) / 1e3)
            corpus = placed.corpus
        t0 = time.perf_counter()
        path = save_model(corpus, out / "speakers.json")
        json_s = time.perf_counter() - t0
        mb = path.stat().st_size / 1e6
        print(
            f"{size:>14,} {seconds[0]:>14.3f} {float(np.median(seconds[1:])):>12.3f} "
            f"{float(np.mean(seconds[1:])):>13.3f} {float(np.median(sizes_kb)):>13.1f} {mb:>17.1f} {json_s:>12.2f}"
        )
        print(f"{'':>14} (made in {made:.1f} s; read and validated by the run in {read:.2f} s, once per run)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--distances", default="0.2,0.3,0.4,0.5,0.6")
    parser.add_argument("--inputs", type=int, default=1000)
    parser.add_argument("--skip-quality", action="store_true")
    parser.add_argument("--skip-cost", action="store_true")
    parser.add_argument("--scale", default="1000,100000", help="corpus sizes a chunk's cost is measured at")
    parser.add_argument("--chunks", type=int, default=21)
    args = parser.parse_args()
    import logging

    logging.basicConfig(level=logging.WARNING)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    tmp = Path(tempfile.mkdtemp(prefix="bench-corpus-"))
    if not args.skip_quality:
        quality([float(d) for d in args.distances.split(",")], tmp)
    if not args.skip_cost:
        cost(args.inputs, tmp)
    if args.scale:
        chunk_cost([int(n) for n in args.scale.split(",")], args.chunks, tmp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
