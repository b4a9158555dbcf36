"""Joined windows on the committed fixtures: 32 short clips of 8 known sentences, joined vs one at a time.

    .venv/bin/python bench/asr_joining.py [--copies 4] [--rounds 1] [--batch-size 16] [--device cpu]

No espeak-ng needed (bench/asr_packing.py's 48 sentences need it): eight
sentences of 2.5-5 s whose text is known, in two kinds of voice: speech.wav cut
at the silences between its three sentences, languages/en.ogg, the three
enrollment clips and the host's question of host_guest.mp4 (cut at its RTTM
times). Each is given ``--copies`` times, the sentences in turn, so that a
joined window holds several different sentences (the kind of batch in which
joined windows once swapped words between clips). The ASR stage (embedded
tiny.en, CPU int8 unless told) runs over them with ``ASR_JOIN_INPUTS`` false
and true; it prints each mode's stage compute seconds, word error rate against
the sentences, the words given to a wrong clip (five letters or more, in another
clip's sentence and not in its own: checked against the truth, not a decode),
and how many clip windows a joined run decoded again alone.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.asr_packing import MEDIA, asr, decode, normalise, write_wav

SPEECH = [
    ("The quick brown fox jumps over the lazy dog.", 0.0, 3.25),
    ("She sells sea shells by the sea shore.", 3.25, 5.96),
    ("Please call Stella and ask her to bring these things with her from the store.", 5.96, None),
]
ENROLL = {
    "host_enroll_1": "Welcome back. Today we talk about rivers and bridges.",
    "host_enroll_2": "I grew up near the harbour, close to the boats.",
    "guest_enroll_1": "My grandmother kept old maps in the attic.",
}
#: host_guest.mp4's third turn (RTTM 9.159 s + 3.490 s)
QUESTION = ("And how do you find a road that nobody has used for a century?", 9.159, 3.490)


def sentence_clips(work: Path) -> tuple[dict[str, Path], dict[str, str]]:
    """The eight one-sentence clips: name -> audio.json, name -> its sentence."""
    import numpy as np

    from contracts import AudioArtifact, load_artifact

    (work / "src").mkdir(parents=True)
    whole = decode(
        [MEDIA / "speech.wav", MEDIA / "speakers" / "host_guest.mp4"], work / "src", ["speech", "dialogue"]
    )
    samples = {
        p.name.split(".")[0]: np.load(p.parent / load_artifact(p, AudioArtifact).sidecar) for p in whole
    }
    paths, texts = [], {}
    for n, (text, start, end) in enumerate(SPEECH):
        piece = samples["speech"][int(start * 16000) : int(end * 16000) if end else None]
        write_wav(work / "src" / f"speech_{n}.wav", piece)
        paths.append(work / "src" / f"speech_{n}.wav")
        texts[f"speech_{n}"] = text
    text, start, length = QUESTION
    write_wav(
        work / "src" / "question.wav",
        samples["dialogue"][int((start - 0.2) * 16000) : int((start + length + 0.2) * 16000)],
    )
    paths.append(work / "src" / "question.wav")
    texts["question"] = text
    paths.append(MEDIA / "languages" / "en.ogg")
    texts["en"] = (MEDIA / "languages" / "en.txt").read_text().strip()
    for name, text in ENROLL.items():
        paths.append(MEDIA / "speakers" / f"{name}.wav")
        texts[name] = text
    names = [p.stem for p in paths]
    audio = decode(paths, work / "clips", names)
    return dict(zip(names, audio)), texts


def foreign(heard: dict[str, str], texts: dict[str, str], clip_of: dict[str, str]) -> list[tuple[str, str]]:
    vocab = {k: set(normalise(v).split()) for k, v in texts.items()}
    out = []
    for name, text in heard.items():
        own = vocab[clip_of[name]]
        others = {w for k, v in vocab.items() if k != clip_of[name] for w in v if len(w) >= 5} - own
        out += [(name, w) for w in text.split() if w in others]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--copies", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    import jiwer

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    logging.basicConfig(level=logging.WARNING)
    alone_log: list[str] = []

    class Alone(logging.Handler):
        def emit(self, record):
            if "decoded again alone" in record.getMessage():
                alone_log.append(record.getMessage())

    logging.getLogger("stages.asr").addHandler(Alone())
    logging.getLogger("stages.asr").setLevel(logging.INFO)
    from contracts import AudioArtifact, load_artifact
    from stages.asr import AsrStage

    work = Path(tempfile.mkdtemp(prefix="bench-asr-joining-"))
    try:
        audio, texts = sentence_clips(work)
        # every clip --copies times under its own name, the sentences in turn: clip order s0 s1 ... s7 s0 ...
        inputs, clip_of = [], {}
        (work / "inputs").mkdir()
        for copy in range(args.copies):
            for name, path in audio.items():
                target = work / "inputs" / f"{name}-{copy}.audio.json"
                shutil.copy(path, target)
                sidecar = load_artifact(path, AudioArtifact).sidecar  # read beside the copy: copied once
                if not (work / "inputs" / sidecar).exists():
                    shutil.copy(path.parent / sidecar, work / "inputs" / sidecar)
                inputs.append(target)
                clip_of[f"{name}-{copy}"] = name
        stage = AsrStage()
        refs = [normalise(texts[clip_of[p.name.split(".")[0]]]) for p in inputs]
        print(f"{len(inputs)} clips of {len(texts)} sentences, {args.copies} copies each")
        for round_ in range(args.rounds):
            for join in (False, True):
                alone_log.clear()
                compute, _, windows, transcripts, cpu = asr(
                    stage, inputs, work / f"out-{round_}-{join}", args.batch_size, join, args.device
                )
                heard = {k: normalise(" ".join(s.text for s in t.segments)) for k, t in transcripts.items()}
                wer = jiwer.wer(refs, [heard[p.name.split(".")[0]] for p in inputs])
                wrong = foreign(heard, texts, clip_of)
                print(
                    f"round {round_ + 1} {'joined windows' if join else 'one at a time '}: compute {compute:.1f} s, "
                    f"CPU {cpu:.1f} s, windows {windows}, WER {wer:.3f}, words to a wrong clip {len(wrong)} "
                    f"{wrong[:6]}, clip windows decoded again alone {len(alone_log)}"
                )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
