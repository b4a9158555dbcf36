"""``translate``: inputs not in English decoded a second time with Whisper's translate task, in the same child,
over the same encoder output; English inputs once; an English-only model refused."""

from __future__ import annotations

import pytest

from contracts import StageRequest, TranscriptArtifact, WorkItem, load_artifact
from contracts.errors import ModelUnavailableError, SettingsError
from stages.asr import AsrStage
from tests.conftest import MEDIA, stage_settings
from tests.stages.test_asr import decode_audio

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


def _run(tmp, audio: dict, **settings) -> dict[str, TranscriptArtifact]:
    items = [
        WorkItem(id=name, inputs={"audio": str(path)}, output=str(tmp / f"{name}.json"), fingerprint="fp")
        for name, path in audio.items()
    ]
    stage = AsrStage()
    generate = stage._generate

    def spy(batch, temperature=0.0):
        JOINED.extend([job.item.id for job, _ in w.parts] for w in batch if len(w.parts) > 1)
        return generate(batch, temperature)

    stage._generate = spy
    result = stage.run(
        StageRequest(
            request_id="r",
            stage="asr",
            module="stages.asr",
            batch_size=4,
            device="cpu",
            settings=stage_settings("asr", **{"model": "whisper-base", **settings}),
            result_path=str(tmp / "res.json"),
            items=items,
        )
    )
    assert all(r.ok for r in result.items), result.items
    return {r.id: load_artifact(r.output, TranscriptArtifact) for r in result.items}


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
    """The same translate task on the torch runtime (stages/whisper_torch.py), joined inputs too."""
    audio = decode_audio(tmp_path, {"es": LANGUAGES / "es.ogg", "es2": LANGUAGES / "es.ogg"})
    JOINED.clear()
    translated = _run(tmp_path, audio, translate=True, runtime="torch")
    assert ["es", "es2"] in JOINED, JOINED
    for name in ("es", "es2"):
        assert translated[name].runtime == "torch"
        spanish = " ".join(s.text for s in translated[name].translation)
        # (float32 on torch decodes otherwise than int8: English of the sentence, each copy its own)
        assert len(_words(spanish) & ENGLISH) >= 3 and spanish.lower().count("home") == 1, spanish
