"""Corpus speakers: placing voices with stable ids, naming, merging, splitting (stored vectors, no model);
and on real diarizations of the committed voices re-paired into files, every voice one corpus speaker."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

import orchestrator.corpus.speakers as speakers_module
from contracts import (
    DiarizationArtifact,
    Segment,
    SpeakerTurn,
    TranscriptArtifact,
    VoiceProfile,
    load_model,
    save_model,
)
from contracts.corpus import CorpusSpeakers
from contracts.errors import ArtifactError, SettingsError
from orchestrator.corpus.labels import read_corpus
from orchestrator.corpus.speakers import Voice, assign, merge, name, place, split, summaries
from orchestrator.settings import Settings

RNG = np.random.default_rng(7)
#: five voices, far apart (random 192-d directions)
PEOPLE = [v / np.linalg.norm(v) for v in RNG.standard_normal((5, 192))]


def voice(person: int, noise: float = 0.03) -> np.ndarray:
    v = PEOPLE[person] + noise * RNG.standard_normal(192)
    return v / np.linalg.norm(v)


def voices(item: str, *people: int, fingerprint: str = "fp") -> list[Voice]:
    return [
        Voice(item, f"SPEAKER_{n:02d}", voice(p), 10.0 + n, f"{fingerprint}-{item}", "campplus:x")
        for n, p in enumerate(people)
    ]


def ids_of(corpus: CorpusSpeakers) -> dict[tuple[str, str], str]:
    return {(m.item_id, m.speaker): s.id for s in corpus.speakers for m in s.members}


def test_new_inputs_join_their_voices_and_ids_survive_reruns():
    """Given two inputs sharing one voice, when a third input with the other two voices comes, then it
    joins their corpus speakers, the first two keep their ids and only the third's files change."""
    first = assign(None, [*voices("a", 0, 1), *voices("b", 0, 2)], 0.4)
    ids = ids_of(first.corpus)
    assert len(first.corpus.speakers) == 3 and ids[("a", "SPEAKER_00")] == ids[("b", "SPEAKER_00")]
    assert first.changed == {"a", "b"}

    again = assign(first.corpus, [*voices("a", 0, 1), *voices("b", 0, 2), *voices("c", 2, 1)], 0.4)
    after = ids_of(again.corpus)
    assert {k: after[k] for k in ids} == ids and again.changed == {"c"} and not again.new_speakers
    assert after[("c", "SPEAKER_00")] == ids[("b", "SPEAKER_01")]
    assert after[("c", "SPEAKER_01")] == ids[("a", "SPEAKER_01")]

    stranger = assign(again.corpus, voices("d", 3), 0.4)
    assert stranger.new_speakers == ["S0004"] and ids_of(stranger.corpus)[("d", "SPEAKER_00")] == "S0004"


def test_two_speakers_of_one_input_are_never_one_corpus_speaker():
    """The diarizer told them apart: even with near-identical voices they stay two corpus speakers."""
    placed = assign(
        None,
        [
            Voice("a", "SPEAKER_00", PEOPLE[0], 5, "f", "campplus:x"),
            Voice("a", "SPEAKER_01", voice(0, 0.01), 5, "f", "campplus:x"),
            *voices("b", 0),
        ],
        0.4,
    )
    ids = ids_of(placed.corpus)
    assert ids[("a", "SPEAKER_00")] != ids[("a", "SPEAKER_01")] and len(placed.corpus.speakers) == 2


def test_an_input_diarized_again_is_placed_again_and_other_encoders_are_left_out():
    first = assign(None, [*voices("a", 0, 1), *voices("b", 0)], 0.4)
    redone = assign(
        first.corpus, voices("a", 0, 3, fingerprint="new"), 0.4, vectors={("b", "SPEAKER_00"): PEOPLE[0]}
    )
    members = {(m.item_id, m.speaker): m.fingerprint for s in redone.corpus.speakers for m in s.members}
    assert members[("a", "SPEAKER_01")] == "new-a" and redone.changed == {"a"}
    assert ids_of(redone.corpus)[("a", "SPEAKER_00")] == ids_of(redone.corpus)[("b", "SPEAKER_00")]
    named = [
        Voice(
            v.item_id,
            v.speaker,
            v.vector,
            v.seconds,
            v.fingerprint,
            v.encoder,
            "Host" if v.speaker == "SPEAKER_00" else None,
        )
        for v in voices("b", 0)
    ]  # a profile names b's speaker on a later run
    relabelled = assign(redone.corpus, named, 0.4)
    assert relabelled.changed == {"a", "b"} and not relabelled.new_speakers
    assert (
        next(
            s.label for s in relabelled.corpus.speakers if s.id == ids_of(redone.corpus)[("b", "SPEAKER_00")]
        )
        == "Host"
    )
    other = assign(redone.corpus, [Voice("c", "SPEAKER_00", PEOPLE[0], 3, "f", "pyannote:x")], 0.4)
    assert other.skipped == 1 and "c" not in {m.item_id for s in other.corpus.speakers for m in s.members}


def test_the_index_carried_from_chunk_to_chunk_places_as_one_made_afresh():
    """A run carries each chunk's corpus (and its index) to the next; a new process reads the corpus again and
    indexes it afresh. Chunk after chunk, with inputs diarized again and names from profiles, both place
    every voice alike."""
    rng = np.random.default_rng(3)  # its own: the module's RNG is left as the other tests expect it

    def voices(item: str, *people: int, fingerprint: str = "fp") -> list[Voice]:
        found = []
        for n, p in enumerate(people):
            v = PEOPLE[p] + 0.03 * rng.standard_normal(192)
            found.append(
                Voice(
                    item, f"SPEAKER_{n:02d}", v / np.linalg.norm(v), 10.0 + n, f"{fingerprint}-{item}", "c:x"
                )
            )
        return found

    carried = afresh = None
    every = {}
    for n in range(10):
        chunk = []
        for i in range(4):
            item = f"i{n}-{i}"
            chunk += voices(item, *rng.choice(5, 2, replace=False))
        if n >= 2:  # an earlier input diarized again, with one voice
            again = f"i{n - 2}-0"
            chunk += voices(again, int(rng.integers(5)), fingerprint=f"again{n}")
        if n >= 3:  # a profile names an earlier input's speaker
            named = every[f"i{n - 3}-1"]
            chunk += [
                Voice(v.item_id, v.speaker, v.vector, v.seconds, v.fingerprint, v.encoder, "Host")
                for v in named
            ]
        for v in chunk:
            every.setdefault(v.item_id, [])
        for item in {v.item_id for v in chunk}:
            every[item] = [v for v in chunk if v.item_id == item]
        known = {(v.item_id, v.speaker): v.vector for found in every.values() for v in found}
        if carried is not None:  # the index the last chunk left is the one used
            assert speakers_module._INDEXES[id(carried)].corpus is carried
        carried = assign(carried, chunk, 0.4, vectors=known).corpus
        reread = CorpusSpeakers.model_validate_json(afresh.model_dump_json()) if afresh else None
        afresh = assign(reread, chunk, 0.4, vectors=known).corpus
        assert carried.model_dump(exclude={"updated_at"}) == afresh.model_dump(exclude={"updated_at"}), n
        CorpusSpeakers.model_validate(carried.model_dump())  # what assign builds unvalidated is valid


def test_corpus_file_is_validated():
    good = assign(None, voices("a", 0, 1), 0.4).corpus
    with pytest.raises(ValueError, match="one corpus speaker only"):
        CorpusSpeakers.model_validate(
            {
                **good.model_dump(),
                "speakers": [
                    good.speakers[0].model_dump(),
                    {**good.speakers[1].model_dump(), "members": good.speakers[0].model_dump()["members"]},
                ],
            }
        )
    with pytest.raises(ValueError, match="next_id"):
        CorpusSpeakers.model_validate({**good.model_dump(), "next_id": 2})


# -- an output folder made of stored artifacts ----------------------------------------------------


def make_input(out: Path, item: str, people: tuple[int, ...]) -> None:
    """An input folder as `process` leaves it: transcript, diarization with voices, an SRT."""
    turns = [
        SpeakerTurn(start=4.0 * n, end=4.0 * n + 3.5, speaker=f"SPEAKER_{n:02d}") for n in range(len(people))
    ]
    save_model(
        DiarizationArtifact(
            item_id=item,
            fingerprint=f"d-{item}",
            source=f"/media/{item}.wav",
            turns=turns,
            model="m",
            requested_model="embedded",
            device="cpu",
            duration_s=10.0,
            voices={t.speaker: [float(x) for x in voice(p)] for t, p in zip(turns, people)},
            voice_encoder="campplus:x",
        ),
        out / item / "diarization.json",
    )
    save_model(
        TranscriptArtifact(
            item_id=item,
            fingerprint=f"t-{item}",
            source=f"/media/{item}.wav",
            language="en",
            model="m",
            requested_model="m",
            device="cpu",
            compute_type="int8",
            batch_size=1,
            duration_s=10.0,
            segments=[
                Segment(id=n, start=t.start, end=t.end, text=f"words of {t.speaker}", speaker=t.speaker)
                for n, t in enumerate(turns)
            ],
        ),
        out / item / "transcript.json",
    )
    (out / item / "transcript.srt").write_text("")
    ids = json.loads((out / ".ids.json").read_text()) if (out / ".ids.json").exists() else {}
    (out / ".ids.json").write_text(json.dumps({**ids, f"/media/{item}.wav": item}))


@pytest.fixture
def folder(tmp_path):
    out = tmp_path / "out"
    for item, people in {"a": (0, 1), "b": (0, 2), "c": (2, 1)}.items():
        make_input(out, item, people)
    settings = Settings(output_dir=out, profiles_dir=tmp_path / "profiles")
    placed = place(settings, out)
    assert len(placed.corpus.speakers) == 3 and placed.changed == {"a", "b", "c"}
    return settings, out


def srt(out: Path, item: str) -> str:
    return (out / item / "transcript.srt").read_text()


def labels(out: Path, item: str) -> set[str]:
    return set(re.findall(r"^\[([^\]]+)\]", srt(out, item), flags=re.M))


def test_name_relabels_every_file_and_writes_a_voice_profile(folder):
    settings, out = folder
    sid = ids_of(read_corpus(out))[("a", "SPEAKER_00")]
    named = name(settings, out, sid, "Dr. Lee")
    assert named.rewritten == 2  # a and b: the inputs she speaks in
    assert "[Dr. Lee] words of SPEAKER_00" in srt(out, "a") and "[Dr. Lee]" in srt(out, "b")
    assert "Dr. Lee" not in srt(out, "c") and srt(out, "c") == ""  # not hers: not written again
    profile = load_model(named.profile, VoiceProfile)
    assert profile.name == "Dr. Lee" and profile.encoder == "campplus" and len(profile.clips) == 2
    assert float(np.asarray(profile.embedding) @ PEOPLE[0]) > 0.85 and profile.threshold == 0.6
    rows = {r.id: r for r in summaries(out)}
    assert rows[sid].label == "Dr. Lee" and rows[sid].inputs == 2 and rows[sid].seconds == 7.0
    assert rows[sid].clean_turn[0] in ("a", "b") and rows[sid].clean_turn[2:] == (0.0, 3.5)
    other = ids_of(read_corpus(out))[("a", "SPEAKER_01")]
    with pytest.raises(SettingsError, match="already named"):
        name(settings, out, other, "Dr. Lee")


def test_merge_and_split_mend_the_clustering_and_ids_are_never_reused(folder):
    settings, out = folder
    ids = ids_of(read_corpus(out))
    keep, other = ids[("a", "SPEAKER_00")], ids[("a", "SPEAKER_01")]
    merged = merge(settings, out, keep, other)
    assert {(m.item_id, m.speaker) for m in merged.members} >= {("a", "SPEAKER_00"), ("a", "SPEAKER_01")}
    assert labels(out, "a") == {keep} and keep in labels(out, "c")
    corpus = read_corpus(out)
    assert corpus.merged == {other: keep} and len(corpus.speakers) == 2

    [new] = split(settings, out, other, ["c"])  # the merged-away id still names the speaker it went into
    assert new.id == "S0004" and {m.item_id for m in new.members} == {"c"}
    assert labels(out, "c") == {"S0004", ids[("c", "SPEAKER_00")]}
    with pytest.raises(SettingsError, match="does not speak in"):
        split(settings, out, keep, ["zzz"])
    with pytest.raises(SettingsError, match="no corpus speaker"):
        merge(settings, out, keep, "S0099")

    [regrouped] = split(settings, out, keep)  # no inputs named: its voices grouped again, a's second leaves
    assert regrouped.id == "S0005" and [(m.item_id, m.speaker) for m in regrouped.members] == [
        ("a", "SPEAKER_01")
    ]
    with pytest.raises(SettingsError, match="one voice even at distance"):
        split(settings, out, keep)

    make_input(out, "d", (3,))  # a later run: a new voice gets a new id, never a retired one
    placed = place(settings, out, ["d"])
    assert placed.new_speakers == ["S0006"] and placed.changed == {"d"}


def test_a_damaged_corpus_file_is_never_overwritten(folder):
    """A folder of an earlier version (its corpus in speakers.json, no store) whose file is damaged: the
    error says what to do, and the file is left as it was."""
    settings, out = folder
    shutil.rmtree(out / ".catalogue")
    (out / "speakers.json").write_text('{"kind": "corpus_speakers", "speakers": [')
    with pytest.raises(ArtifactError, match="speakers cluster"):
        place(settings, out)
    assert (out / "speakers.json").read_text().endswith("[")


def test_the_corpus_step_imports_no_model_library():
    import subprocess

    code = (
        "import sys, orchestrator.corpus.speakers, orchestrator.corpus.labels, orchestrator.cli; "
        "print(sorted(m for m in ('torch', 'speechbrain', 'whisperx', 'pyannote.audio') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


# -- real voices ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def diarized_corpus(tmp_path_factory):
    """The committed voices re-paired into seven files (``tests.fixtures.generate.CORPUS_FILES``, one turn
    a side), decoded and diarized by the real stages (embedded diarizer, one model load), stored as an
    output folder holds them."""
    from contracts import StageRequest, WorkItem, load_artifact
    from stages.audio import AudioStage
    from stages.diarization import DiarizationStage
    from tests.conftest import stage_settings
    from tests.fixtures.generate import speaker_corpus

    tmp = tmp_path_factory.mktemp("corpus")
    files = speaker_corpus(tmp / "media", turns_each=1)
    out = tmp / "out"

    def request(stage, items, **settings):
        return StageRequest(
            request_id=stage,
            stage=stage,
            module=f"stages.{stage}",
            items=items,
            batch_size=4,
            device="cpu",
            settings=stage_settings(stage, **settings),
            result_path=str(tmp / f"{stage}.json"),
        )

    assert all(
        r.ok
        for r in AudioStage()
        .run(
            request(
                "audio",
                [
                    WorkItem(
                        id=n,
                        inputs={"source": str(p)},
                        output=str(tmp / "a" / n / "audio.json"),
                        fingerprint="a",
                    )
                    for n, (p, _) in files.items()
                ],
            )
        )
        .items
    )
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
    (out / ".ids.json").write_text(json.dumps({str(p): n for n, (p, _) in files.items()}))
    return (
        out,
        {n: load_artifact(out / n / "diarization.json", DiarizationArtifact) for n in files},
        {n: t for n, (_, t) in files.items()},
    )


@pytest.mark.slow
def test_every_voice_is_one_corpus_speaker_across_files_and_ids_stay(diarized_corpus):
    """Given four voices, each in three or four files in different pairs, when the files are placed in two
    runs (four, then the other three), then each voice is one corpus speaker, no two are merged, purity and
    coverage >= 0.95, and the first run's ids stay."""
    from tests.fixtures.generate import corpus_scores

    out, arts, truths = diarized_corpus
    assert all(a.voices and set(a.voices) == set(a.speakers) for a in arts.values())
    assert all(a.voice_encoder.startswith("campplus:") for a in arts.values())
    settings = Settings(output_dir=out)
    names = list(arts)
    first = place(settings, out, names[:4])
    placed = place(settings, out)
    before, after = ids_of(first.corpus), ids_of(placed.corpus)
    assert {k: after[k] for k in before} == before and placed.changed == set(names[4:])
    scores = corpus_scores(placed.corpus, arts, truths)
    assert scores["speakers"] == 4 and not scores["split"] and not scores["merged"], scores
    assert scores["purity"] >= 0.95 and scores["coverage"] >= 0.95, scores


def test_cluster_places_a_folder_made_before_corpus_speakers(folder, monkeypatch):
    """An output folder without speakers.json (older, or corpus speakers off): `speakers cluster` places
    every input, a batch at a time, and writes their files with the corpus labels."""
    import orchestrator.corpus.speakers as speakers

    settings, out = folder
    shutil.rmtree(out / ".catalogue")
    (out / "speakers.json").unlink(missing_ok=True)
    monkeypatch.setattr(speakers, "PLACE_BATCH", 2)  # a then b in one batch, c in the next
    placed = speakers.cluster(settings, out)
    assert (
        len(placed.corpus.speakers) == 3
        and placed.changed == {"a", "b", "c"}
        and len(placed.new_speakers) == 3
    )
    assert labels(out, "a") == {
        s.id for s in placed.corpus.speakers if any(m.item_id == "a" for m in s.members)
    }
    assert read_corpus(out) == placed.corpus
