"""The English translation's files beside the original's: same speakers and caption rules, a language switch
on the transcript page, and `pipeline export` writing both tracks again."""

from __future__ import annotations

from pathlib import Path

from contracts import DiarizationArtifact, TranscriptArtifact, load_artifact, save_model
from contracts.artifacts import LanguageId
from orchestrator import Settings
from orchestrator.corpus.export import export
from orchestrator.planning.inputs import save_ids
from tests.conftest import MEDIA

ORIGINAL = [
    ("Host", "Heute Morgen war es sehr kalt, deshalb sind wir zu Hause geblieben und haben gelesen."),
    ("Guest", "Wir haben die Zeitung zusammen gelesen und dann einen langen Spaziergang gemacht."),
]
ENGLISH = [
    "This morning it was very cold, so we stayed at home and read.",
    "We read the newspaper together and then took a long walk.",
]


def _folder(tmp_path: Path) -> Path:
    out = tmp_path / "out"
    segments, translation, turns, at = [], [], [], 0.0
    for n, ((speaker, text), english) in enumerate(zip(ORIGINAL, ENGLISH)):
        span = {"start": at, "end": at + 5.0}
        segments.append({"id": n, "text": text, "speaker": speaker, **span})
        translation.append({"id": n, "text": english, "speaker": speaker, **span})
        turns.append({"speaker": f"SPEAKER_0{n}", **span})
        at += 6.0
    transcript = TranscriptArtifact(
        item_id="talk",
        fingerprint="f",
        source=str(MEDIA / "languages" / "de.ogg"),
        language="de",
        model="whisper-base",
        requested_model="whisper-base",
        device="cpu",
        compute_type="int8",
        batch_size=1,
        duration_s=at,
        segments=segments,
        translation=translation,
        language_id=LanguageId(status="detected", language="de", probability=0.93),
    )
    save_model(transcript, out / "talk" / "transcript.json")
    diarization = DiarizationArtifact(
        item_id="talk",
        fingerprint="f",
        source=transcript.source,
        turns=turns,
        model="embedded",
        requested_model="auto",
        device="cpu",
        duration_s=at,
    )
    save_model(diarization, out / "talk" / "diarization.json")
    save_ids(out, {transcript.source: "talk"})
    return out


def _text(path: Path) -> str:
    return " ".join(
        line for line in path.read_text().splitlines() if line and "-->" not in line and not line.isdigit()
    )


def test_export_writes_both_tracks_with_the_same_speakers_rules_and_a_language_switch(tmp_path):
    out = _folder(tmp_path)
    # When the output folder is exported (narrow captions: the rules must hold on both tracks)
    settings = Settings(_env_file=None, output_dir=out, caption_line_chars=24)
    result = export(settings, ["srt", "vtt", "txt", "html"])
    assert result.written == 1 and not result.failed
    talk = out / "talk"
    # Then the English files stand beside the original's, the original's unchanged
    for name in ("json", "srt", "vtt", "txt", "html"):
        assert (talk / f"transcript.en.{name}").is_file(), name
    assert "Zeitung" in _text(talk / "transcript.srt") and "Zeitung" not in _text(talk / "transcript.en.srt")
    assert "newspaper" in _text(talk / "transcript.en.srt") and "newspaper" in _text(
        talk / "transcript.en.vtt"
    )
    english = load_artifact(talk / "transcript.en.json", TranscriptArtifact)
    assert english.language == "en" and english.translation is None
    assert [s.text for s in english.segments] == ENGLISH
    # the same speakers on both tracks
    original = load_artifact(talk / "transcript.json", TranscriptArtifact)
    assert (
        [s.speaker for s in english.segments] == [s.speaker for s in original.segments] == ["Host", "Guest"]
    )
    assert (
        "Host" in (talk / "transcript.en.txt").read_text()
        and "Guest" in (talk / "transcript.en.txt").read_text()
    )
    # the same caption rules on both
    for name in ("transcript.srt", "transcript.en.srt"):
        lines = [
            x for x in (talk / name).read_text().splitlines() if x and "-->" not in x and not x.isdigit()
        ]
        assert max(map(len, lines)) <= 24, (name, lines)
    # a language switch on each page, linking the other
    page, english_page = (talk / "transcript.html").read_text(), (talk / "transcript.en.html").read_text()
    assert '<nav class="languages">' in page and 'href="transcript.en.html"' in page
    assert 'href="transcript.html"' in english_page and 'lang="en"' in english_page
    # each page names its own track's language
    assert "<li>Language: de (detected, p=0.93)</li>" in page
    assert "<li>Language: en (translated from de)</li>" in english_page
    # back to the default rules, which the session's caption check holds every file to
    export(Settings(_env_file=None, output_dir=out), ["srt", "vtt"])


def test_an_untranslated_transcript_writes_no_english_track(tmp_path):
    out = _folder(tmp_path)
    path = out / "talk" / "transcript.json"
    save_model(load_artifact(path, TranscriptArtifact).model_copy(update={"translation": None}), path)
    export(Settings(_env_file=None, output_dir=out), ["srt", "html"])
    assert not list((out / "talk").glob("transcript.en.*"))
    assert '<nav class="languages">' not in (out / "talk" / "transcript.html").read_text()


def test_a_transcript_rewritten_without_its_translation_leaves_no_english_track_behind(tmp_path):
    """Given an input whose English track was written (a run with --translate), when its transcript is
    rewritten without a translation (a rerun without --translate redid it), then the English files of the
    first run are gone and its page has no language switch."""
    out = _folder(tmp_path)
    export(Settings(_env_file=None, output_dir=out), ["srt", "vtt", "txt", "html"])
    talk = out / "talk"
    assert len(list(talk.glob("transcript.en.*"))) == 5
    path = talk / "transcript.json"
    save_model(load_artifact(path, TranscriptArtifact).model_copy(update={"translation": None}), path)
    export(Settings(_env_file=None, output_dir=out), ["srt", "vtt", "txt", "html"])
    assert not list(talk.glob("transcript.en.*"))
    page = (talk / "transcript.html").read_text()
    assert "transcript.en." not in page and '<nav class="languages">' not in page
