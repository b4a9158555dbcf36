"""``translate``: inputs not in English decoded a second time with Whisper's translate task, in the same child,
over the same encoder output; English inputs once; an English-only model refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from contracts import AudioArtifact, TranscriptArtifact, load_artifact
from contracts.errors import ModelUnavailableError, SettingsError
from stages.asr import AsrStage
from tests.conftest import MEDIA
from tests.stages.test_asr import decode_audio, run_asr_stage, wav_16k

LANGUAGES = MEDIA / "languages"
#: the inputs of each joined window decoded (``_run`` records them)
JOINED: list[list[str]] = []
#: English function words (none of them a word of German, Spanish or French)
ENGLISH = {
    "the",
    "i",
    "you",
    "is",
    "and",
    "this",
    "it",
    "we",
    "not",
    "was",
    "at",
    "to",
    "of",
    "will",
    "would",
}
#: what the Spanish sentence says ("... so we stayed at home and read the newspaper together"): Whisper base
#: transcribes the espeak-ng Spanish best; its German and French (misheard) translate into other English
SPANISH = {"this", "morning", "cold", "stayed", "home", "together"}


def _run(tmp, audio: dict, spy=None, **settings) -> dict[str, TranscriptArtifact]:
    """The stage over ``audio`` (whisper-base unless told); records the inputs of each joined window decoded
    in ``JOINED``; ``spy`` sees the stage before it runs."""

    def joined(stage: AsrStage) -> None:
        generate = stage._generate

        def generating(batch, temperature=0.0):
            JOINED.extend([job.item.id for job, _ in w.parts] for w in batch if len(w.parts) > 1)
            return generate(batch, temperature)

        stage._generate = generating
        if spy is not None:
            spy(stage)

    result, transcripts, _ = run_asr_stage(tmp, audio, 4, {"model": "whisper-base", **settings}, spy=joined)
    assert all(r.ok for r in result.items), result.items
    return transcripts


def _words(text: str) -> set[str]:
    return {w.strip(".,!?;:").lower() for w in text.split()}


@pytest.mark.slow
def test_inputs_not_in_english_get_an_english_translation_and_keep_their_transcript(tmp_path):
    # (the Spanish clip twice: the two share one joined window to transcribe, and are translated each alone)
    sources = {lang: LANGUAGES / f"{lang}.ogg" for lang in ("de", "es", "fr", "en")}
    audio = decode_audio(tmp_path, {**sources, "es2": sources["es"]})
    (tmp_path / "plain").mkdir(), (tmp_path / "translated").mkdir()
    plain = _run(tmp_path / "plain", audio)
    JOINED.clear()
    translated = _run(tmp_path / "translated", audio, translate=True)
    assert ["es", "es2"] in JOINED, JOINED
    for lang in ("de", "es", "fr"):
        t = translated[lang]
        assert t.language == lang
        # the original track is the same as without translation
        assert [s.text for s in t.segments] == [s.text for s in plain[lang].segments]
        # English words out, over the same spans as the original's segments
        english = " ".join(s.text for s in t.translation or [])
        assert len(_words(english) & ENGLISH) >= 2, (lang, english)
        original = " ".join(s.text for s in t.segments)
        assert not _words(original) & ENGLISH, (lang, original)
        assert [(s.start, s.end) for s in t.translation] == [(s.start, s.end) for s in t.segments]
    for name in ("es", "es2"):  # each copy gets its own sentence's English, once
        spanish = " ".join(s.text for s in translated[name].translation)
        assert len(_words(spanish) & SPANISH) >= 4 and spanish.lower().count("morning") == 1, spanish
    # an English input is decoded once: no translation
    assert translated["en"].translation is None and plain["en"].translation is None
    assert [s.text for s in translated["en"].segments] == [s.text for s in plain["en"].segments]


@pytest.mark.slow
def test_inputs_translated_from_a_joined_window_are_not_encoded_again(tmp_path):
    """Given two short Spanish clips transcribed in one joined window, when they are translated too, then the
    encoder runs over each window the transcription decodes and over nothing else (besides one window of
    silence per child): each clip's English comes from the joined window's encoder output, and holds its own
    sentence once."""
    audio = decode_audio(tmp_path, {"es": LANGUAGES / "es.ogg", "es2": LANGUAGES / "es.ogg"})
    encoded, decoded = [], []

    def count(stage: AsrStage) -> None:
        encode, generate = stage._encode, stage._generate

        def encoding(pieces):
            encoded.extend(bool(np.any(p)) for p in pieces)  # False: silence
            return encode(pieces)

        def generating(batch, temperature=0.0):
            decoded.extend(batch)
            return generate(batch, temperature)

        stage._encode, stage._generate = encoding, generating

    JOINED.clear()
    translated = _run(tmp_path, audio, spy=count, translate=True)
    assert ["es", "es2"] in JOINED, JOINED
    assert encoded.count(True) == len(decoded), (encoded, [len(w.parts) for w in decoded])
    assert encoded.count(False) <= 1, encoded
    for name in ("es", "es2"):
        spanish = " ".join(s.text for s in translated[name].translation)
        assert len(_words(spanish) & SPANISH) >= 4 and spanish.lower().count("morning") == 1, spanish


@pytest.mark.slow
def test_each_input_of_a_joined_window_is_translated_from_its_own_stretch_of_it(tmp_path, monkeypatch):
    """Given the Spanish sentence cut at its pause into two clips (the cold morning; staying at home) that
    share one joined window whose split is taken as it is, when they are translated, then each clip's English
    holds its own half's words and none of the other's, and the encoder ran over the joined window (and one
    window of silence) only."""
    import stages.asr

    (tmp_path / "whole").mkdir()
    whole = decode_audio(tmp_path / "whole", {"es": LANGUAGES / "es.ogg"})
    samples = np.load(whole["es"].parent / load_artifact(whole["es"], AudioArtifact).sidecar)
    cut = int(1.9 * 16000)  # the pause after "frío,"
    audio = decode_audio(
        tmp_path,
        {
            "cold": Path(wav_16k(tmp_path / "cold.wav", samples[:cut])),
            "home": Path(wav_16k(tmp_path / "home.wav", samples[cut:])),
        },
    )
    # the joined window's split is kept whatever its word times (else a doubted share is decoded again alone)
    monkeypatch.setattr(stages.asr, "doubts", lambda words, spans, **_: [None] * len(spans))
    encoded = []

    def count(stage: AsrStage) -> None:
        encode = stage._encode
        stage._encode = lambda pieces: (encoded.extend(bool(np.any(p)) for p in pieces), encode(pieces))[1]

    JOINED.clear()
    translated = _run(tmp_path, audio, spy=count, translate=True)
    assert JOINED == [["cold", "home"]], JOINED
    assert encoded == [True, False], encoded  # the joined window, then silence
    cold = _words(" ".join(s.text for s in translated["cold"].translation))
    home = _words(" ".join(s.text for s in translated["home"].translation))
    first, second = {"morning", "cold"}, {"home", "together", "newspaper", "stayed"}
    assert cold & first and not cold & second, cold
    assert home & second and not home & first, home


@pytest.mark.slow
def test_an_english_only_model_cannot_translate(tmp_path):
    audio = decode_audio(tmp_path, {"de": LANGUAGES / "de.ogg"})
    with pytest.raises(ModelUnavailableError, match="English-only"):
        _run(tmp_path, audio, translate=True, model="embedded")


def test_the_run_is_refused_before_it_starts_with_an_english_only_model(tmp_path):
    from orchestrator import Orchestrator, Settings

    settings = Settings(_env_file=None, output_dir=tmp_path / "out", asr_model="embedded", asr_translate=True)
    with pytest.raises(SettingsError, match="--translate needs a multilingual Whisper.*English-only"):
        with Orchestrator(settings) as orch:
            orch.plan([LANGUAGES / "de.ogg"])
    assert not (tmp_path / "out" / ".runs").exists() or not any((tmp_path / "out" / ".runs").iterdir())


@pytest.mark.slow
def test_translation_runs_on_the_torch_runtime_too(tmp_path):
    """The same translate task on the torch runtime (stages/whisper/torch_model.py), joined inputs too."""
    audio = decode_audio(tmp_path, {"es": LANGUAGES / "es.ogg", "es2": LANGUAGES / "es.ogg"})
    JOINED.clear()
    translated = _run(tmp_path, audio, translate=True, runtime="torch")
    assert ["es", "es2"] in JOINED, JOINED
    for name in ("es", "es2"):
        assert translated[name].runtime == "torch"
        spanish = " ".join(s.text for s in translated[name].translation)
        # (float32 on torch decodes otherwise than int8: English of the sentence, each copy its own)
        assert len(_words(spanish) & ENGLISH) >= 3 and spanish.lower().count("home") == 1, spanish
