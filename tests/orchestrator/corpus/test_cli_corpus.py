"""`pipeline speakers name` and `pipeline export` through the command line, on output folders made of stored
artifacts (no model runs): voice profiles are never overwritten unasked and one name is one file; export
keeps the run's notes, records what it wrote in the journal, and answers each failure in one line."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from contracts import ExitCode, ProfileClip, VoiceProfile, load_model, save_model
from orchestrator import layout
from orchestrator.corpus.captions import TIGHT_NOTE, without_tight_notes
from orchestrator.corpus.labels import read_corpus
from orchestrator.corpus.speakers import name, place, voice_profile
from orchestrator.layout import profile_file_name
from orchestrator.settings import Settings
from tests.conftest import ROOT, pipeline
from tests.fixtures.disk import fill, tmpfs
from tests.orchestrator.corpus.test_export import transcript
from tests.orchestrator.corpus.test_speakers import PEOPLE, ids_of, make_input, srt


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """The `pipeline` command (bin/pipeline runs this module once its environment is built)."""
    return pipeline(*args, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


def one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


# -- speakers name: voice profiles -----------------------------------------------------------------


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """Three inputs, three corpus speakers (voices 0, 1, 2), and an enrolled profile "Host" (voice 3)."""
    import numpy as np

    from tests.orchestrator.corpus import test_speakers

    # voices of our own noise: test_speakers' tests expect its generator as they left it
    monkeypatch.setattr(test_speakers, "RNG", np.random.default_rng(11))
    out, profiles = tmp_path / "out", tmp_path / "profiles"
    for item, people in {"a": (0, 1), "b": (0, 2), "c": (2, 1)}.items():
        make_input(out, item, people)
    settings = Settings(output_dir=out, profiles_dir=profiles)
    place(settings, out)
    ids = ids_of(read_corpus(out))
    enrolled = [float(x) for x in PEOPLE[3]]
    save_model(
        VoiceProfile(
            item_id="Host",
            fingerprint="enrolled",
            name="Host",
            encoder="campplus",
            encoder_model="campplus:x",
            dimension=len(enrolled),
            embedding=enrolled,
            clips=[
                ProfileClip(path="/clips/host_1.wav", sha256="0" * 64, duration_s=9.0, embedding=enrolled)
            ],
            threshold=0.6,
        ),
        profiles / "Host.json",
    )
    people = {0: ids[("a", "SPEAKER_00")], 1: ids[("a", "SPEAKER_01")], 2: ids[("b", "SPEAKER_01")]}
    return settings, out, profiles, people


def names_on_disk(profiles: Path) -> dict[str, tuple[str, str]]:
    """file name -> (the profile's name, its item id), for every profile `process --profiles` would load."""
    return {
        p.name: (prof.name, prof.item_id)
        for p in sorted(profiles.glob("*.json"))
        for prof in [load_model(p, VoiceProfile)]
    }


def test_naming_never_overwrites_an_enrolled_profile_unless_forced(folder):
    settings, out, profiles, people = folder
    host = (profiles / "Host.json").read_bytes()
    # Given an enrolled "Host", when a corpus speaker is named "Host" without --force
    done = cli("speakers", "name", str(out), people[0], "Host", "--profiles", str(profiles))
    # Then nothing changes, and one line says which profile it would replace and how to go on
    assert done.returncode == ExitCode.USAGE, done.stderr
    line = one_line(done.stderr)
    assert str(profiles / "Host.json") in line and "'Host'" in line and "--force" in line, line
    assert (profiles / "Host.json").read_bytes() == host
    assert all(s.name is None for s in read_corpus(out).speakers) and "[Host]" not in srt(out, "a")

    # When forced: the enrolled profile is replaced by this speaker's, and the command says so
    done = cli("speakers", "name", str(out), people[0], "Host", "--profiles", str(profiles), "--force")
    assert done.returncode == 0, done.stderr
    assert f"REPLACED voice profile {profiles / 'Host.json'}" in done.stderr
    assert names_on_disk(profiles) == {"Host.json": ("Host", people[0])}
    assert "[Host] words of SPEAKER_00" in srt(out, "a")


def test_names_that_slug_alike_are_two_profiles_and_a_rename_leaves_one(folder):
    settings, out, profiles, people = folder
    for person, who in ((1, "Dr Lee"), (2, "Dr/Lee")):
        done = cli("speakers", "name", str(out), people[person], who, "--profiles", str(profiles))
        assert done.returncode == 0, done.stderr
    lee, slash = f"{profile_file_name('Dr Lee')}.json", f"{profile_file_name('Dr/Lee')}.json"
    assert lee != slash and lee.startswith("Dr_Lee~") and slash.startswith("Dr_Lee~")
    assert names_on_disk(profiles) == {
        "Host.json": ("Host", "Host"),
        lee: ("Dr Lee", people[1]),
        slash: ("Dr/Lee", people[2]),
    }
    assert "[Dr/Lee]" in srt(out, "c") and "[Dr Lee]" in srt(out, "c")

    # a rename: the new profile is written, the old one goes (it cannot win a tie with the new one)
    done = cli("speakers", "name", str(out), people[1], "Lee", "--profiles", str(profiles))
    assert done.returncode == 0, done.stderr
    assert f"REPLACED voice profile {profiles / lee}" in done.stderr
    assert names_on_disk(profiles) == {
        "Host.json": ("Host", "Host"),
        "Lee.json": ("Lee", people[1]),
        slash: ("Dr/Lee", people[2]),
    }


def test_a_profile_of_the_former_file_scheme_loads_and_is_replaced_by_its_own_speaker(folder):
    settings, out, profiles, people = folder
    # Given "Dr Lee" named before, her profile in the file the former scheme gave (Dr_Lee.json)
    named = name(settings, out, people[1], "Dr Lee")
    named.profile.rename(profiles / "Dr_Lee.json")
    assert names_on_disk(profiles)["Dr_Lee.json"] == ("Dr Lee", people[1])  # it still loads
    # and another folder's speaker's profile kept under the former scheme for "Dr/Lee"
    corpus = read_corpus(out)
    stranger = corpus.speakers[0].model_copy(update={"name": "Dr/Lee", "id": "S0099"})
    save_model(voice_profile(out, corpus, stranger, 0.6), profiles / "Dr_Lee_.json")
    # When she is named again: her profile moves to the new file; the other one is not hers: refused
    done = cli("speakers", "name", str(out), people[1], "Dr Lee", "--profiles", str(profiles))
    assert done.returncode == 0, done.stderr
    assert names_on_disk(profiles)[f"{profile_file_name('Dr Lee')}.json"] == ("Dr Lee", people[1])
    assert "Dr_Lee.json" not in names_on_disk(profiles)
    done = cli("speakers", "name", str(out), people[2], "Dr/Lee", "--profiles", str(profiles))
    assert done.returncode == ExitCode.USAGE and "Dr_Lee_.json" in one_line(done.stderr)


# -- export: notes, journal, failures -------------------------------------------------------------

NOTES = {
    "plan_notes": ["given 2 times (also as /media/talk-copy.wav); processed once"],
    "notes": ["language undetermined: too little speech"],
    "substitutions": ["embeddings: asked for 'speed', used the embedded all-MiniLM-L6-v2"],
}


@pytest.fixture
def processed(tmp_path):
    """One input as `process` leaves it: artifacts, an SRT, and its "outputs ok" journal event with the files'
    sizes and times and the notes its page showed."""
    out = tmp_path / "out"
    t = transcript()
    save_model(t, out / "talk" / "transcript.json")
    (out / "talk" / "transcript.srt").write_text("1\n00:00:00,200 --> 00:00:02,000\n[Host] Thanks\n")
    files = {
        name: [st.st_size, st.st_mtime_ns]
        for name in ("transcript.json", "transcript.srt")
        for st in [(out / "talk" / name).stat()]
    }
    (out / ".ids.json").write_text(json.dumps({"/media/talk.wav": "talk"}))
    event = {
        "time": "2026-01-01T00:00:00+00:00",
        "run": "run-1",
        "item": "talk",
        "stage": "outputs",
        "status": "ok",
        "fingerprint": "outputs-fp",
        "error": None,
        "files": files,
        "summary": {"duration_s": 12.0, "outputs": {"transcript.srt": str(out / "talk" / "transcript.srt")}}
        | NOTES,
    }
    (out / layout.JOURNAL).write_text(json.dumps(event) + "\n")
    return out


def every_note() -> list[str]:
    return [n for key in ("plan_notes", "notes", "substitutions") for n in NOTES[key]]


def test_export_keeps_the_runs_notes_on_the_page_and_in_the_document(processed):
    import docx

    done = cli("export", str(processed), "-f", "html,docx")
    assert done.returncode == 0, done.stderr
    page = html.unescape((processed / "talk" / "transcript.html").read_text())
    text = "\n".join(p.text for p in docx.Document(str(processed / "talk" / "transcript.docx")).paragraphs)
    for note in every_note():
        assert note in page, note
        assert note in text, note


def test_export_records_what_it_wrote_so_the_next_run_keeps_it(processed):
    from orchestrator.books.journal import Journal

    # When export writes the SRT with other caption settings (and a format the run did not write)
    done = cli("export", str(processed), "-f", "srt,txt", env={"CAPTION_LINE_CHARS": "20"})
    assert done.returncode == 0, done.stderr
    # Then the journal's last "outputs ok" event for it holds what a rerun checks: the run's outputs
    # fingerprint, every file's size and time as export left them, and the notes
    event = Journal(processed / layout.JOURNAL, "check").completed()["talk"].event()
    assert event["fingerprint"] == "outputs-fp" and event["run"].startswith("export-")
    for file_name in ("transcript.json", "transcript.srt", "transcript.txt"):
        st = (processed / "talk" / file_name).stat()
        assert event["files"][file_name] == [st.st_size, st.st_mtime_ns], file_name
    assert set(event["summary"]["outputs"]) == {"transcript.srt", "transcript.txt"}
    kept = {k: event["summary"][k] for k in NOTES}
    # the run's notes, and one counting this SRT's tight cues (20 characters a line: short, fast cues)
    assert (
        TIGHT_NOTE.match(kept["notes"][-1]) and {**kept, "notes": without_tight_notes(kept["notes"])} == NOTES
    )

    # a later run that failed at its outputs: export does not make it look complete
    failed = {"item": "talk", "stage": "outputs", "status": "failed", "fingerprint": "other", "error": "x"}
    with (processed / layout.JOURNAL).open("a") as journal:
        journal.write(json.dumps(failed) + "\n")
    lines = (processed / layout.JOURNAL).read_text()
    assert cli("export", str(processed), "-f", "srt").returncode == 0
    assert (processed / layout.JOURNAL).read_text() == lines


def test_export_answers_a_damaged_corpus_file_in_one_line(processed):
    (processed / "speakers.json").write_text('{"kind": "corpus_speakers", "speakers": [')
    done = cli("export", str(processed))
    assert done.returncode == ExitCode.FAILED
    line = one_line(done.stderr)
    assert line.startswith("error: ") and "speakers.json" in line and "speakers cluster" in line, line
    listed = cli("speakers", "list", str(processed))
    assert listed.returncode == ExitCode.FAILED and one_line(listed.stderr) == line


def test_export_and_speakers_refuse_a_folder_no_run_made_and_write_nothing(tmp_path):
    # Given a folder of someone's own files, with its own index.html, that no `pipeline process` made
    folder = tmp_path / "website"
    folder.mkdir()
    (folder / "index.html").write_text("<h1>my page</h1>")
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    for args in (("export", str(folder)), ("speakers", "cluster", str(folder))):
        done = cli(*args)
        # Then each is a usage error in one line that names the folder, and the folder is as it was
        assert done.returncode == ExitCode.USAGE, (args, done.stderr)
        line = one_line(done.stderr)
        assert "not an output folder" in line and str(folder) in line, line
        assert {p.name: p.read_bytes() for p in folder.iterdir()} == before, args


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB tmpfs of its own."""
    with tmpfs(tmp_path / "disk", "2m") as mount:
        yield mount


def test_export_on_a_full_disk_stops_in_one_line_with_exit_5(processed, small_disk):
    out = small_disk / "out"
    shutil.copytree(processed, out)
    (out / "speakers.json").unlink(missing_ok=True)
    journal = (out / layout.JOURNAL).read_text()
    srt_before = (out / "talk" / "transcript.srt").read_text()
    filler = fill(out)
    # full before it starts (the lock cannot be taken): a usage error, as `process` answers it
    done = cli("export", str(out), "-f", "all")
    assert done.returncode == ExitCode.USAGE and "No space left" in one_line(done.stderr), done.stderr
    # one page free: the lock is taken, the first file written fills the disk; the export stops
    os.truncate(filler, filler.stat().st_size - 4096)
    done = cli("export", str(out), "-f", "all")
    assert done.returncode == ExitCode.DISK_FULL, done.stderr
    line = one_line(done.stderr)
    assert line.startswith("STOPPED disk full: ") and "free some space" in line, line
    # nothing half-written: the SRT as it was, the journal as it was (nothing recorded that was not written)
    assert (out / "talk" / "transcript.srt").read_text() == srt_before
    assert (out / layout.JOURNAL).read_text() == journal
    filler.unlink()
    done = cli("export", str(out), "-f", "all")  # space again: the same command finishes
    assert done.returncode == 0, done.stderr
    assert "1 inputs, 11 files" in done.stderr


@pytest.mark.slow
def test_a_run_after_export_keeps_the_exported_files(tmp_path):
    """process, export with other caption settings, process again: the second run finds the input complete
    from the journal and keeps the exported captions (before, it wrote every file again with its own)."""
    from tests.conftest import MEDIA

    out = tmp_path / "out"
    env = {"ASR_MODEL": "embedded", "PIPELINE_ALLOW_HUB": "false", "EMBEDDING_PROFILE": "embedded"}
    wav = str(MEDIA / "speech.wav")
    run = ("process", wav, wav, "--output", str(out), "--no-speakers")  # given twice: a note on its page
    first = cli(*run, env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    srt_file, page = out / "speech" / "transcript.srt", out / "speech" / "transcript.html"
    before, notes = srt_file.read_text(), re.findall(r"<li>([^<]*)</li>", page.read_text())
    assert any(n.startswith("given 2 times") for n in notes), notes
    done = cli("export", str(out), "-f", "srt,html", env={**env, "CAPTION_LINE_CHARS": "24"})
    assert done.returncode == 0, done.stderr
    # the page keeps the run's notes, but counts the tight cues of these captions
    assert without_tight_notes(re.findall(r"<li>([^<]*)</li>", page.read_text())) == without_tight_notes(
        notes
    )
    exported, stat = srt_file.read_text(), srt_file.stat()
    text = [x for x in exported.splitlines() if x and "-->" not in x and not x.isdigit()]
    assert exported != before and max(map(len, text)) <= 24
    again = cli(*run, env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert srt_file.read_text() == exported and srt_file.stat().st_mtime_ns == stat.st_mtime_ns
    report = json.loads((out / "run-report.json").read_text())
    assert all(s["status"] == "reused" for s in report["inputs"][0]["stages"].values()), report["inputs"]
