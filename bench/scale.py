"""Corpus scale: planning, the dry run and the resume check at 100,000 inputs.

    .venv/bin/python bench/scale.py [--inputs 100000] [--keep DIR]

1. Makes N tiny WAV files laid out as a corpus of meetings in nested folders
   (``corpus/<group>/<meeting>/audio.wav``: every file has the same name).
2. Runs the real pipeline (``bin/pipeline process``, real children, embedded models,
   no speakers) over ONE short clip, to get real artifacts.
3. Plans the corpus in this process (inputs, ids, duplicates, fingerprints: what
   ``process`` does before its first child) and times it.
4. Completes the output folder without running models for 100,000 inputs: each
   input gets the template's artifacts with its own item id and the fingerprints
   the planner expects (what a finished run leaves, byte for byte apart from those).
5. Times ``bin/pipeline process CORPUS --dry-run`` and the resume run
   ``bin/pipeline process CORPUS`` over the complete folder (it must start no child
   and reuse every input: the run directory's child logs and the run report are
   checked), each in its own process, with the parent's peak RSS.

Goals on the 2-core machine: the dry run < 20 s, the resume check < 20 s, the parent's RSS < 1 GiB
in every step. The catalogue is on (the default): the first rerun indexes every input a chunk at a time,
and the bench checks after it and after the resume check that it holds every input. Each command's CPU
seconds are shown beside its wall time (a shared machine's wall time is mostly other work).
``--dry-run-only`` stops after the dry run: the first rerun writes every input's outputs (about 45 minutes
at 100,000 inputs on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import wave
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ENV = {
    **os.environ,
    "ASR_MODEL": "embedded",
    "PIPELINE_ALLOW_HUB": "false",
    "PIPELINE_SPEAKERS": "false",
    "EMBEDDING_PROFILE": "embedded",
}

#: CPU seconds of each :func:`pipeline` call, in order
CPU: list[float] = []


def make_corpus(root: Path, count: int) -> None:
    """``count`` files named audio.wav, 100 meetings per group folder (each a 0.1 s silence)."""
    frames = b"\0\0" * 1600
    template = root / "template.wav"
    root.mkdir(parents=True)
    with wave.open(str(template), "wb") as fh:
        fh.setnchannels(1)
        fh.setsampwidth(2)
        fh.setframerate(16000)
        fh.writeframes(frames)
    data = template.read_bytes()
    template.unlink()
    for i in range(count):
        folder = root / "meetings" / f"{i // 100:04d}" / f"{i % 100:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "audio.wav").write_bytes(data)


def pipeline(*args: str) -> tuple[float, float, subprocess.CompletedProcess]:
    """(wall s, peak RSS MiB of the parent process alone) of one ``bin/pipeline`` call in its own process
    (bin/pipeline execs Python in the same pid: its VmHWM, read until it exits, is the parent's peak).
    Its CPU seconds (user + system, with any children) go to :data:`CPU`, by the command's first words:
    on a shared machine they say more than the wall time."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    with tempfile.TemporaryFile("w+") as stdout, tempfile.TemporaryFile("w+") as stderr:
        proc = subprocess.Popen(
            [str(ROOT / "bin" / "pipeline"), *args], stdout=stdout, stderr=stderr, text=True, env=ENV
        )
        peak_kib = 0
        while proc.poll() is None:
            try:
                status = Path(f"/proc/{proc.pid}/status").read_text()
                peak_kib = max(peak_kib, int(status.split("VmHWM:")[1].split()[0]))
            except (OSError, IndexError, ValueError):
                pass
            time.sleep(0.05)
        wall = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        CPU.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
        stdout.seek(0)
        stderr.seek(0)
        done = subprocess.CompletedProcess(proc.args, proc.returncode, stdout.read(), stderr.read())
    if done.returncode != 0:
        sys.exit(f"bin/pipeline {' '.join(args)} exited {done.returncode}: {done.stderr[-3000:]}")
    return wall, peak_kib / 1024, done


def catalogue_check(out: Path, inputs: int) -> None:
    """The run's catalogue (on by default) holds every input, as the journal says; its size on disk."""
    from orchestrator.catalogue.store import Catalogue

    indexed = Catalogue(out).indexed()
    size = sum(p.stat().st_size for p in (out / ".catalogue").rglob("*") if p.is_file())
    assert len(indexed) == inputs and all(indexed.values()), (len(indexed), inputs)
    print(f"catalogue: {len(indexed):,} inputs indexed, {size / 1e6:.0f} MB on disk", flush=True)


def writer(report: dict) -> None:
    """What the run's catalogue writer did beside it, from its report."""
    done = report.get("catalogue") or {}
    if done:
        print(
            f"catalogue writer: {done['chunks']:,} chunks, {done['indexed']:,} inputs indexed in "
            f"{done['seconds']:.1f} s beside the run ({done['seconds'] / max(done['chunks'], 1):.3f} s a chunk); "
            f"the run waited {done['waited_s']:.2f} s for it",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--inputs", type=int, default=100_000)
    parser.add_argument("--keep", type=Path, help="work in this folder and keep it")
    parser.add_argument(
        "--dry-run-only",
        action="store_true",
        help="stop after the dry run (the first rerun writes every input's outputs: about 45 min at 100,000)",
    )
    args = parser.parse_args()

    from contracts import load_model
    from orchestrator import Orchestrator, Settings
    from orchestrator.planning.fingerprints import chain_fingerprints, plan_aligner
    from orchestrator.planning.inputs import plan_inputs
    from orchestrator.planning.state import InputState

    work = args.keep or Path(tempfile.mkdtemp(prefix="scale-"))
    corpus, out, template_out = work / "corpus", work / "out", work / "template-out"
    try:
        clock = time.perf_counter()
        make_corpus(corpus, args.inputs)
        print(f"corpus: {args.inputs:,} files in {time.perf_counter() - clock:.1f} s", flush=True)

        clip = work / "clip" / "clip.wav"
        clip.parent.mkdir()
        shutil.copy(ROOT / "tests" / "fixtures" / "media" / "speech.wav", clip)
        pipeline("process", str(clip), "--output", str(template_out), "-q")
        template = template_out / "clip"

        settings = Settings(
            _env_file=None,
            output_dir=out,
            asr_model="embedded",
            allow_hub=False,
            speakers=False,
            embedding_profile="embedded",
        )
        with Orchestrator(settings) as orch:
            specs = orch.stage_specs()
            clock = time.perf_counter()
            inputs = [InputState(inp) for inp in plan_inputs([corpus], out)]
            for inp in inputs:
                chain_fingerprints(inp, specs)
            planning = time.perf_counter() - clock
        print(f"planning: {planning:.1f} s for {len(inputs):,} inputs (ids, index, fingerprints)", flush=True)
        assert len({i.id for i in inputs}) == len(inputs) == args.inputs

        clock = time.perf_counter()
        kept = [s for s in specs if s.keep]
        models = {s.kind: load_model(template / f"{s.kind}.json", s.output) for s in kept}
        npy = (template / "embeddings.npy").read_bytes()
        language = getattr(models.get("transcript"), "language", None)
        for inp in inputs:
            plan_aligner(inp, specs, language)  # the aligner a run picks for the transcript's language
            inp.directory.mkdir(parents=True, exist_ok=True)
            for spec in kept:
                artifact = models[spec.kind].model_copy(
                    update={"item_id": inp.id, "fingerprint": inp.fingerprints[spec.name]}
                )
                (inp.directory / f"{spec.kind}.json").write_text(artifact.model_dump_json())
            (inp.directory / "embeddings.npy").write_bytes(npy)
        print(
            f"completed the output folder in {time.perf_counter() - clock:.1f} s (not timed below)",
            flush=True,
        )

        dry, dry_rss, done = pipeline("process", str(corpus), "--output", str(out), "--dry-run")
        assert f"{args.inputs:,} complete" in done.stdout, done.stdout
        print(
            f"--dry-run: {dry:.1f} s wall, {CPU[-1]:.1f} s CPU (its own planning: "
            f"{done.stdout.split('planned in ')[1].split(';')[0]}), parent peak RSS {dry_rss:.0f} MiB",
            flush=True,
        )
        if args.dry_run_only:
            return
        first, first_rss, _ = pipeline("process", str(corpus), "--output", str(out), "-q")
        report = json.loads((out / "run-report.json").read_text())
        runs = sorted((out / ".runs").iterdir())
        children = len(list(runs[-1].glob("chunk*.log")))
        assert report["ok"] == args.inputs and children == 0, (report["ok"], children)
        print(
            f"first rerun: {first:.1f} s wall, {CPU[-1]:.1f} s CPU, {children} children, {report['ok']:,} ok",
            flush=True,
        )
        writer(report)
        catalogue_check(out, args.inputs)
        again, again_rss, _ = pipeline("process", str(corpus), "--output", str(out), "-q")
        report = json.loads((out / "run-report.json").read_text())
        children = len(list(sorted((out / ".runs").iterdir())[-1].glob("chunk*.log")))
        reused = sum(
            all(s["status"] == "reused" for s in item["stages"].values()) for item in report["inputs"]
        )
        assert report["ok"] == reused == args.inputs and children == 0, (report["ok"], reused, children)
        catalogue_check(out, args.inputs)
        writer(report)
        print(
            f"resume check (outputs already current): {again:.1f} s wall, {CPU[-1]:.1f} s CPU, "
            f"{children} children, {reused:,} inputs with nothing redone",
            flush=True,
        )
        journaled, journaled_rss, _ = pipeline("process", str(corpus), "--output", str(out), "--dry-run")
        print(
            f"--dry-run after a run journaled them: {journaled:.1f} s wall, {CPU[-1]:.1f} s CPU", flush=True
        )

        dry_cpu, first_cpu, again_cpu, journaled_cpu = CPU[-4:]
        print(f"\n| {args.inputs:,} inputs | seconds (wall / CPU) | goal |\n|---|---:|---:|")
        print(f"| planning (in process) | {planning:.1f} | |")
        print(
            "| `--dry-run` (whole command), no journal entries: every artifact validated | "
            f"{dry:.1f} / {dry_cpu:.1f} | < 20 |"
        )
        print(
            f"| `--dry-run` (whole command) after a run journaled them | {journaled:.1f} / {journaled_cpu:.1f} | < 20 |"
        )
        print(
            "| first rerun: outputs step for every input (the folder was made without a run) | "
            f"{first:.1f} / {first_cpu:.1f} | |"
        )
        print(
            f"| resume check of the complete folder (whole command) | {again:.1f} / {again_cpu:.1f} | < 20 |"
        )
        print(
            "| parent peak RSS, MiB: dry run / first rerun / resume check / journaled dry run | "
            f"{dry_rss:.0f} / {first_rss:.0f} / {again_rss:.0f} / {journaled_rss:.0f} | < 1024 |"
        )
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
