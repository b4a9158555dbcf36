"""CTranslate2 Whisper -> transformers: the converted model computes what CTranslate2 computes.

Each model is converted once for the module, and both runtimes get the same 30 s log-mel window of
speech.wav: the torch encoder's output must match CTranslate2's ``Whisper.encode`` and the greedy
transcriptions must agree.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from stages.runtime.weights import DEFAULT_DIR, WHISPER_BASE_DIR
from stages.whisper.convert import MARKER, read_model_bin, torch_whisper_dir
from stages.whisper.models import embedded_model_path
from tests.conftest import MAX_WER, SPEECH_TEXT, wer

pytestmark = pytest.mark.slow

WHISPER_BASE = DEFAULT_DIR / WHISPER_BASE_DIR
SOURCES = {"tiny.en": embedded_model_path(), "whisper-base": WHISPER_BASE}
#: CTranslate2 (float32 compute on float16 weights) vs torch (the same weights upcast): they differ by
#: summation order only, measured ~8e-4 at most on outputs up to ~20; a mis-mapped weight gives O(1)
ENCODER_ATOL = 3e-3
#: the greedy transcripts may differ by at most this word error rate (measured: identical)
MAX_TEXT_WER = 0.02


def _source(name: str) -> Path:
    source = SOURCES[name]
    if not (source / "model.bin").is_file():
        pytest.skip(f"{source} is not there (python -m stages.runtime.weights fetches it)")
    return source


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("converted")


@pytest.fixture(scope="module")
def converted(cache):
    """converted(name): the model's converted directory, converted once for the module."""
    done: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in done:
            done[name] = torch_whisper_dir(_source(name), cache)
        return done[name]

    return get


@pytest.fixture(scope="module")
def audio():
    from faster_whisper import decode_audio

    from tests.conftest import MEDIA

    return decode_audio(str(MEDIA / "speech.wav"), sampling_rate=16000)


class Runtimes:
    """Both runtimes of one model, loaded once for the module, fed the same log-mel window."""

    def __init__(self, source: Path, out_dir: Path, audio):
        import ctranslate2
        import numpy as np
        import torch
        from transformers import (
            WhisperFeatureExtractor,
            WhisperForConditionalGeneration,
            WhisperTokenizerFast,
        )

        self.out_dir = out_dir
        extractor = WhisperFeatureExtractor.from_pretrained(out_dir)
        self.mel = extractor(audio, sampling_rate=16000, return_tensors="np").input_features.astype(
            np.float32
        )
        self.ct2 = ctranslate2.models.Whisper(str(source), device="cpu", compute_type="float32")
        kwargs = {"dtype": torch.float32}
        self.torch = WhisperForConditionalGeneration.from_pretrained(out_dir, **kwargs).eval()
        self.tokenizer = WhisperTokenizerFast.from_pretrained(out_dir)

    def features(self):
        import ctranslate2

        return ctranslate2.StorageView.from_array(self.mel)


@pytest.fixture(scope="module")
def runtimes(converted, audio):
    loaded: dict[str, Runtimes] = {}

    def get(name: str) -> Runtimes:
        if name not in loaded:
            loaded[name] = Runtimes(_source(name), converted(name), audio)
        return loaded[name]

    return get


MODELS = pytest.mark.parametrize("name", ["tiny.en", "whisper-base"])


@MODELS
def test_directory_is_named_after_the_source(converted, cache, name):
    # Given the embedded tiny.en (a directory called "model") and the multilingual base
    # Then each converts into <cache>/<model name>-transformers
    assert converted(name) == cache / f"{name}-transformers"
    assert (converted(name) / "model.safetensors").is_file()


@MODELS
def test_encoder_matches_ctranslate2(runtimes, name):
    import numpy as np
    import torch

    rt = runtimes(name)
    # Given the same 30 s log-mel window (the converted dir's preprocessor makes it: 80 mel bins)
    assert rt.mel.shape == (1, 80, 3000)
    # When both encoders run it
    expected = np.array(rt.ct2.encode(rt.features(), to_cpu=True))
    with torch.inference_mode():
        actual = rt.torch.model.encoder(torch.from_numpy(rt.mel)).last_hidden_state.numpy()
    # Then the outputs are the same up to float32 summation order
    assert actual.shape == expected.shape
    assert np.abs(expected).max() > 1.0  # a real activation, not zeros
    np.testing.assert_allclose(actual, expected, atol=ENCODER_ATOL, rtol=0)


@MODELS
def test_greedy_transcript_matches_ctranslate2(runtimes, name):
    import torch

    rt = runtimes(name)
    multilingual = rt.ct2.is_multilingual
    assert multilingual == (name == "whisper-base")
    prompt = [
        "<|startoftranscript|>",
        *(["<|en|>", "<|transcribe|>"] if multilingual else []),
        "<|notimestamps|>",
    ]
    # When CTranslate2 decodes greedily with its suppression lists (the CT2 config's) ...
    result = rt.ct2.generate(
        rt.features(),
        [rt.tokenizer.convert_tokens_to_ids(prompt)],
        beam_size=1,
        suppress_blank=True,
        suppress_tokens=[-1],
        max_length=448,
    )
    ct2_text = rt.tokenizer.decode(result[0].sequences_ids[0], skip_special_tokens=True).strip()
    # ... and transformers does with the converted generation config
    language = {"language": "en", "task": "transcribe"} if multilingual else {}
    with torch.inference_mode():
        ids = rt.torch.generate(
            torch.from_numpy(rt.mel), num_beams=1, do_sample=False, return_timestamps=False, **language
        )
    torch_text = rt.tokenizer.batch_decode(ids, skip_special_tokens=True)[0].strip()
    # Then the transcripts agree, and they are the speech (not both empty or both garbage)
    assert wer(ct2_text, torch_text) <= MAX_TEXT_WER, (ct2_text, torch_text)
    assert wer(SPEECH_TEXT, torch_text) <= MAX_WER, torch_text


@MODELS
def test_generation_config_and_tokenizer(converted, runtimes, name):
    from transformers import GenerationConfig

    source, out = _source(name), converted(name)
    ct2_config = json.loads((source / "config.json").read_text())
    generation = GenerationConfig.from_pretrained(out)
    tokenizer = runtimes(name).tokenizer
    # the alignment heads (word timing), suppression lists and special ids come from the CT2 model
    assert [list(pair) for pair in generation.alignment_heads] == ct2_config["alignment_heads"]
    assert generation.suppress_tokens == ct2_config["suppress_ids"]
    assert generation.begin_suppress_tokens == ct2_config["suppress_ids_begin"]
    assert generation.max_length == 448
    assert generation.decoder_start_token_id == tokenizer.convert_tokens_to_ids("<|startoftranscript|>")
    assert generation.no_timestamps_token_id == tokenizer.convert_tokens_to_ids("<|notimestamps|>")
    # timestamp tokens follow <|notimestamps|> (tiny.en's tokenizer.json lacked them: added from its vocabulary)
    assert tokenizer.convert_tokens_to_ids("<|1.00|>") == generation.no_timestamps_token_id + 1 + 50
    assert len(tokenizer) == read_model_bin(source / "model.bin").shape("decoder/embeddings/weight")[0]
    if name == "whisper-base":
        assert generation.is_multilingual
        assert generation.lang_to_id["<|en|>"] == tokenizer.convert_tokens_to_ids("<|en|>")
        assert len(generation.lang_to_id) == 99
        assert generation.task_to_id["transcribe"] == tokenizer.convert_tokens_to_ids("<|transcribe|>")
    else:
        # an English-only model has no language to detect (transformers would prompt one)
        assert not generation.is_multilingual
        assert not hasattr(generation, "lang_to_id")


def test_second_call_reuses_the_directory(converted, cache):
    # Given a finished conversion
    out = converted("tiny.en")
    before = {path.name: path.stat().st_mtime_ns for path in out.iterdir()}
    # When it is asked for again
    started = time.perf_counter()
    again = torch_whisper_dir(embedded_model_path(), cache)
    # Then the same directory comes back untouched, without converting
    assert again == out
    assert {path.name: path.stat().st_mtime_ns for path in out.iterdir()} == before
    assert time.perf_counter() - started < 2.0


def test_changed_source_converts_again(tmp_path):
    # Given a copy of tiny.en converted once
    source = tmp_path / "tiny-copy"
    source.mkdir()
    for path in embedded_model_path().iterdir():
        if path.is_file():
            (source / path.name).symlink_to(path)
    config = json.loads((embedded_model_path() / "config.json").read_text())
    (source / "config.json").unlink()
    (source / "config.json").write_text(json.dumps(config))
    first = torch_whisper_dir(source, tmp_path / "cache")
    assert (
        json.loads((first / "generation_config.json").read_text())["alignment_heads"]
        == config["alignment_heads"]
    )
    # When its config changes (other alignment heads)
    config["alignment_heads"] = [[3, 5]]
    (source / "config.json").write_text(json.dumps(config))
    second = torch_whisper_dir(source, tmp_path / "cache")
    # Then it converts again, into the same place, and nothing temporary is left beside it
    assert second == first
    assert json.loads((second / "generation_config.json").read_text())["alignment_heads"] == [[3, 5]]
    assert json.loads((second / MARKER).read_text())["source"]["files"]["config.json"]
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["tiny-copy-transformers"]


def test_int8_weights_are_dequantized(converted, tmp_path):
    """An int8 CTranslate2 model (made here from the converted tiny.en by CTranslate2's own converter)
    converts into float16 weights within int8 rounding of the originals."""
    import ctranslate2
    import torch
    from safetensors.torch import load_file

    # Given tiny.en quantized to int8 by CTranslate2 (weights stored as round(w * 127 / rowmax))
    int8_dir = Path(
        ctranslate2.converters.TransformersConverter(
            str(converted("tiny.en")), copy_files=["tokenizer.json"]
        ).convert(str(tmp_path / "int8"), quantization="int8_float16")
    )
    assert read_model_bin(int8_dir / "model.bin").variables["encoder/conv1/weight"].dtype == "int8"
    # When it is converted
    out = torch_whisper_dir(int8_dir, tmp_path / "cache")
    original = load_file(converted("tiny.en") / "model.safetensors")
    dequantized = load_file(out / "model.safetensors")
    # Then every weight is float16 and within half a quantization step (plus float16 rounding) of the original
    assert dequantized.keys() == original.keys()
    for key, want in original.items():
        got = dequantized[key]
        assert got.dtype == torch.float16, key
        want, got = want.float(), got.float()
        if want.dim() < 2 or "embed_positions" in key:
            assert torch.equal(got, want), key  # biases, norms and positions are not quantized
            continue
        rowmax = want.abs().reshape(want.shape[0], -1).amax(dim=1).reshape(-1, *[1] * (want.dim() - 1))
        bound = rowmax / 127 * 0.5 + rowmax * 2**-10
        assert bool(((got - want).abs() <= bound).all()), key


def test_command_line(converted, tmp_path):
    from stages.whisper.convert import main

    # the device kit's entry point, SRC OUT: a finished directory is reused
    out = converted("tiny.en")
    marker = (out / MARKER).stat().st_mtime_ns
    assert main([str(embedded_model_path()), str(out)]) == 0
    assert (out / MARKER).stat().st_mtime_ns == marker
    # a directory without a model fails with exit status 1 and leaves nothing behind
    assert main([str(tmp_path / "missing"), str(tmp_path / "out")]) == 1
    assert not (tmp_path / "out").exists()
