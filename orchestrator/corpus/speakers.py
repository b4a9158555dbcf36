"""Corpus speakers: the speakers of every input of an output folder clustered into ``S0001``, ``S0002``, ...

Each input's diarization artifact keeps one voice per speaker (``DiarizationArtifact.voices``). This
module, in the parent (numpy and scipy on stored vectors: no model runs), places those voices into
corpus speakers kept in ``OUT/speakers.json`` (:class:`contracts.corpus.CorpusSpeakers`):

- :func:`place` (after each chunk of ``process``, and ``pipeline speakers cluster``): the voices of
  inputs not placed yet are clustered among themselves (average linkage, cosine distance, cut at
  ``corpus_speaker_distance``; two speakers of one input are never one voice), then each group joins
  the nearest corpus speaker within that distance or becomes a new one. Speakers already placed keep
  their ids; an input diarized again is placed again.
- :func:`name` gives a corpus speaker a name, writes the files of every input it speaks in again
  (from the stored artifacts, as ``pipeline export`` does) and writes a voice profile from its
  voices, so that later runs with ``--profiles`` name it at once: an enrolled profile and a named
  corpus speaker are one thing.
- :func:`merge` and :func:`split` mend the clustering by hand; ids are never reused.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from contracts import (
    DiarizationArtifact,
    EmbeddingsArtifact,
    ProfileClip,
    VoiceProfile,
    load_artifact,
    load_model,
    save_model,
)
from contracts.artifacts import SpeakerEmbeddingsArtifact
from contracts.corpus import CorpusMember, CorpusSpeaker, CorpusSpeakers, speaker_id
from contracts.errors import ArtifactError, PipelineError, SettingsError
from contracts.io import sha256_file
from contracts.stage_settings import DEFAULT_THRESHOLDS
from orchestrator import layout
from orchestrator.books.lock import OutputLock
from orchestrator.corpus.captions import CaptionRules
from orchestrator.corpus.export import journal_for, load_sources, page_notes, record_written
from orchestrator.corpus.labels import corpus_labels, overlap_spans, read_corpus
from orchestrator.corpus.outputs import write_formats, write_outputs
from orchestrator.planning.inputs import load_ids

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Voice:
    """One input's speaker, as its diarization artifact keeps it."""

    item_id: str
    speaker: str
    vector: object  # numpy (dimension,), L2-normalised
    seconds: float
    fingerprint: str
    encoder: str
    enrolled: str | None = None


def encoder_kind(encoder: str) -> str:
    return encoder.split(":", 1)[0]


def read_voices(directory: Path, item_id: str) -> list[Voice] | None:
    """The voices an input's folder keeps (None: no diarization, or one without voices)."""
    import numpy as np

    path = directory / "diarization.json"
    if not path.exists():
        return None
    diarization = load_artifact(path, DiarizationArtifact)
    if not diarization.voices:
        return None
    enrolled: dict[str, str] = {}
    matched = directory / "speaker_embeddings.json"
    if matched.exists():
        try:  # the names only: the sidecar's vectors are not needed
            enrolled = {
                m.speaker: m.name
                for m in SpeakerEmbeddingsArtifact.model_validate_json(matched.read_bytes()).matches
                if m.name
            }
        except ValueError as exc:
            log.warning("%s: enrolled names not read: %s", item_id, exc)
    seconds = Counter()
    for turn in diarization.turns:
        seconds[turn.speaker] += turn.end - turn.start
    return [
        Voice(
            item_id,
            label,
            np.asarray(vector, np.float64),
            round(seconds[label], 3),
            diarization.fingerprint,
            diarization.voice_encoder or "",
            enrolled.get(label),
        )
        for label, vector in sorted(diarization.voices.items())
    ]


# -- clustering (pure) ----------------------------------------------------------------------------


def _unit(vector):
    import numpy as np

    return vector / max(float(np.linalg.norm(vector)), 1e-12)


def group_voices(voices: list[Voice], distance: float) -> list[list[int]]:
    """Indexes of ``voices`` grouped as one voice: average-linkage clusters of cosine distance below
    ``distance``; two speakers of one input are never in one group (the diarizer told them apart)."""
    import numpy as np
    from scipy.cluster.hierarchy import fcluster, linkage
    from scipy.spatial.distance import squareform

    n = len(voices)
    if n <= 1:
        return [list(range(n))]
    vectors = np.stack([v.vector for v in voices])
    dist = np.clip(1.0 - vectors @ vectors.T, 0.0, 2.0)
    items = np.array([v.item_id for v in voices], dtype=object)
    dist[items[:, None] == items[None, :]] = 2.0  # cannot-link: the same input's speakers
    np.fill_diagonal(dist, 0.0)
    labels = fcluster(
        linkage(squareform(dist, checks=False), method="average"), t=distance, criterion="distance"
    )
    groups: list[list[int]] = []
    for label in np.unique(labels):
        members = [int(i) for i in np.flatnonzero(labels == label)]
        centre = _unit(vectors[members].mean(axis=0))
        parts: list[list[int]] = []  # still two of one input (average linkage allows it): most central first
        for i in sorted(members, key=lambda i: -float(vectors[i] @ centre)):
            part = next((p for p in parts if all(voices[j].item_id != voices[i].item_id for j in p)), None)
            if part is None:
                parts.append([i])
            else:
                part.append(i)
        groups.extend(parts)
    return sorted(groups, key=lambda g: (-sum(voices[i].seconds for i in g), min(g)))


def _centroid(vectors_seconds) -> list[float]:
    import numpy as np

    total = sum(np.asarray(v) * max(s, 1e-3) for v, s in vectors_seconds)
    return [float(x) for x in _unit(np.asarray(total, np.float64))]


def _number(sid: str) -> int:
    return int(sid[1:])


class Index:
    """Lookups over one :class:`CorpusSpeakers`, built once and then moved forward by each :func:`assign` to
    the corpus it makes (a run's chunks): which corpus speakers each input's speakers are in, where each
    speaker is in the list, and every centroid as one matrix. With it a chunk's placement costs what the
    chunk and the speakers it joins hold, not what the corpus holds (the corpus of 100,000 inputs is walked
    once per run, not once per chunk)."""

    def __init__(self, corpus: CorpusSpeakers) -> None:
        import numpy as np

        self.corpus = corpus  # kept alive: the cache below is keyed by its id()
        self.items: dict[str, list[tuple[str, CorpusMember]]] = {}
        for s in corpus.speakers:
            for m in s.members:
                self.items.setdefault(m.item_id, []).append((s.id, m))
        self.by_id = {s.id: s for s in corpus.speakers}
        self.pos = {s.id: n for n, s in enumerate(corpus.speakers)}
        self.row = dict(self.pos)
        self.ids = [s.id for s in corpus.speakers]
        dimension = len(corpus.speakers[0].centroid) if corpus.speakers else 0
        self.matrix = np.zeros((max(len(self.ids), 16), dimension))
        if corpus.speakers:
            self.matrix[: len(self.ids)] = np.array([s.centroid for s in corpus.speakers], np.float64)
        self.alive = np.zeros(len(self.matrix), bool)
        self.alive[: len(self.ids)] = True

    def state(self, item: str) -> tuple[str, set[str]] | None:
        """``item``'s placed state: its diarization's fingerprint and its speakers' labels (None: not placed)."""
        found = self.items.get(item)
        if not found:
            return None
        return found[0][1].fingerprint, {m.speaker for _, m in found}

    def reserve(self, rows: int, dimension: int) -> None:
        """Room in the matrix for ``rows`` more speakers (doubled when it is short: amortised)."""
        import numpy as np

        need = len(self.ids) + rows
        if self.matrix.shape[1] != dimension and not self.ids:
            self.matrix = np.zeros((max(need, 16), dimension))
            self.alive = np.zeros(len(self.matrix), bool)
        if need > len(self.matrix):
            grown = np.zeros((max(need, 2 * len(self.matrix)), self.matrix.shape[1]))
            grown[: len(self.matrix)] = self.matrix
            alive = np.zeros(len(grown), bool)
            alive[: len(self.alive)] = self.alive
            self.matrix, self.alive = grown, alive


#: the indexes of the last corpora :func:`assign` made or was given, by the id() of the corpus they index
_INDEXES: dict[int, Index] = {}


def index_of(corpus: CorpusSpeakers) -> Index:
    found = _INDEXES.get(id(corpus))
    if found is not None and found.corpus is corpus:
        return found
    return _remember(Index(corpus))


def _take(corpus: CorpusSpeakers) -> Index:
    """``corpus``'s index, to be moved forward: it leaves the cache (a second :func:`assign` from the same
    corpus builds its own again)."""
    index = index_of(corpus)
    _INDEXES.pop(id(corpus), None)
    return index


def _remember(index: Index) -> Index:
    while len(_INDEXES) >= 4:
        _INDEXES.pop(next(iter(_INDEXES)))
    _INDEXES[id(index.corpus)] = index
    return index


def unplaced(corpus: CorpusSpeakers | None, voices: list[Voice]) -> set[str]:
    """Inputs of ``voices`` not placed in ``corpus`` as they are now (new, or diarized again since)."""
    now: dict[str, tuple[str, set]] = {}
    for v in voices:
        now.setdefault(v.item_id, (v.fingerprint, set()))[1].add(v.speaker)
    if corpus is None:
        return set(now)
    index = index_of(corpus)
    return {item for item, state in now.items() if index.state(item) != state}


def _member(voice: Voice) -> CorpusMember:
    return CorpusMember(
        item_id=voice.item_id,
        speaker=voice.speaker,
        seconds=voice.seconds,
        fingerprint=voice.fingerprint,
        enrolled=voice.enrolled,
    )


@dataclass
class Placed:
    """What :func:`assign` changed."""

    corpus: CorpusSpeakers
    #: inputs whose speakers' corpus labels changed (their files are to be written again)
    changed: set[str] = field(default_factory=set)
    new_speakers: list[str] = field(default_factory=list)
    #: voices of another encoder than the corpus's, left out
    skipped: int = 0
    #: inputs whose members were placed (again): their rows are the ones to write
    placed: set[str] = field(default_factory=set)
    #: corpus speakers whose members, centroid or label changed (new ones too), and the ones now gone
    touched: set[str] = field(default_factory=set)
    gone: set[str] = field(default_factory=set)
    #: none of ``placed`` was placed before (their rows are appended), every ``touched`` speaker is new
    fresh: bool = False
    new_only: bool = False


def assign(
    corpus: CorpusSpeakers | None,
    voices: list[Voice],
    distance: float,
    vectors: dict[tuple[str, str], object] | None = None,
) -> Placed:
    """``corpus`` with ``voices`` placed (pure: no file is read). A voice already placed with the same
    fingerprint stays where it is; every other voice of those inputs is placed again. ``vectors`` gives
    the voices of members already placed whose speaker must be recomputed (inputs re-diarized); the
    centroid of a speaker that only gains members is updated from its own. Costs what ``voices`` and the
    speakers they join hold (:class:`Index`)."""
    import numpy as np

    corpus = corpus or CorpusSpeakers(distance=distance)
    kinds = {encoder_kind(v.encoder) for v in voices}
    kind = corpus.encoder or (
        max(sorted(kinds), key=lambda k: sum(encoder_kind(v.encoder) == k for v in voices)) if kinds else None
    )
    skipped = [v for v in voices if encoder_kind(v.encoder) != kind]
    voices = [v for v in voices if encoder_kind(v.encoder) == kind]
    fresh_items = unplaced(corpus, voices)
    index = _take(corpus)
    new = [v for v in voices if v.item_id in fresh_items]
    changed = set(fresh_items)

    # the speakers these inputs are in: members of re-placed inputs leave them, profiles' names change
    enrolled = {(v.item_id, v.speaker): v.enrolled for v in voices}
    relabelled = {
        item
        for item in {v.item_id for v in voices} - fresh_items
        for _, m in index.items.get(item, [])
        if enrolled.get((m.item_id, m.speaker), m.enrolled) != m.enrolled
    }
    was_placed = any(item in index.items for item in fresh_items | relabelled)
    work: dict[str, dict] = {}
    for sid in sorted({sid for item in {v.item_id for v in voices} for sid, _ in index.items.get(item, [])}):
        s = index.by_id[sid]
        kept = [
            m.model_copy(update={"enrolled": enrolled[(m.item_id, m.speaker)]})
            if enrolled.get((m.item_id, m.speaker), m.enrolled) != m.enrolled
            else m
            for m in s.members
            if m.item_id not in fresh_items
        ]
        centroid = s.centroid
        if kept and len(kept) != len(s.members):
            known = [
                (vectors[(m.item_id, m.speaker)], m.seconds)
                for m in kept
                if vectors and (m.item_id, m.speaker) in vectors
            ]
            centroid = _centroid(known) if known else centroid
        if kept == s.members:
            continue  # nothing of it changed
        work[sid] = {"name": s.name, "centroid": centroid, "members": kept}
    groups = group_voices(new, distance) if new else []
    if new:
        index.reserve(len(groups), len(new[0].vector))
    matrix, alive, row, ids = index.matrix, index.alive, index.row, index.ids
    known_rows = len(ids)
    for sid, w in work.items():
        if w["members"]:
            matrix[row[sid]] = w["centroid"]
        else:
            alive[row[sid]] = False
    joined: dict[str, set[str]] = {}  # inputs given a member of a speaker here -> those speakers
    next_id = corpus.next_id
    new_ids = []
    centres = [np.asarray(_centroid([(new[i].vector, new[i].seconds) for i in group])) for group in groups]
    # every group against every speaker in one product (a row per group); the speakers this loop changes
    # (and those it makes) are left out of it and compared one by one
    dirty: set[int] = {row[sid] for sid in work}
    base = None
    if centres and known_rows:
        base = np.stack(centres) @ matrix[:known_rows].T
        base[:, ~alive[:known_rows]] = -np.inf
        base[:, sorted(dirty)] = -np.inf
    for g, group in enumerate(groups):
        members = [new[i] for i in group]
        items = {v.item_id for v in members}
        centre = centres[g]
        barred = {row[sid] for item in items for sid in joined.get(item, ())}  # another voice of an input
        best_row, best_sim = None, 1.0 - distance
        if base is not None:
            column = base[g]
            hidden = [(r, column[r]) for r in barred if r < known_rows]
            for r, _ in hidden:
                column[r] = -np.inf
            top = int(np.argmax(column))
            if column[top] >= best_sim:
                best_row, best_sim = top, float(column[top])
            for r, value in hidden:
                column[r] = value
        others = np.array(sorted(r for r in dirty - barred if alive[r]), dtype=np.int64)
        if len(others):
            sims = matrix[others] @ centre
            top = int(np.argmax(sims))
            if sims[top] >= best_sim and (best_row is None or sims[top] > best_sim):
                best_row, best_sim = int(others[top]), float(sims[top])
        if best_row is None:
            best = speaker_id(next_id)
            next_id += 1
            new_ids.append(best)
            row[best] = len(ids)
            ids.append(best)
            work[best] = {"name": None, "centroid": [float(x) for x in centre], "members": []}
        else:
            best = ids[best_row]
            if best not in work:
                s = index.by_id[best]
                work[best] = {"name": s.name, "centroid": s.centroid, "members": list(s.members)}
            w = work[best]
            had = sum(m.seconds for m in w["members"])
            w["centroid"] = _centroid([(w["centroid"], had), *[(v.vector, v.seconds) for v in members]])
        r = row[best]
        matrix[r] = work[best]["centroid"]
        alive[r] = True
        if r < known_rows and r not in dirty and base is not None:
            base[:, r] = -np.inf  # its centroid moved: compared one by one from now on
        dirty.add(r)
        work[best]["members"] = work[best]["members"] + [_member(v) for v in members]
        for item in items:
            joined.setdefault(item, set()).add(best)

    # the result: the speakers untouched are the same objects, in the same places
    rebuilt = {
        sid: CorpusSpeaker(
            id=sid,
            name=w["name"],
            centroid=w["centroid"],
            members=sorted(w["members"], key=lambda m: (m.item_id, m.speaker)),
        )
        for sid, w in work.items()
        if w["members"]
    }
    gone = {sid for sid, w in work.items() if not w["members"]}
    touched = set(rebuilt) | gone
    before = {sid: index.by_id.get(sid) for sid in touched}
    speakers = list(corpus.speakers)
    for sid, speaker in rebuilt.items():
        if sid in index.pos:
            speakers[index.pos[sid]] = speaker
    speakers += [rebuilt[sid] for sid in new_ids]  # ids only grow: the list stays in order
    if gone:
        speakers = [s for s in speakers if s.id not in gone]
    result = CorpusSpeakers.model_construct(
        encoder=kind, distance=distance, next_id=next_id, merged=corpus.merged, speakers=speakers
    )
    # an unnamed speaker's label comes from its members' enrolled names: inputs sharing it show it anew
    for sid in touched:
        before_s, after_s = before[sid], rebuilt.get(sid)
        if (before_s.label if before_s else None) != (after_s.label if after_s else None):
            changed |= {m.item_id for s in (before_s, after_s) if s is not None for m in s.members}
    _forward(index, result, rebuilt, gone, before)
    return Placed(
        result,
        changed,
        new_ids,
        len(skipped),
        set(fresh_items) | relabelled,
        touched,
        gone,
        fresh=not was_placed,
        new_only=all(before[sid] is None for sid in touched),
    )


def _forward(index: Index, result: CorpusSpeakers, rebuilt: dict, gone: set[str], before: dict) -> None:
    """``index`` moved forward to ``result``: only the speakers :func:`assign` rebuilt or dropped change."""
    affected = {
        m.item_id
        for sid in set(rebuilt) | gone
        for s in (before[sid], rebuilt.get(sid))
        if s
        for m in s.members
    }
    for item in affected:
        entries = [(sid, m) for sid, m in index.items.get(item, []) if sid not in rebuilt and sid not in gone]
        if entries:
            index.items[item] = entries
        else:
            index.items.pop(item, None)
    for sid, s in rebuilt.items():
        for m in s.members:
            index.items.setdefault(m.item_id, []).append((sid, m))
        index.by_id[sid] = s
    for sid in gone:
        index.by_id.pop(sid, None)
    if gone:
        index.pos = {s.id: n for n, s in enumerate(result.speakers)}
    else:
        base = len(index.pos)
        for n, sid in enumerate(s.id for s in result.speakers[base:]):
            index.pos[sid] = base + n
    index.corpus = result
    _remember(index)


# -- the output folder --------------------------------------------------------------------------


def save_corpus(
    out: Path,
    corpus: CorpusSpeakers,
    before: CorpusSpeakers | None,
    voices: dict[tuple[str, str], object] | None = None,
    placed: Placed | None = None,
) -> None:
    """Write what changed from ``before`` (as last read or saved) to ``corpus`` into the catalogue's store
    (:class:`~orchestrator.books.speakers.SpeakerStore`): ``placed``, when :func:`assign` made
    ``corpus``, says what changed without comparing the two whole, so a chunk's placement costs what it
    places. ``voices``: the vectors of members new to the store. A folder with no store yet
    (``speakers.json`` of an earlier version) is brought in whole, its members' voices read from their
    diarization artifacts."""
    from orchestrator.books.speakers import Change, SpeakerStore

    store = SpeakerStore(out)
    voices = dict(voices or {})
    if not store.exists():
        missing = [m for s in corpus.speakers for m in s.members if (m.item_id, m.speaker) not in voices]
        voices.update(_vectors(out, missing))
    change = None
    if placed is not None and before is not None:
        now = index_of(corpus)
        change = Change(
            members={item: list(now.items.get(item, [])) for item in placed.placed},
            fresh=placed.fresh,
            speakers=[now.by_id[sid] for sid in sorted(placed.touched) if sid in now.by_id],
            new_only=placed.new_only,
            gone=set(placed.gone),
        )
    store.save(before, corpus, voices, change)


def export_corpus(out: Path, corpus: CorpusSpeakers) -> Path:
    """``OUT/speakers.json``: the store's corpus as a file to hand on (written at a run's end and by each
    ``pipeline speakers`` command; the store, not this file, is read back)."""
    return save_model(corpus, layout.path(out, layout.SPEAKERS))


def folder_items(out: Path) -> list[str]:
    """Every input id of the output folder (its index of ids), sorted."""
    return sorted(set(load_ids(out).values()))


def place(
    settings, out: Path, item_ids: list[str] | None = None, corpus: CorpusSpeakers | None = None
) -> Placed:
    """Place the voices of ``item_ids`` (default: every input of ``out``) among the folder's corpus speakers
    and save what changed (:func:`save_corpus`); return what changed. The caller holds the output folder's
    lock and rewrites the files of ``Placed.changed`` inputs (:func:`rewrite`), unless it is about to write
    them anyway. ``corpus``: the folder's corpus as the caller last saved it (a run's chunks), so that it is
    not read again."""
    corpus = corpus if corpus is not None else read_corpus(out)
    voices: list[Voice] = []
    missing = 0
    for item_id in item_ids if item_ids is not None else folder_items(out):
        try:
            found = read_voices(out / item_id, item_id)
        except (PipelineError, OSError, ValueError) as exc:
            log.warning("%s: speakers not placed: %s", item_id, exc)
            continue
        if found is None:
            missing += (out / item_id / "diarization.json").exists()
            continue
        voices.extend(found)
    if missing:
        log.warning(
            "%d input(s) diarized before voices were kept: rerun `pipeline process` on them to place "
            "their speakers",
            missing,
        )
    rediarized = _rediarized_vectors(out, corpus, voices)
    placed = assign(corpus, voices, settings.corpus_speaker_distance, rediarized)
    fresh = {(v.item_id, v.speaker): v.vector for v in voices}
    if placed.skipped:
        log.warning(
            "%d speaker(s) embedded by another encoder than the corpus's (%s) left out",
            placed.skipped,
            placed.corpus.encoder,
        )
    if placed.placed or placed.touched or corpus is None:
        save_corpus(out, placed.corpus, corpus, fresh, placed)
    return placed


def _rediarized_vectors(out: Path, corpus: CorpusSpeakers | None, voices: list[Voice]) -> dict:
    """The voices of members whose speaker loses a re-diarized input's member (its centroid is recomputed):
    as the store keeps them, else from their diarization artifacts."""
    if corpus is None:
        return {}
    from orchestrator.books.speakers import SpeakerStore

    redone = unplaced(corpus, voices)
    index = index_of(corpus)
    touched = {sid for item in redone for sid, _ in index.items.get(item, [])}
    members = [m for sid in sorted(touched) for m in index.by_id[sid].members if m.item_id not in redone]
    if not members:
        return {}
    store = SpeakerStore(out)
    found = store.vectors((m.item_id, m.speaker) for m in members) if store.exists() else {}
    return found | _vectors(out, [m for m in members if (m.item_id, m.speaker) not in found])


def labels_of(corpus: CorpusSpeakers | None, item_ids) -> dict[str, dict[str, tuple[str, str]]]:
    """:func:`~orchestrator.corpus.labels.corpus_labels` for ``item_ids`` only (through the corpus's
    :class:`Index`: what these inputs hold, not what the corpus holds)."""
    if corpus is None:
        return {}
    index = index_of(corpus)
    labels: dict[str, dict[str, tuple[str, str]]] = {}
    for item in item_ids:
        for sid, m in index.items.get(item, []):
            labels.setdefault(item, {})[m.speaker] = (sid, index.by_id[sid].label)
    return labels


def _vectors(out: Path, members: list[CorpusMember]) -> dict[tuple[str, str], object]:
    vectors = {}
    for item_id in sorted({m.item_id for m in members}):
        for v in read_voices(out / item_id, item_id) or []:
            vectors[(v.item_id, v.speaker)] = v.vector
    return {
        (m.item_id, m.speaker): vectors[(m.item_id, m.speaker)]
        for m in members
        if (m.item_id, m.speaker) in vectors
    }


def rewrite(settings, out: Path, item_ids: set[str] | list[str], corpus: CorpusSpeakers | None = None) -> int:
    """Write the files of ``item_ids`` again from their stored artifacts with the corpus speakers' labels:
    every format the folder holds, ``segments.jsonl`` too; starts no child. The journal gets each
    input's new file sizes, so the next run still finds it complete without reading its artifacts.
    Returns the number of inputs written."""
    import numpy as np

    labels = corpus_labels(corpus if corpus is not None else read_corpus(out))
    rules = CaptionRules.from_settings(settings)
    journal = journal_for(out, "speakers")
    completed = journal.completed() if item_ids else {}
    written = 0
    for item_id in sorted(item_ids):
        directory = out / item_id
        if not (directory / "transcript.json").exists():
            continue
        event = completed[item_id].event() if item_id in completed else {}
        try:
            src = load_sources(
                directory, item_id, rules, page_notes(event.get("summary")), corpus=labels.get(item_id)
            )
            formats = [name for name, file in layout.FORMATS.items() if (directory / file).exists()]
            if (directory / "segments.jsonl").exists() and (directory / "embeddings.json").exists():
                embeddings = load_artifact(directory / "embeddings.json", EmbeddingsArtifact)
                vectors = np.load(directory / embeddings.sidecar, allow_pickle=False)
                files = write_outputs(directory, src, embeddings, vectors, formats)
            else:
                files = write_formats(directory, src, formats)
        except (PipelineError, OSError, ValueError) as exc:
            log.warning("%s: files not written again: %s", item_id, exc)
            continue
        written += 1
        record_written(journal, item_id, event, files, src)
    return written


#: inputs placed at once by ``speakers cluster``: their voices' distance matrix is (2 x 1,000)^2 doubles, 32 MB
PLACE_BATCH = 1000


def cluster(settings, out: Path) -> Placed:
    """``pipeline speakers cluster OUT``: place every input's speakers not placed yet (``PLACE_BATCH`` inputs
    at a time, as successive runs would), write their files."""
    with OutputLock(out, wait=settings.wait_for_output, existing=True):
        items = folder_items(out)
        placed = Placed(read_corpus(out) or CorpusSpeakers(distance=settings.corpus_speaker_distance))
        for start in range(0, max(len(items), 1), PLACE_BATCH):
            step = place(settings, out, items[start : start + PLACE_BATCH], placed.corpus)
            placed = Placed(
                step.corpus,
                placed.changed | step.changed,
                placed.new_speakers + step.new_speakers,
                placed.skipped + step.skipped,
            )
        export_corpus(out, placed.corpus)
        rewrite(settings, out, placed.changed, placed.corpus)
    return placed


# -- listing ---------------------------------------------------------------------------------------


@dataclass
class SpeakerSummary:
    id: str
    label: str
    name: str | None
    inputs: int
    seconds: float
    #: the longest stretch of it speaking alone: (input id, file to listen to, start, end)
    clean_turn: tuple[str, str, float, float] | None
    members: list[tuple[str, str]]


def clean_turns(diarization: DiarizationArtifact, speaker: str) -> list[tuple[float, float]]:
    """``speaker``'s turns less the times another voice speaks too."""
    spans = overlap_spans(diarization.turns)
    out = []
    for turn in (t for t in diarization.turns if t.speaker == speaker):
        start = turn.start
        for a, b in spans:
            if b <= start or a >= turn.end:
                continue
            if a > start:
                out.append((start, a))
            start = max(start, b)
        if turn.end > start:
            out.append((start, turn.end))
    return out


def _listen(directory: Path, diarization: DiarizationArtifact) -> str:
    copy = directory / layout.LISTEN
    return str(copy) if copy.exists() else diarization.source


def summaries(out: Path, corpus: CorpusSpeakers | None = None) -> list[SpeakerSummary]:
    """``pipeline speakers list OUT``: each corpus speaker, longest speaking time first."""
    corpus = corpus if corpus is not None else read_corpus(out)
    rows = []
    cache: dict[str, DiarizationArtifact | None] = {}
    for s in corpus.speakers if corpus else []:
        best = None
        for m in s.members:
            if m.item_id not in cache:
                try:
                    cache[m.item_id] = load_artifact(
                        out / m.item_id / "diarization.json", DiarizationArtifact
                    )
                except ArtifactError:
                    cache[m.item_id] = None
            diarization = cache[m.item_id]
            if diarization is None:
                continue
            for a, b in clean_turns(diarization, m.speaker):
                if best is None or b - a > best[3] - best[2]:
                    best = (m.item_id, _listen(out / m.item_id, diarization), round(a, 3), round(b, 3))
        rows.append(
            SpeakerSummary(
                s.id,
                s.label,
                s.name,
                len({m.item_id for m in s.members}),
                round(s.seconds, 3),
                best,
                [(m.item_id, m.speaker) for m in s.members],
            )
        )
    return sorted(rows, key=lambda r: (-r.seconds, r.id))


# -- mending -----------------------------------------------------------------------------------------


def _find(corpus: CorpusSpeakers | None, sid: str) -> CorpusSpeaker:
    if corpus is None:
        raise SettingsError(
            "this output folder has no corpus speakers yet: run `pipeline speakers cluster` first"
        )
    sid = corpus.merged.get(sid, sid)
    for s in corpus.speakers:
        if s.id == sid:
            return s
    raise SettingsError(f"no corpus speaker {sid}: `pipeline speakers list` shows them")


def _replace(
    corpus: CorpusSpeakers,
    *speakers: CorpusSpeaker,
    drop: tuple[str, ...] = (),
    merged: dict[str, str] | None = None,
    next_id: int | None = None,
) -> CorpusSpeakers:
    by_id = {s.id: s for s in corpus.speakers if s.id not in drop}
    by_id.update({s.id: s for s in speakers})
    return CorpusSpeakers(
        encoder=corpus.encoder,
        distance=corpus.distance,
        next_id=next_id or corpus.next_id,
        speakers=[by_id[k] for k in sorted(by_id, key=_number)],
        merged=merged or corpus.merged,
    )


@dataclass
class Named:
    speaker: CorpusSpeaker
    profile: Path | None
    rewritten: int
    #: profiles this naming removed or replaced (the speaker's own under its former name, or with --force)
    replaced: list[Path] = field(default_factory=list)


def _profiles(directory: Path) -> list[tuple[Path, VoiceProfile]]:
    """The readable voice profiles of ``directory`` (others are left alone, and logged)."""
    found = []
    for path in sorted(directory.glob("*.json")) if directory.is_dir() else []:
        try:
            found.append((path, load_model(path, VoiceProfile)))
        except PipelineError as exc:
            log.warning("voice profile not read: %s", exc)
    return found


def _own_profile(out: Path, corpus: CorpusSpeakers, speaker: CorpusSpeaker, profile: VoiceProfile) -> bool:
    """``profile`` was written by ``speakers name`` for this corpus speaker of this output folder (or one
    merged into it), not enrolled from clips, nor another folder's speaker."""
    root = out.resolve()
    return corpus.merged.get(profile.item_id, profile.item_id) == speaker.id and all(
        Path(c.path.split("#", 1)[0]).is_relative_to(root) for c in profile.clips
    )


def _describe(path: Path, profile: VoiceProfile) -> str:
    clips = len(profile.clips)
    return f"{path} ({profile.name!r}, {clips} clip{'s' if clips != 1 else ''})"


def name(settings, out: Path, sid: str, new_name: str, profile: bool = True, force: bool = False) -> Named:
    """``pipeline speakers name OUT S0007 "Dr. Lee"``: the name on every file the speaker is in, and a voice
    profile ``PROFILES_DIR/<file stem of the name>.json`` from its voices (``profile``: when a profiles
    directory is set). Another profile of that name (an enrolled one, another folder's speaker's) or in
    that file is replaced only with ``force``: else a :class:`SettingsError` says which it would replace.
    The speaker's own profile under a former name is removed once the new one is written."""
    from orchestrator.layout import profile_file_name

    new_name = new_name.strip()
    if not new_name:
        raise SettingsError("a speaker's name cannot be empty")
    with OutputLock(out, wait=settings.wait_for_output, existing=True):
        before = corpus = read_corpus(out)
        speaker = _find(corpus, sid)
        taken = [s.id for s in corpus.speakers if s.name == new_name and s.id != speaker.id]
        if taken:
            raise SettingsError(
                f"{taken[0]} is already named {new_name!r}: merge them "
                f"(`pipeline speakers merge {out} {taken[0]} {speaker.id}`) or choose another name"
            )
        path, stale, replaced = None, [], []
        if profile and settings.profiles_dir is not None:
            directory = Path(settings.profiles_dir)
            path = directory / f"{profile_file_name(new_name)}.json"
            existing = _profiles(directory)
            own = [p for p, prof in existing if _own_profile(out, corpus, speaker, prof)]
            others = [
                (p, prof)
                for p, prof in existing
                if p not in own and (prof.name == new_name or p.name == path.name)
            ]
            if others and not force:
                raise SettingsError(
                    f"naming {speaker.id} {new_name!r} would replace voice profile "
                    f"{'; '.join(_describe(p, prof) for p, prof in others)}: pass --force to replace it, "
                    "or choose another name"
                )
            stale = [p for p in [*own, *(p for p, _ in others)] if p != path]
            replaced = [p for p in own if p != path] + [p for p, _ in others]
        speaker = speaker.model_copy(update={"name": new_name})
        corpus = _replace(corpus, speaker)
        if path is not None:
            # the new profile first: a failure after it leaves two profiles, never none
            save_model(voice_profile(out, corpus, speaker, settings.speaker_threshold), path)
            log.info("%s: voice profile %s", speaker.id, path)
            for old in stale:
                old.unlink(missing_ok=True)
                log.info("%s: voice profile %s removed (replaced by %s)", speaker.id, old, path)
        save_corpus(out, corpus, before)
        export_corpus(out, corpus)
        rewritten = rewrite(settings, out, {m.item_id for m in speaker.members}, corpus)
    return Named(speaker, path, rewritten, replaced)


def voice_profile(
    out: Path, corpus: CorpusSpeakers, speaker: CorpusSpeaker, threshold: float | None = None
) -> VoiceProfile:
    """A voice profile (the format ``pipeline enroll`` writes) from a corpus speaker's voices: one clip per
    input it speaks in (the input's diarization artifact, with that speaker's label and its seconds)."""
    vectors = _vectors(out, speaker.members)
    clips = []
    for m in speaker.members:
        if (m.item_id, m.speaker) not in vectors:
            continue
        path = out / m.item_id / "diarization.json"
        clips.append(
            ProfileClip(
                path=f"{path.resolve()}#{m.speaker}",
                sha256=sha256_file(path),
                duration_s=max(m.seconds, 1e-3),
                embedding=[float(x) for x in _unit(vectors[(m.item_id, m.speaker)])],
            )
        )
    if not clips:
        raise ArtifactError(
            out / speaker.members[0].item_id / "diarization.json",
            f"{speaker.id}: none of its inputs' diarization artifacts is readable",
        )
    kind = corpus.encoder or "campplus"
    first = load_artifact(out / speaker.members[0].item_id / "diarization.json", DiarizationArtifact)
    identity = json.dumps(sorted((c.path, c.sha256) for c in clips))
    return VoiceProfile(
        item_id=speaker.id,
        fingerprint=hashlib.sha256(identity.encode()).hexdigest()[:32],
        name=speaker.name,
        encoder=kind,
        encoder_model=first.voice_encoder or kind,
        dimension=len(speaker.centroid),
        embedding=_centroid([(c.embedding, c.duration_s) for c in clips]),
        clips=clips,
        threshold=DEFAULT_THRESHOLDS.get(kind, 0.6) if threshold is None else threshold,
    )


def merge(settings, out: Path, keep: str, other: str) -> CorpusSpeaker:
    """``pipeline speakers merge OUT S0007 S0012``: S0012's inputs become S0007's (S0012 is not used again)."""
    with OutputLock(out, wait=settings.wait_for_output, existing=True):
        before = corpus = read_corpus(out)
        a, b = _find(corpus, keep), _find(corpus, other)
        if a.id == b.id:
            raise SettingsError(f"{keep} and {other} are one speaker already")
        both = {m.item_id for m in a.members} & {m.item_id for m in b.members}
        if both:
            log.warning(
                "%s and %s both speak in %s: that input's two speakers become one",
                a.id,
                b.id,
                ", ".join(sorted(both)),
            )
        merged_speaker = CorpusSpeaker(
            id=a.id,
            name=a.name or b.name,
            centroid=_centroid([(a.centroid, a.seconds), (b.centroid, b.seconds)]),
            members=sorted([*a.members, *b.members], key=lambda m: (m.item_id, m.speaker)),
        )
        merged = {k: (a.id if v == b.id else v) for k, v in corpus.merged.items()} | {b.id: a.id}
        corpus = _replace(corpus, merged_speaker, drop=(b.id,), merged=merged)
        save_corpus(out, corpus, before)
        export_corpus(out, corpus)
        rewrite(settings, out, {m.item_id for m in merged_speaker.members}, corpus)
    return merged_speaker


def split(
    settings, out: Path, sid: str, item_ids: list[str] | None = None, distance: float | None = None
) -> list[CorpusSpeaker]:
    """``pipeline speakers split OUT S0007 --input ID ...``: those inputs' members of S0007 become a new
    corpus speaker (a wrong merge mended); the rest stay S0007. Without ``item_ids``, S0007's voices are
    grouped again at ``distance`` (default: half the ``corpus_speaker_distance`` setting): the group with
    the most speech keeps S0007, each other one becomes a new corpus speaker. Returns the new ones."""
    with OutputLock(out, wait=settings.wait_for_output, existing=True):
        before = corpus = read_corpus(out)
        speaker = _find(corpus, sid)
        vectors = _vectors(out, speaker.members)
        if item_ids:
            unknown = sorted(set(item_ids) - {m.item_id for m in speaker.members})
            if unknown:
                raise SettingsError(f"{speaker.id} does not speak in {', '.join(unknown)}")
            parts = [
                [m for m in speaker.members if m.item_id not in set(item_ids)],
                [m for m in speaker.members if m.item_id in set(item_ids)],
            ]
        else:
            distance = settings.corpus_speaker_distance / 2 if distance is None else distance
            known = [m for m in speaker.members if (m.item_id, m.speaker) in vectors]
            voices = [
                Voice(m.item_id, m.speaker, vectors[(m.item_id, m.speaker)], m.seconds, m.fingerprint, "")
                for m in known
            ]
            parts = [[known[i] for i in group] for group in group_voices(voices, distance)] if voices else []
            if len(parts) >= 2:  # members whose voices are not readable stay
                parts[0] += [m for m in speaker.members if (m.item_id, m.speaker) not in vectors]
            if len(parts) < 2:
                raise SettingsError(
                    f"{speaker.id}'s voices are one voice even at distance {distance:g}: name the "
                    "inputs to split off with --input, or a lower distance"
                )
        if any(not part for part in parts):
            raise SettingsError(
                f"splitting {speaker.id} needs some of its inputs to move and some to stay "
                f"(it speaks in {len({m.item_id for m in speaker.members})})"
            )

        def centroid(members):
            known = [
                (vectors[(m.item_id, m.speaker)], m.seconds)
                for m in members
                if (m.item_id, m.speaker) in vectors
            ]
            return _centroid(known) if known else speaker.centroid  # voices unreadable: keep the old centre

        kept = speaker.model_copy(update={"centroid": centroid(parts[0]), "members": parts[0]})
        new = [
            CorpusSpeaker(id=speaker_id(corpus.next_id + n), centroid=centroid(part), members=part)
            for n, part in enumerate(parts[1:])
        ]
        corpus = _replace(corpus, kept, *new, next_id=corpus.next_id + len(new))
        save_corpus(out, corpus, before)
        export_corpus(out, corpus)
        rewrite(settings, out, {m.item_id for part in parts[1:] for m in part}, corpus)
    return new
