"""Several languages in one input: each speech region's language, on both runtimes, with the real whisper-base.

The recordings are built here from the committed language clips: English then German (``en_de``), and English,
Spanish, English (``en_es_en``), 1.5 s of silence apart; and the English clip twice (``en_en``: one language,
whose regions must not be identified one by one). Each runtime loads whisper-base once for the module.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
import soundfile as sf

from contracts import TranscriptArtifact
from contracts.artifacts import LanguageId
from stages.whisper.language import decide, is_mixed, label_regions, language_windows
from tests.conftest import MEDIA, wer
from tests.stages.test_asr import decode_audio, run_asr_stage

pytestmark = pytest.mark.slow

LANGUAGES = MEDIA / "languages"
GAP_S = 1.5
#: the recordings: name -> the clips in order
RECORDINGS = {"en_de": ("en", "de"), "en_es_en": ("en", "es", "en"), "en_en": ("en", "en")}
#: each part must resemble its reference, not the invented English of a decode in the wrong language (~0.95):
#: espeak's German is hard for whisper-base (0.7 on the clip alone, int8), Spanish and English are not
MAX_WER = {"en": 0.5, "es": 0.5, "de": 0.8}


def reference(lang: str) -> str:
    return (LANGUAGES / f"{lang}.txt").read_text().strip()


def build_recording(path, clips) -> None:
    """The clips one after another, ``GAP_S`` of silence apart, as a 16 kHz wav."""
    gap = np.zeros(int(GAP_S * 16000), dtype=np.float32)
    parts = []
    for lang in clips:
        samples, rate = sf.read(LANGUAGES / f"{lang}.ogg", dtype="float32")
        assert rate == 16000
        parts += [samples if samples.ndim == 1 else samples.mean(axis=1), gap]
    sf.write(path, np.concatenate(parts[:-1]), 16000)


@pytest.fixture(scope="module")
def recordings(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("recordings")
    sources = {}
    for name, clips in RECORDINGS.items():
        build_recording(tmp / f"{name}.wav", clips)
        sources[name] = tmp / f"{name}.wav"
    return decode_audio(tmp, sources)


def _run(tmp, audio, **settings) -> dict[str, TranscriptArtifact]:
    tmp.mkdir()
    result, transcripts, _ = run_asr_stage(tmp, audio, 4, {"model": "whisper-base", **settings})
    assert all(r.ok for r in result.items), result.items
    return transcripts


@pytest.fixture(scope="module")
def runs(tmp_path_factory, recordings):
    """The recordings' transcripts by runtime (each input alone: no joined windows; CTranslate2 in float32), and
    with the language forced (CTranslate2's CPU default, int8)."""
    tmp = tmp_path_factory.mktemp("runs")
    out = {
        # in torch's precision on the CPU, where the two runtimes must give the same words
        "ctranslate2": _run(
            tmp / "ct2", recordings, runtime="ctranslate2", compute_type="float32", join_inputs=False
        ),
        "forced": _run(tmp / "forced", {"en_de": recordings["en_de"]}, runtime="ctranslate2", language="en"),
    }
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(sys.modules, "ctranslate2", None)  # torch, as on an image without CTranslate2
        out["torch"] = _run(tmp / "torch", recordings, runtime="torch", join_inputs=False)
    return out


def _text(transcript: TranscriptArtifact, language: str) -> str:
    return " ".join(s.text for s in transcript.segments if s.language == language)


@pytest.mark.parametrize("runtime", ["ctranslate2", "torch"])
def test_each_part_is_decoded_in_its_own_language_and_the_transcript_lists_them(runs, runtime):
    en_de = runs[runtime]["en_de"]
    assert en_de.language_id.mixed and en_de.language_id.regions >= 2
    assert [s.language for s in en_de.segments] == ["en", "de"], [
        (s.language, s.text) for s in en_de.segments
    ]
    assert wer(reference("de"), _text(en_de, "de")) <= MAX_WER["de"], _text(en_de, "de")
    assert wer(reference("en"), _text(en_de, "en")) <= MAX_WER["en"], _text(en_de, "en")
    shares = {s.language: s.seconds for s in en_de.languages}
    assert set(shares) == {"en", "de"} and all(3.0 < s < 9.0 for s in shares.values()), shares
    assert en_de.language == en_de.languages[0].language
    assert "2 languages" in en_de.languages_note and "de" in en_de.languages_note
    assert all(w for s in en_de.segments for w in s.words or [None]), "the words are timed in their language"

    en_es_en = runs[runtime]["en_es_en"]
    assert [s.language for s in en_es_en.segments] == ["en", "es", "en"], [
        (s.language, s.text) for s in en_es_en.segments
    ]
    assert en_es_en.language == "en" and en_es_en.languages_note
    assert wer(reference("es"), _text(en_es_en, "es")) <= MAX_WER["es"], _text(en_es_en, "es")


def test_both_runtimes_give_the_same_languages_and_texts(runs):
    for name in RECORDINGS:
        ct2, torch = runs["ctranslate2"][name], runs["torch"][name]
        assert [s.language for s in ct2.segments] == [s.language for s in torch.segments], name
        assert [(s.start, s.end) for s in ct2.segments] == [(s.start, s.end) for s in torch.segments], name
        assert wer(" ".join(s.text for s in ct2.segments), " ".join(s.text for s in torch.segments)) < 0.1, (
            name
        )


def test_an_english_only_recording_is_one_language_and_costs_no_region_detection(runs):
    for runtime in ("ctranslate2", "torch"):
        en_en = runs[runtime]["en_en"]
        assert not en_en.language_id.mixed and en_en.language_id.regions == 0, en_en.language_id
        assert en_en.language == "en" and [s.language for s in en_en.segments] == ["en"] * len(en_en.segments)
        assert [share.language for share in en_en.languages] == ["en"]
        assert en_en.languages_note is None


def test_a_forced_language_decodes_everything_in_it(runs):
    forced = runs["forced"]["en_de"]
    assert forced.language_id.status == "forced" and forced.language_id.regions == 0
    assert {s.language for s in forced.segments} == {"en"} and forced.languages_note is None


def test_joined_windows_never_hold_two_languages(tmp_path, recordings):
    """The two mixed recordings joined with the English-only one: every joined window is of one language, so
    each input's parts keep their languages and words as when decoded alone."""
    seen = []

    def spy(stage):
        generate = stage._generate

        def recording(batch, temperature=0.0):
            for window in batch:
                seen.append({job.languages[i] for job, i in window.parts})
            return generate(batch, temperature)

        stage._generate = recording

    tmp_path.mkdir(exist_ok=True)
    result, joined, _ = run_asr_stage(
        tmp_path,
        recordings,
        4,
        {"model": "whisper-base", "runtime": "ctranslate2", "join_inputs": True},
        spy=spy,
    )
    assert all(r.ok for r in result.items), result.items
    assert any(len(parts) == 1 for parts in seen) and all(len(langs) == 1 for langs in seen), seen
    assert [s.language for s in joined["en_de"].segments] == ["en", "de"]
    assert wer(reference("de"), _text(joined["en_de"], "de")) <= MAX_WER["de"]


def test_region_labels_need_a_confident_stretch_and_windows_stop_at_a_change():
    regions = [(0.0, 3.0), (3.5, 4.0), (4.5, 7.0), (8.0, 11.0), (11.5, 12.0)]
    found = [("en", 0.95), None, ("de", 0.4), ("de", 0.9), ("nl", 0.6)]
    # the unsure region takes its neighbour's language, the lone 0.5 s of Dutch the longer stretch's
    assert label_regions(regions, found, "en") == ["en", "en", "en", "de", "de"]
    assert label_regions(regions, [None] * 5, "es") == ["es"] * 5
    labels = ["en", "en", "de", "de", "de"]
    assert language_windows(regions, labels, 30) == [(0.0, 4.0, "en"), (4.5, 12.0, "de")]
    assert language_windows(regions, ["en"] * 5, 6) == [(0.0, 4.0, "en"), (4.5, 7.0, "en"), (8.0, 12.0, "en")]


def test_an_input_is_mixed_when_a_window_or_a_region_is_confidently_of_another_language():
    en = decide([("en", 0.9), ("la", 0.02)], speech_s=13.0, windows=1)
    assert not is_mixed(en, [[("en", 0.9)]], [[("en", 0.97)], [("en", 0.42), ("cy", 0.3)]])
    assert is_mixed(en, [[("en", 0.9)]], [[("en", 0.97)], [("de", 0.41), ("en", 0.2)]])
    assert not is_mixed(en, [[("en", 0.9)]], [[("en", 0.97)], [("de", 0.25), ("en", 0.2)]])
    assert is_mixed(en, [[("en", 0.95)], [("es", 0.8)]])
    forced = LanguageId(status="forced", language="en")
    assert not is_mixed(forced, [[("de", 0.99)]])
