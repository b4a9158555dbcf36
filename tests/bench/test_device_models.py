"""The device check's random-weight models: the production shapes, loadable offline, tokenizers that fit."""

from __future__ import annotations

import json

import pytest

from bench.device.models import SHAPES, build, shape_spec, tokenizer_json


@pytest.mark.parametrize("profile", sorted(SHAPES))
def test_each_shape_keeps_its_public_configuration(profile):
    # Given the configuration file of a profile's production model
    spec = shape_spec(profile)
    config = spec["config"]
    # Then it holds the published architecture (the numbers the throughput depends on)
    if profile == "speed":
        assert (config["model_type"], config["hidden_size"], config["num_hidden_layers"]) == ("bert", 384, 12)
        assert (config["intermediate_size"], config["vocab_size"], config["max_position_embeddings"]) == (
            1536,
            30522,
            512,
        )
        assert spec["pooling"]["pooling_mode_cls_token"] is True
    else:
        assert (config["model_type"], config["hidden_size"], config["num_hidden_layers"]) == (
            "qwen2",
            1536,
            28,
        )
        assert (config["num_attention_heads"], config["num_key_value_heads"]) == (12, 2)
        assert (config["intermediate_size"], config["vocab_size"], config["rope_theta"]) == (
            8960,
            151646,
            1e6,
        )
        assert spec["pooling"]["pooling_mode_lasttoken"] is True
        assert "auto_map" not in config  # no remote code: transformers' own Qwen2Model runs


def test_the_byte_level_tokenizer_ends_each_text_with_the_token_last_token_pooling_reads():
    from tokenizers import Tokenizer

    # Given the tokenizer the gte-Qwen2 shape uses
    tokenizer = Tokenizer.from_str(json.dumps(tokenizer_json(shape_spec("quality")["tokenizer"])))
    # When it encodes a sentence
    ids = tokenizer.encode("The meeting starts at nine.").ids
    # Then the ids end with <|endoftext|> and all fit the model's vocabulary
    assert ids[-1] == tokenizer.token_to_id("<|endoftext|>")
    assert 5 <= len(ids) <= 10
    assert tokenizer.get_vocab_size() <= shape_spec("quality")["config"]["vocab_size"]


@pytest.mark.slow
def test_a_built_directory_loads_offline_through_the_stage_loader(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from stages.embeddings import load_model

    # Given the bge-small shape built with one layer on the CPU
    built = build("speed", tmp_path / "bge-small-en-v1.5", device="cpu", layers=1)
    # When the embeddings stage's loader loads it, with no fallback allowed
    loaded = load_model(built["path"], "cpu", allow_hub=False, fallback=False)
    vectors = loaded.model.encode(["Hello world.", "A second, longer sentence."], normalize_embeddings=True)
    # Then it is that directory, with the shape's dimension, sequence length and BERT ids
    assert loaded.name == built["path"] and loaded.fallback_reason is None
    assert vectors.shape == (2, 384) and loaded.model.max_seq_length == 512
    assert loaded.model.tokenizer("hello world")["input_ids"] == [101, 7592, 2088, 102]
    # And a second build of the same configuration keeps the directory
    assert build("speed", tmp_path / "bge-small-en-v1.5", device="cpu", layers=1)["reused"] is True
