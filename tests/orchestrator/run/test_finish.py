"""The end of a run's chunks: OUT/speakers.json exported once, only when the corpus moved past it."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

from contracts import load_model
from contracts.corpus import CorpusMember, CorpusSpeaker, CorpusSpeakers
from orchestrator.run.finish import Corpus, export_speakers
from orchestrator.settings import Settings


def corpus_at(when: datetime) -> CorpusSpeakers:
    member = CorpusMember(item_id="a", speaker="SPEAKER_00", seconds=3.0, fingerprint="f")
    return CorpusSpeakers(
        distance=0.3,
        next_id=2,
        speakers=[CorpusSpeaker(id="S0001", centroid=[1.0, 0.0], members=[member])],
        updated_at=when,
    )


def test_speakers_json_is_exported_when_missing_changed_or_behind_the_store(tmp_path):
    settings = Settings(output_dir=tmp_path)
    path = tmp_path / "speakers.json"
    saved = corpus_at(datetime.now(UTC) - timedelta(hours=1))
    # a run that placed nothing and found no file writes it
    export_speakers(settings, Corpus(saved=saved))
    assert load_model(path, CorpusSpeakers) == saved
    # a file newer than the corpus's last save is left as it is, unless a chunk changed the corpus
    os.utime(path, (1e9 + 1, datetime.now(UTC).timestamp()))
    before = path.stat().st_mtime_ns
    export_speakers(settings, Corpus(saved=saved))
    assert path.stat().st_mtime_ns == before
    named = saved.model_copy(update={"speakers": [saved.speakers[0].model_copy(update={"name": "Lee"})]})
    export_speakers(settings, Corpus(saved=named, changed=True))
    assert load_model(path, CorpusSpeakers).speakers[0].name == "Lee"
    # a run killed before its end left the file behind the store: the next run's end writes it
    os.utime(path, (1e9, 1e9))
    export_speakers(settings, Corpus(saved=saved))
    assert load_model(path, CorpusSpeakers) == saved
    # a run without corpus speakers writes nothing
    path.unlink()
    export_speakers(settings, Corpus())
    assert not path.exists()
