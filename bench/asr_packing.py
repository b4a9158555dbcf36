"""ASR compute on many short clips: one input at a time vs joined windows vs one joined stream.

    .venv/bin/python bench/asr_packing.py [--clips 48] [--rounds 2] [--batch-size 16] [--device cpu]

48 clips of 4-10 s, each a distinct sentence spoken by espeak-ng (four voices;
``apt-get install espeak-ng``: the committed fixtures hold too few distinct
sentences), are decoded once by the audio stage. The ASR stage is loaded once in
this process and run three ways over the same audio; each mode's figure is the
stage's own compute time (VAD, language and decoding, no import or load). Rounds
alternate the modes, and the fastest of each counts.

- per input: ``ASR_JOIN_INPUTS=false`` (what whisperX does, one file at a time)
- joined windows: the default: the speech of several clips shares one 30 s window, 1 s apart
- joined stream: all clips in one input with 1 s of silence between them (the limit)

It checks each clip's transcript against its own sentence: the word error rate of
each mode, and the words given to the wrong clip (words of four letters or more
that are in another clip's sentence, not in its own, and not in what the clip is
heard as alone). Goals: joined windows at least 1.7x faster than per input, within
1.15x of the joined stream, WER within +0.02 of per input, no word to a wrong clip.
"""

from __future__ import annotations

import argparse
import random
import re
import shutil
import subprocess
import sys
import tempfile
import wave
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import ROOT

RATE = 16000
MEDIA = ROOT / "tests" / "fixtures" / "media"
FIXTURES = [
    MEDIA / "speech.wav",
    *sorted((MEDIA / "speakers").glob("*.mp4")),
    *sorted((MEDIA / "speakers").glob("*.wav")),
]
VOICES = ["en-us", "en+f3", "en-gb", "en+f2"]
#: one sentence per clip, none sharing a content word with another on purpose (10-27 words: 4-10 s)
SENTENCES = [
    "The lighthouse keeper counted forty ships before the storm arrived on Tuesday evening.",
    "Our bakery sells warm bread every morning, but the rye loaves are gone by nine.",
    "Please remember to water the tomatoes twice a week while I am travelling.",
    "The museum opened a new wing for ancient pottery found along the northern coast.",
    "A small orange kitten climbed the apple tree and refused to come down for hours.",
    "Engineers tested the bridge with heavy trucks before letting any buses cross it.",
    "My cousin plays the violin in an orchestra that tours through Spain each summer, and she practises "
    "scales for two hours every single morning before breakfast.",
    "The library will close early on Friday because the heating system needs repairs.",
    "Farmers in the valley harvest grapes by hand in late September, when the weather is dry and the "
    "fruit is sweet enough for wine.",
    "Bring a flashlight, extra batteries and warm socks for the camping trip.",
    "The chess tournament lasted three days and ended with a surprising victory.",
    "Students built a robot that sorts recycling into paper, glass and plastic bins.",
    "The train to Edinburgh was delayed by snow, so passengers waited in the station cafe drinking "
    "hot chocolate and reading newspapers.",
    "Fresh paint on the fence means nobody should lean against it until Monday.",
    "The dentist recommends brushing gently for two minutes after every meal.",
    "Whales migrate thousands of miles between feeding grounds and the warm waters where their calves "
    "are born, following routes their ancestors used.",
    "A volunteer fixed the broken swing at the playground near the river.",
    "The orchestra tuned their instruments while the audience found their seats.",
    "Cooking rice properly requires patience, the right amount of water and a lid that fits tightly.",
    "Astronomers spotted a comet that will be visible without a telescope next spring.",
    "The marathon route passes the cathedral, crosses two bridges and finishes beside the harbour, "
    "where crowds gather to cheer the runners.",
    "Our neighbour grows enormous pumpkins and enters them in the county fair.",
    "The pilot announced turbulence and asked everyone to fasten their seatbelts.",
    "Honey never spoils, and archaeologists have found edible jars in Egyptian tombs.",
    "The carpenter measured twice and cut once, which saved wood and time.",
    "Thunder rolled across the hills as the hikers hurried back toward the shelter, their jackets "
    "soaked and their boots heavy with mud.",
    "A quiet corner of the garden is perfect for reading novels on sunny afternoons.",
    "The factory switched to solar panels and cut its electricity bill by half.",
    "Penguins huddle together during the winter storms to keep their eggs warm.",
    "The comedian forgot his lines, but improvised so well that nobody noticed.",
    "Volunteers planted three hundred oak saplings along the motorway last November, hoping to create "
    "a forest for future generations.",
    "Keep the receipt in case the jacket does not fit your brother.",
    "The submarine descended slowly into the dark trench, its lights revealing strange glowing "
    "creatures that scientists had never seen.",
    "Grandfather repairs clocks in his workshop and knows every tick by heart.",
    "The election results will be announced after midnight, once all ballots are counted.",
    "Mountain goats balance on narrow ledges that would terrify most climbers.",
    "A sudden gust of wind carried the umbrella across the parking lot and into a fountain.",
    "The programmer found the bug after staring at the same function for an entire afternoon.",
    "Sailors once navigated by the stars, using simple instruments and careful arithmetic to cross "
    "oceans without any maps of the coastline ahead.",
    "The ice cream van plays the same cheerful tune on every street.",
    "Our hockey team finally won the championship after losing the final four times.",
    "Butterflies taste with their feet, which helps them choose leaves for their eggs.",
    "The architect designed a school with large windows, so the classrooms stay bright all day.",
    "Firefighters rescued a frightened dog from the frozen pond behind the supermarket.",
    "The festival ended with fireworks that lit up the whole bay in red and gold, while musicians "
    "played on a floating stage until dawn.",
    "Always label the spice jars, or cinnamon and paprika will get mixed up.",
    "The old typewriter still works, although the letter e sticks now and then.",
    "Scientists measured the glacier and discovered it had shrunk by twelve metres since last year.",
]


def normalise(text: str) -> str:
    return " ".join(re.sub(r"[^a-z0-9' ]+", " ", text.lower()).split())


def decode(paths: list[Path], out: Path, ids: list[str] | None = None) -> list[Path]:
    """The audio stage, in this process: one audio.json per path."""
    from contracts import StageRequest, WorkItem
    from orchestrator.registry import stage_settings
    from orchestrator.settings import Settings
    from stages.audio import STAGE as AUDIO

    ids = ids or [p.stem for p in paths]
    items = [
        WorkItem(id=i, inputs={"source": str(p)}, output=str(out / f"{i}.audio.json"), fingerprint="x")
        for i, p in zip(ids, paths)
    ]
    AUDIO.import_libraries()
    result = AUDIO.run(
        StageRequest(
            request_id="a",
            stage="audio",
            module="stages.audio",
            batch_size=1,
            settings=stage_settings("audio", Settings()).model_dump(mode="json"),
            result_path=str(out / "a.json"),
            items=items,
        )
    )
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
    """``count`` clips cut at random places from the fixtures (4-10 s each, a fixed seed), and the same clips
    joined with 1 s gaps (bench/diarization_packing.py's input)."""
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
        piece = pool[start : start + length]
        path = work / "clips" / f"clip{i:03d}.wav"
        write_wav(path, piece)
        clips.append(path)
        joined += [piece, gap]
    joined_path = work / "joined.wav"
    write_wav(joined_path, np.concatenate(joined))
    return clips, joined_path, sum(len(c) for c in joined[::2]) / RATE


def spoken_clips(work: Path, count: int, seed: int) -> tuple[list[Path], list[str], Path, list[float]]:
    """``count`` clips, each a distinct sentence spoken by espeak-ng with 0.1-0.5 s of silence around it, and
    the same clips joined with 1 s gaps. Returns the clip WAVs, their sentences, the joined WAV, the lengths."""
    import numpy as np

    if shutil.which("espeak-ng") is None:
        raise SystemExit(
            "bench/asr_packing.py needs espeak-ng to speak its sentences (apt-get install espeak-ng)"
        )
    if count > len(SENTENCES):
        raise SystemExit(f"at most {len(SENTENCES)} clips (one per sentence)")
    rng = random.Random(seed)
    raw = work / "raw"
    raw.mkdir()
    paths = []
    for i, text in enumerate(SENTENCES[:count]):
        path = raw / f"s{i:03d}.wav"
        subprocess.run(
            ["espeak-ng", "-v", VOICES[i % len(VOICES)], "-s", "155", "-w", str(path), text], check=True
        )
        paths.append(path)
    decoded = decode(paths, raw)
    from contracts import AudioArtifact, load_artifact

    (work / "clips").mkdir()
    clips, lengths, joined, gap = [], [], [], np.zeros(RATE, dtype=np.float32)
    for i, audio_json in enumerate(decoded):
        samples = np.load(audio_json.parent / load_artifact(audio_json, AudioArtifact).sidecar)
        pad = [np.zeros(int(rng.uniform(0.1, 0.5) * RATE), dtype=np.float32) for _ in range(2)]
        piece = np.concatenate([pad[0], samples, pad[1]])
        path = work / "clips" / f"clip{i:03d}.wav"
        write_wav(path, piece)
        clips.append(path)
        lengths.append(len(piece) / RATE)
        joined += [piece, gap]
    joined_path = work / "joined.wav"
    write_wav(joined_path, np.concatenate(joined[:-1]))
    return clips, SENTENCES[:count], joined_path, lengths


def asr(
    stage,
    audio_jsons: list[Path],
    out: Path,
    batch_size: int,
    join: bool,
    device: str,
    model: str = "embedded",
):
    """The stage's compute seconds, the part of them spent reading inputs, finding speech (VAD) and identifying
    languages (what joining does not change), its decoder windows, and each input's transcript."""
    import time

    from contracts import StageRequest, TranscriptArtifact, WorkItem, load_artifact
    from orchestrator.registry import stage_settings
    from orchestrator.settings import Settings

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
    settings = stage_settings(
        "asr", Settings(asr_model=model, asr_join_inputs=join, asr_chunk_size=30)
    ).model_dump(mode="json")
    windows, prepare = [], []
    generate, prepare_one = stage._generate, stage._prepare

    def counting(batch, *args):  # the decoder windows, counted as they are decoded (redone alone too)
        windows.append(len(batch))
        return generate(batch, *args)

    def timed(*args):
        t0 = time.perf_counter()
        try:
            return prepare_one(*args)
        finally:
            prepare.append(time.perf_counter() - t0)

    stage._generate, stage._prepare = counting, timed
    cpu = time.process_time()
    try:
        result = stage.run(
            StageRequest(
                request_id="b",
                stage="asr",
                module="stages.asr",
                batch_size=batch_size,
                device=device,
                settings=settings,
                result_path=str(out / "r.json"),
                items=items,
            )
        )
    finally:
        del stage._generate, stage._prepare
    assert all(r.ok for r in result.items), [r.error for r in result.items if not r.ok]
    transcripts = {r.id: load_artifact(r.output, TranscriptArtifact) for r in result.items}
    # CPU seconds of this process over the run (load and all): steadier than wall time on a shared machine
    return result.compute_s, sum(prepare), sum(windows), transcripts, time.process_time() - cpu


def text_of(transcript) -> str:
    return normalise(" ".join(s.text for s in transcript.segments))


def foreign_words(texts: dict[str, str], heard: dict, alone: dict) -> tuple[list, list]:
    """(clip, word) of the words of four letters or more heard in a clip that belong to another clip's sentence,
    are not in its own and not in what the clip is heard as alone: those among the clip's first or last two
    words (where a word given to the wrong input would be), and the others (misheard, e.g. "the glacier" heard
    as "the letter" after a clip that says "letter": Whisper reads on from the text before it)."""
    vocab = {name: set(normalise(text).split()) for name, text in texts.items()}
    edge, inside = [], []
    for name, transcript in heard.items():
        others = {w for k, v in vocab.items() if k != name for w in v if len(w) >= 4}
        others -= vocab[name] | set(text_of(alone[name]).split())
        words = text_of(transcript).split()
        for k, w in enumerate(words):
            if w in others:
                (edge if k < 2 or k >= len(words) - 2 else inside).append((name, w))
    return edge, inside


def time_gaps(heard: dict, alone: dict) -> list[float]:
    """|start difference| of the words of clips heard with the same words in both modes."""
    gaps = []
    for name, transcript in heard.items():
        a = [w for s in transcript.segments for w in (s.words or [])]
        b = [w for s in alone[name].segments for w in (s.words or [])]
        if a and [w.word for w in a] == [w.word for w in b]:
            gaps += [abs(x.start - y.start) for x, y in zip(a, b)]
    return sorted(gaps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clips", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=27)
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument(
        "--model",
        default="embedded",
        help="ASR_MODEL (embedded: tiny.en; whisper-base: "
        "multilingual, each clip's language identified first)",
    )
    args = parser.parse_args()

    import logging
    import os

    import jiwer

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    logging.basicConfig(level=logging.WARNING)
    from stages.asr import AsrStage

    work = Path(tempfile.mkdtemp(prefix="bench-asr-packing-"))
    try:
        clips, sentences, joined, lengths = spoken_clips(work, args.clips, args.seed)
        clip_audio = decode(clips, work / "clips")
        joined_audio = decode([joined], work)
        texts = {p.name.split(".")[0]: t for p, t in zip(clip_audio, sentences)}
        stage = AsrStage()
        modes = (
            ("per input", clip_audio, False),
            ("joined windows", clip_audio, True),
            ("joined stream", joined_audio, True),
        )
        times: dict[str, list[float]] = {mode: [] for mode, _, _ in modes}
        decoding: dict[str, list[float]] = {mode: [] for mode, _, _ in modes}
        cpu: dict[str, list[float]] = {mode: [] for mode, _, _ in modes}
        windows: dict[str, int] = {}
        heard: dict[str, dict] = {}
        for r in range(args.rounds):
            for mode, audio, join in modes:
                seconds, prepare, windows[mode], heard[mode], cpu_s = asr(
                    stage,
                    audio,
                    work / f"{mode[:8].strip()}{r}",
                    args.batch_size,
                    join,
                    args.device,
                    args.model,
                )
                times[mode].append(seconds)
                decoding[mode].append(seconds - prepare)
                cpu[mode].append(cpu_s)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    names = list(texts)
    refs = [normalise(texts[n]) for n in names]
    wer = {
        mode: jiwer.wer(refs, [text_of(heard[mode][n]) for n in names])
        for mode in ("per input", "joined windows")
    }
    wer["joined stream"] = jiwer.wer(" ".join(refs), text_of(next(iter(heard["joined stream"].values()))))
    wrong, misheard = foreign_words(texts, heard["joined windows"], heard["per input"])
    chance = foreign_words(texts, heard["per input"], heard["joined windows"])
    gaps = time_gaps(heard["joined windows"], heard["per input"])
    best = {mode: min(t) for mode, t in times.items()}
    dec = {mode: min(t) for mode, t in decoding.items()}
    cpus = {mode: min(t) for mode, t in cpu.items()}
    print(
        f"\n{args.clips} clips of {min(lengths):.1f}-{max(lengths):.1f} s ({sum(lengths):.0f} s of audio), each a "(
            f"distinct sentence, ASR_MODEL={args.model}, {args.device}, batch size {args.batch_size}, "
            f"best of {args.rounds}\n"
        )
    )
    print(
        f"{'mode':<15} {'compute':>9} {'decoding':>9} {'CPU':>8} {'windows':>8} {'WER':>6}   "
        f"all rounds (compute / decoding / CPU)"
    )
    for mode, t in times.items():
        print(
            f"{mode:<15} {best[mode]:>8.1f}s {dec[mode]:>8.1f}s {cpus[mode]:>7.1f}s {windows[mode]:>8} "(
                f"{wer[mode]:>6.3f}   "
                f"{' '.join(f'{x:.1f}/{y:.1f}/{z:.1f}' for x, y, z in zip(t, decoding[mode], cpu[mode]))}"
            )
        )
    print(
        "(decoding: compute less reading each input, its VAD and language identification, which joining "
        "does not change)"
    )
    print(
        f"\njoined windows vs per input: {best['per input'] / best['joined windows']:.2f}x faster in compute, "
        f"{dec['per input'] / dec['joined windows']:.2f}x in decoding, "
        f"{cpus['per input'] / cpus['joined windows']:.2f}x in CPU seconds (goal >= 1.7x)"
    )
    print(
        f"joined windows vs joined stream: {best['joined windows'] / best['joined stream']:.2f}x the compute, "
        f"{dec['joined windows'] / dec['joined stream']:.2f}x the decoding, "
        f"{cpus['joined windows'] / cpus['joined stream']:.2f}x the CPU seconds (goal <= 1.15x)"
    )
    print(f"WER joined windows - per input: {wer['joined windows'] - wer['per input']:+.3f} (goal <= +0.02)")
    print(
        f"another clip's words at a clip's edges: {len(wrong)} {wrong[:10]} (goal 0: none given to a wrong clip); "
        f"inside a clip, misheard: {len(misheard)} {misheard[:10]}; the same counts per input (by chance): "
        f"{len(chance[0])}, {len(chance[1])}"
    )
    if gaps:
        print(
            f"word starts, joined windows vs per input, over {len(gaps)} words of clips heard alike: median "
            f"{gaps[len(gaps) // 2] * 1000:.0f} ms, 95th percentile {gaps[int(len(gaps) * 0.95)] * 1000:.0f} ms, "
            f"max {gaps[-1] * 1000:.0f} ms"
        )


if __name__ == "__main__":
    main()
