"""The output directory's run-level files and folders: the one place their names live.

Inputs get folders of their own in the same directory (``OUT/<id>/``, ids from
``orchestrator.planning.inputs``). An id's top-level name is never one of
:data:`RUN_LEVEL` (compared case-insensitively): the planner reads that set from
here, so a run-level file added later is reserved the day it is added, for
``process``, ``langid`` and API jobs alike. ``tests/orchestrator/test_layout.py``
checks that a real run writes nothing at the top of ``OUT`` that is not an
input's folder or named here.

Beside them, the name a voice profile's file gets in a profiles folder
(:func:`profile_file_name`: ``pipeline enroll`` and ``pipeline speakers name`` write
them).
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from contracts.errors import SettingsError

#: the run report (also kept per run in ``.runs/<run>/``)
REPORT = "run-report.json"
#: append-only history of every (input, stage) completed, across runs
JOURNAL = "journal.jsonl"
#: source -> id, so ids stay stable across runs and never collide
IDS = ".ids.json"
#: one run per output directory (``orchestrator.books.lock``)
LOCK = ".lock"
#: one folder per run: requests, results, children's logs
RUNS = ".runs"
#: ``performance_logs/<run>.jsonl`` (the seeds' name)
PERF_LOGS = "performance_logs"
#: ``pipeline langid``'s tables
LANGID_CSV = "langid.csv"
LANGID_JSON = "langid.json"
#: the output folder's index page
INDEX = "index.html"
#: corpus speakers: which input's speaker is which voice across the folder (``orchestrator.corpus.speakers``)
SPEAKERS = "speakers.json"
#: which inputs may share a Whisper window: input id -> join group, fixed when the folder first sees an input
#: (``orchestrator.planning.groups``)
JOIN_GROUPS = ".join-groups.json"
#: the model substitutions the console has said for this folder (``orchestrator.run.report.notes_to_show``)
NOTES = ".notes.json"
#: the corpus catalogue (LanceDB tables: segments, inputs), derived from the files (``orchestrator.catalogue``)
CATALOGUE = ".catalogue"

RUN_LEVEL: frozenset[str] = frozenset(
    {
        REPORT,
        JOURNAL,
        IDS,
        LOCK,
        RUNS,
        PERF_LOGS,
        LANGID_CSV,
        LANGID_JSON,
        INDEX,
        CATALOGUE,
        SPEAKERS,
        JOIN_GROUPS,
        NOTES,
    }
)


#: ``pipeline export --format`` names -> the file each writes in an input's folder (``OUT/<id>/``)
FORMATS: dict[str, str] = {
    "srt": "transcript.srt",
    "vtt": "transcript.vtt",
    "txt": "transcript.txt",
    "tsv": "transcript.tsv",
    "json": "transcript.words.json",
    "rttm": "transcript.rttm",
    "textgrid": "transcript.TextGrid",
    "eaf": "transcript.eaf",
    "docx": "transcript.docx",
    "html": "transcript.html",
    "aud": "transcript.labels.txt",
}
#: the compressed copy of an input's audio the transcript page plays (written by the audio stage as
#: ``.work/listen.ogg``, moved beside the transcript when the input finishes)
LISTEN = "audio.ogg"


#: what marks a folder as an output folder of the pipeline (any run's, whatever ``--output`` named it): every
#: run makes ``.runs/<run>/`` before it walks its inputs, and writes the index; the input walk never
#: takes a file below such a folder (``orchestrator.planning.inputs.iter_media``)
MARKERS: tuple[str, ...] = (RUNS, IDS)


def is_output(directory: str | Path) -> bool:
    """Whether ``directory`` is the root of an output folder (holds one of :data:`MARKERS`)."""
    return any(os.path.lexists(os.path.join(directory, name)) for name in MARKERS)


def reserved(name: str) -> bool:
    """Whether ``name`` (an id's top-level folder) would take a run-level file's place (any case)."""
    return name.lower() in _LOWER or name.startswith(".")


_LOWER = frozenset(n.lower() for n in RUN_LEVEL)


def path(out: str | Path, name: str) -> Path:
    """``OUT/<name>`` for a run-level ``name`` of this module (anything else is a bug)."""
    if name not in RUN_LEVEL:
        raise ValueError(f"{name!r} is not a run-level name of orchestrator.layout")
    return Path(out) / name


#: the longest readable part of a profile's file name (the rest of the name is in its hash)
STEM_CHARS = 80


def profile_file_name(name: str) -> str:
    """A readable, filesystem-safe file stem for a speaker's name, one per name: the name itself where it
    is one already (``Host``), else a slug and a short hash of the exact name (``Dr_Lee~5d41402abc``), so
    ``Dr Lee`` and ``Dr/Lee`` get two files. ``~`` is never in a name kept as it is: a slug cannot be
    taken for another name's stem. The profile itself keeps the exact name."""
    name = name.strip()
    if not name:
        raise SettingsError("a speaker's name cannot be empty")
    slug = re.sub(r"[^\w.-]+", "_", name).strip("._-")[:STEM_CHARS].rstrip("._-")
    if slug == name:
        return slug
    digest = hashlib.sha256(name.encode()).hexdigest()[:10]
    return f"{slug or 'speaker'}~{digest}"
