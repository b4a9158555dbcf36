"""The corpus speakers' book: three tables in the output folder's LanceDB (``OUT/.catalogue/``, beside the
search catalogue's), written a chunk at a time.

- ``corpus_members``: one row per input's speaker placed in a corpus speaker (the input, its own label, the
  corpus id, its seconds, its diarization's fingerprint, the name an enrolled profile gave it, its voice).
  The truth of who is who: a corpus speaker is the members that name it.
- ``corpus_speakers``: one row per corpus speaker: its name, the label the files show, its centroid, and the
  seconds and member count its centroid was computed over.
- ``corpus_meta``: one row: the encoder, the distance, the next id to give, the ids merged away.

:meth:`SpeakerStore.save` writes only what changed between two states of the corpus (the inputs a chunk
placed, the speakers they joined): appends where rows are new, one ``merge_insert`` per table where rows
change. So a chunk costs what it places, not what the corpus holds (``speakers.json`` was rewritten whole
after every chunk: 150 MB a chunk at 100,000 inputs). A save writes the meta first (ids are never given
twice), then the members, then the speakers; a kill between two leaves speakers whose stored seconds or
member count differ from their members', or members of a speaker with no row: :meth:`SpeakerStore.load`
recomputes those centroids from the members' voices and drops speakers without members, so what a kill
leaves is read as a consistent corpus (mended at each load until that speaker is saved again).

``OUT/speakers.json`` is an export of this store (written at a run's end and by ``pipeline speakers``); an
output folder that has it but no store (made by an earlier version) is read from it until the first save
brings it in. ``pipeline index --rebuild`` remakes the segments and inputs tables, never these: names,
merges and splits are a person's work, not derived from the artifacts.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np

from contracts.corpus import CorpusMember, CorpusSpeaker, CorpusSpeakers
from orchestrator import layout

log = logging.getLogger(__name__)

MEMBERS = "corpus_members"
SPEAKERS = "corpus_speakers"
META = "corpus_meta"
TABLES = (MEMBERS, SPEAKERS, META)
#: saves between two upkeeps of the store's tables (their small fragments compacted)
TIDY_EVERY = 20
#: fragments below this many rows are joined by an upkeep; bigger ones are left as they are
FRAGMENT_ROWS = 100_000
#: table versions older than this are deleted by an upkeep
KEEP_VERSIONS = timedelta(minutes=10)

MEMBER_COLUMNS = ("input", "speaker", "corpus_speaker", "seconds", "fingerprint", "enrolled")


def _quote(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _in(column: str, values) -> str:
    return f"{column} IN ({', '.join(_quote(v) for v in sorted(values))})"


def _schemas(dimension: int):
    import pyarrow as pa

    vector = pa.list_(pa.float32(), dimension)
    members = pa.schema(
        [
            ("input", pa.string()),
            ("speaker", pa.string()),
            ("corpus_speaker", pa.string()),
            ("seconds", pa.float64()),
            ("fingerprint", pa.string()),
            ("enrolled", pa.string()),
            ("vector", vector),
        ]
    )
    speakers = pa.schema(
        [
            ("id", pa.string()),
            ("name", pa.string()),
            ("label", pa.string()),
            ("seconds", pa.float64()),
            ("members", pa.int32()),
            ("centroid", pa.list_(pa.float64(), dimension)),  # as placed: read back bit for bit
        ]
    )
    meta = pa.schema(
        [
            ("key", pa.string()),
            ("encoder", pa.string()),
            ("distance", pa.float64()),
            ("next_id", pa.int64()),
            ("merged", pa.string()),
            ("updated_at", pa.string()),
        ]
    )
    return members, speakers, meta


def _unit(vector) -> np.ndarray:
    vector = np.asarray(vector, np.float64)
    return vector / max(float(np.linalg.norm(vector)), 1e-12)


def _weighted(pairs) -> list[float]:
    total = sum(np.asarray(v, np.float64) * max(s, 1e-3) for v, s in pairs)
    return [float(x) for x in _unit(total)]


def _same_totals(row: dict, members: list[CorpusMember]) -> bool:
    return int(row["members"]) == len(members) and abs(
        float(row["seconds"]) - sum(m.seconds for m in members)
    ) <= 1e-6 * max(1.0, float(row["seconds"]))


@dataclass
class Change:
    """What a save writes: the inputs whose members changed (input -> every member it has now, with its corpus
    speaker; an empty list: none now), the corpus speakers changed or new, the ones gone."""

    members: dict[str, list[tuple[str, CorpusMember]]] = field(default_factory=dict)
    #: none of these inputs had members before (their rows are appended)
    fresh: bool = False
    speakers: list[CorpusSpeaker] = field(default_factory=list)
    #: every speaker of ``speakers`` is new (their rows are appended)
    new_only: bool = False
    gone: set[str] = field(default_factory=set)


def diff(before: CorpusSpeakers | None, after: CorpusSpeakers) -> Change:
    """The :class:`Change` from ``before`` to ``after``, found by comparing the two whole (what ``pipeline
    speakers`` commands save; a run's chunks hand their own, found as they place)."""
    old = {(m.item_id, m.speaker): (s.id, m) for s in (before.speakers if before else []) for m in s.members}
    new = {(m.item_id, m.speaker): (s.id, m) for s in after.speakers for m in s.members}
    inputs = {key[0] for key in set(old) | set(new) if old.get(key) != new.get(key)}
    members: dict[str, list[tuple[str, CorpusMember]]] = {item: [] for item in inputs}
    for (item, _), (sid, m) in new.items():
        if item in inputs:
            members[item].append((sid, m))
    was = {s.id: s for s in (before.speakers if before else [])}
    speakers = [s for s in after.speakers if was.get(s.id) != s]
    return Change(
        members=members,
        fresh=not any(key[0] in inputs for key in old),
        speakers=speakers,
        new_only=not any(s.id in was for s in speakers),
        gone=set(was) - {s.id for s in after.speakers},
    )


def _centroid_of(corpus: CorpusSpeakers, sid: str) -> list[float]:
    return next(s.centroid for s in corpus.speakers if s.id == sid)


class SpeakerStore:
    """An output folder's corpus speakers in its catalogue. The caller holds the output folder's lock to save;
    reading needs none (each table's commit is a snapshot)."""

    _saves = 0

    def __init__(self, out: Path) -> None:
        self.out = Path(out)
        self.path = self.out / layout.CATALOGUE
        self._db = None
        self._known: set[str] | None = None

    @property
    def db(self):
        if self._db is None:
            import lancedb

            self._db = lancedb.connect(str(self.path))
        return self._db

    def _names(self) -> set[str]:
        """The catalogue's tables (listed once: the store's own tables are only made by this object, under the
        output folder's lock; a table another made is seen by a new store)."""
        if self._known is None:
            if not self.path.is_dir():
                return set()
            listed = (
                self.db.table_names() if hasattr(self.db, "table_names") else self.db.list_tables().tables
            )
            self._known = set(listed)
        return self._known

    def exists(self) -> bool:
        """Whether the store has been written (its meta row is the first thing a save writes)."""
        return META in self._names()

    # -- reading -----------------------------------------------------------------------------------

    def _rows(self, name: str, columns, where: str | None = None) -> list[dict]:
        if name not in self._names():
            return []
        search = self.db.open_table(name).search().select(list(columns))
        if where:
            search = search.where(where)
        return search.limit(None).to_list()

    def load(self) -> CorpusSpeakers | None:
        """The corpus as the last save left it (None: no store). What a kill between a save's writes left
        is mended here: see the module's docstring."""
        if not self.exists():
            return None
        meta = self._rows(META, ["encoder", "distance", "next_id", "merged", "updated_at"])
        if not meta:
            return None
        meta = meta[0]
        by_speaker: dict[str, list[CorpusMember]] = {}
        for row in self._rows(MEMBERS, MEMBER_COLUMNS):
            by_speaker.setdefault(row["corpus_speaker"], []).append(
                CorpusMember(
                    item_id=row["input"],
                    speaker=row["speaker"],
                    seconds=row["seconds"],
                    fingerprint=row["fingerprint"],
                    enrolled=row["enrolled"],
                )
            )
        rows = {
            row["id"]: row for row in self._rows(SPEAKERS, ["id", "name", "seconds", "members", "centroid"])
        }
        stale = sorted(
            sid
            for sid, members in by_speaker.items()
            if sid not in rows or not _same_totals(rows[sid], members)
        )
        vectors = (
            self.vectors([(m.item_id, m.speaker) for sid in stale for m in by_speaker[sid]]) if stale else {}
        )
        speakers = []
        for sid, members in sorted(by_speaker.items(), key=lambda kv: int(kv[0][1:])):  # by number
            row = rows.get(sid)
            if sid in stale:
                known = [
                    (vectors[(m.item_id, m.speaker)], m.seconds)
                    for m in members
                    if (m.item_id, m.speaker) in vectors
                ]
                if not known and row is None:  # cannot happen: every member row holds its voice
                    continue
                centroid = _weighted(known) if known else [float(x) for x in row["centroid"]]
                log.info(
                    "corpus speakers: %s mended (its centroid computed again from %d voices)", sid, len(known)
                )
            else:
                centroid = [float(x) for x in row["centroid"]]
            members.sort(key=lambda m: (m.item_id, m.speaker))
            speakers.append(
                CorpusSpeaker(id=sid, name=row["name"] if row else None, centroid=centroid, members=members)
            )
        given = max([int(s.id[1:]) + 1 for s in speakers], default=1)
        merged = json.loads(meta["merged"] or "{}")
        given = max([given, *(int(k[1:]) + 1 for k in merged)])
        return CorpusSpeakers(
            encoder=meta["encoder"],
            distance=meta["distance"],
            next_id=max(int(meta["next_id"]), given),
            merged=merged,
            speakers=speakers,
            updated_at=datetime.fromisoformat(meta["updated_at"]),
        )

    def vectors(self, keys) -> dict[tuple[str, str], np.ndarray]:
        """(input, its speaker) -> the voice stored with that member (keys not stored are left out)."""
        keys = set(keys)
        if not keys:
            return {}
        found = {}
        items = sorted({item for item, _ in keys})
        for first in range(0, len(items), 500):
            where = _in("input", items[first : first + 500])
            for row in self._rows(MEMBERS, ["input", "speaker", "vector"], where):
                key = (row["input"], row["speaker"])
                if key in keys:
                    found[key] = np.asarray(row["vector"], np.float64)
        return found

    def labels(self, item_ids) -> dict[str, dict[str, tuple[str, str]]]:
        """input id -> its own speaker label -> (corpus speaker id, what the files show), for ``item_ids`` only:
        two reads of what those inputs hold, whatever the corpus holds."""
        item_ids = set(item_ids)
        if not item_ids or not self.exists():
            return {}
        members = []
        items = sorted(item_ids)
        for first in range(0, len(items), 500):
            members += self._rows(
                MEMBERS, ["input", "speaker", "corpus_speaker"], _in("input", items[first : first + 500])
            )
        ids = {m["corpus_speaker"] for m in members}
        shown = (
            {row["id"]: row["label"] for row in self._rows(SPEAKERS, ["id", "label"], _in("id", ids))}
            if ids
            else {}
        )
        labels: dict[str, dict[str, tuple[str, str]]] = {}
        for m in members:
            sid = m["corpus_speaker"]
            labels.setdefault(m["input"], {})[m["speaker"]] = (sid, shown.get(sid) or sid)
        return labels

    # -- writing -----------------------------------------------------------------------------------

    def save(
        self, before: CorpusSpeakers | None, after: CorpusSpeakers, voices=None, change: Change | None = None
    ) -> dict[str, int]:
        """Write what differs from ``before`` (the corpus as last saved or loaded; None: the store is empty) to
        ``after``: ``change`` when the caller knows it (a chunk's placement), else :func:`diff` of the two.
        ``voices``: (input, speaker) -> vector for the members new to the store; a member whose voice is
        neither given nor stored gets its speaker's centroid. Returns the rows written per table."""
        import pyarrow as pa

        if not after.speakers and before is None and not self.exists():
            return {}
        if not self.exists():
            before, change = None, None  # an earlier version's speakers.json brought in whole
        change = change or diff(before, after)
        voices = dict(voices or {})
        dimension = len(after.speakers[0].centroid) if after.speakers else self._dimension() or 1
        members_schema, speakers_schema, meta_schema = _schemas(dimension)
        self.path.mkdir(parents=True, exist_ok=True)
        written = {}

        # 1. meta: ids given are never given again, whatever follows
        meta = pa.Table.from_pylist(
            [
                {
                    "key": "corpus",
                    "encoder": after.encoder,
                    "distance": after.distance,
                    "next_id": after.next_id,
                    "merged": json.dumps(after.merged, sort_keys=True),
                    "updated_at": after.updated_at.isoformat(),
                }
            ],
            schema=meta_schema,
        )
        table = self._table(META, meta_schema)
        table.merge_insert("key").when_matched_update_all().when_not_matched_insert_all().execute(meta)
        written[META] = 1

        # 2. members: every member now of the inputs whose members changed
        if change.members:
            rows = sorted(
                ((sid, m) for found in change.members.values() for sid, m in found),
                key=lambda r: (r[1].item_id, r[1].speaker),
            )
            centroids = {s.id: s.centroid for s in change.speakers}
            missing = {(m.item_id, m.speaker) for _, m in rows} - set(voices)
            stored = self.vectors(missing) if before is not None else {}

            def voice_of(sid: str, m: CorpusMember):
                key = (m.item_id, m.speaker)
                if key in voices:
                    return voices[key]
                if key in stored:
                    return stored[key]
                return centroids[sid] if sid in centroids else _centroid_of(after, sid)

            data = pa.Table.from_pylist(
                [
                    {
                        "input": m.item_id,
                        "speaker": m.speaker,
                        "corpus_speaker": sid,
                        "seconds": m.seconds,
                        "fingerprint": m.fingerprint,
                        "enrolled": m.enrolled,
                        "vector": [float(x) for x in _unit(voice_of(sid, m))],
                    }
                    for sid, m in rows
                ],
                schema=members_schema,
            )
            table = self._table(MEMBERS, members_schema)
            if change.fresh and before is not None:
                if data.num_rows:
                    table.add(data)  # inputs placed for the first time: appended
            else:
                (
                    table.merge_insert(["input", "speaker"])
                    .when_matched_update_all()
                    .when_not_matched_insert_all()
                    .when_not_matched_by_source_delete(_in("input", change.members))
                    .execute(data)
                )
            written[MEMBERS] = data.num_rows

        # 3. speakers: the ones that changed, and the ones gone
        if change.speakers or change.gone:
            data = pa.Table.from_pylist(
                [
                    {
                        "id": s.id,
                        "name": s.name,
                        "label": s.label,
                        "seconds": s.seconds,
                        "members": len(s.members),
                        "centroid": s.centroid,
                    }
                    for s in change.speakers
                ],
                schema=speakers_schema,
            )
            table = self._table(SPEAKERS, speakers_schema)
            if change.new_only and not change.gone and before is not None:
                table.add(data)
            else:
                merge = table.merge_insert("id").when_matched_update_all().when_not_matched_insert_all()
                if change.gone:
                    merge = merge.when_not_matched_by_source_delete(_in("id", change.gone))
                merge.execute(data)
            written[SPEAKERS] = len(change.speakers)
        SpeakerStore._saves += 1
        if SpeakerStore._saves % TIDY_EVERY == 0:
            self.tidy()
        return written

    def tidy(self) -> None:
        """Join the small fragments the saves appended (fragments of :data:`FRAGMENT_ROWS` rows are left as they
        are, so the cost follows what is new) and delete versions older than :data:`KEEP_VERSIONS`."""
        for name in TABLES:
            if name not in self._names():
                continue
            try:
                dataset = self.db.open_table(name).to_lance()
                dataset.optimize.compact_files(target_rows_per_fragment=FRAGMENT_ROWS)
                dataset.cleanup_old_versions(older_than=KEEP_VERSIONS)
            except Exception as exc:  # noqa: BLE001 - a later save tidies again; the rows are intact
                log.warning("corpus speakers: %s not tidied: %s", name, exc)

    def _dimension(self) -> int | None:
        if SPEAKERS not in self._names():
            return None
        return self.db.open_table(SPEAKERS).schema.field("centroid").type.list_size

    def _table(self, name: str, schema):
        if name in self._names():
            return self.db.open_table(name)
        table = self.db.create_table(name, schema=schema, exist_ok=True)
        self._known = {*self._names(), name}
        return table
