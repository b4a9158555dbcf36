"""Speaker encoders on real voices: the embedded CAM++ separates voices; SpeechBrain ECAPA's real loading path."""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from contracts.errors import ModelUnavailableError
from stages.audio import decode
from stages.runtime.weights import FILES, weight_path
from stages.voices.encoders import (
    CAMPPLUS,
    CamPlusPlus,
    CamPlusPlusEncoder,
    EcapaEncoder,
    cosine,
    fbank,
    load_encoder,
)
from tests.conftest import MEDIA

SPEAKERS = MEDIA / "speakers"
#: what the tests below require of CAM++ on the espeak voices (measured: same 0.74-0.91, different 0.18-0.57)
SAME_AT_LEAST = 0.65
DIFFERENT_AT_MOST = 0.60


def rttm(name: str) -> list[tuple[float, float, str]]:
    turns = []
    for line in (SPEAKERS / f"{name}.rttm").read_text().splitlines():
        f = line.split()
        turns.append((float(f[3]), float(f[3]) + float(f[4]), f[7]))
    return turns


def turn_clips(name: str) -> list[tuple[str, np.ndarray]]:
    """(speaker, samples) of each reference turn of a dialogue fixture."""
    samples = _decoded(SPEAKERS / f"{name}.mp4")
    return [(label, samples[int(s * 16000) : int(e * 16000)]) for s, e, label in rttm(name)]


def _decoded(path: Path) -> np.ndarray:
    import stages.audio as audio

    audio.STAGE.import_libraries()
    return decode(path)[0]


@pytest.fixture(scope="module")
def campplus():
    return CamPlusPlusEncoder("cpu")


def test_state_dict_matches_the_architecture_exactly():
    """Every tensor of the pretrained file has a place in the network written here, with its shape."""
    import torch

    state = torch.load(weight_path("campplus"), map_location="cpu", weights_only=True)
    model = CamPlusPlus()
    ours = model.state_dict()
    assert set(state) == set(ours)
    assert all(state[k].shape == ours[k].shape for k in state)
    assert sum(v.numel() for k, v in state.items() if "num_batches" not in k) == 6_930_720


def test_fbank_is_80_bins_mean_normalised():
    feats = fbank(np.random.default_rng(0).normal(0, 0.1, 16000).astype(np.float32))
    assert feats.shape == (98, 80)
    np.testing.assert_allclose(feats.mean(0).numpy(), 0.0, atol=1e-4)


def test_embeddings_are_192_d_unit_vectors_and_batching_does_not_change_them(campplus):
    clips = [c for _, c in turn_clips("host_guest")]
    one = campplus.embed(clips, 1)
    four = campplus.embed(clips, 4)
    assert one.shape == (4, 192) and one.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(one, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(one, four, atol=1e-4)
    same = campplus.embed([clips[0][: 16000 * 3]] * 3, 3)  # equal lengths: one batched forward pass
    np.testing.assert_allclose(
        same, np.repeat(campplus.embed([clips[0][: 16000 * 3]], 1), 3, axis=0), atol=1e-4
    )


def test_same_voice_is_closer_than_different_voices(campplus):
    """Given enrollment clips and dialogue turns of three espeak voices (other sentences), CAM++ puts
    every same-voice pair above SAME_AT_LEAST and every different-voice pair below DIFFERENT_AT_MOST."""
    labelled = [("Host", _decoded(SPEAKERS / f"host_enroll_{i}.wav")) for i in (1, 2)]
    labelled.append(("Guest", _decoded(SPEAKERS / "guest_enroll_1.wav")))
    labelled += turn_clips("host_guest") + turn_clips("host_stranger")
    vectors = campplus.embed([c for _, c in labelled], 4)
    same, different = [], []
    for i in range(len(labelled)):
        for j in range(i + 1, len(labelled)):
            (same if labelled[i][0] == labelled[j][0] else different).append(float(vectors[i] @ vectors[j]))
    assert min(same) >= SAME_AT_LEAST, sorted(same)[:3]
    assert max(different) <= DIFFERENT_AT_MOST, sorted(different)[-3:]
    assert np.mean(same) - np.mean(different) > 0.35


def test_a_short_clip_is_padded_and_an_empty_one_refused(campplus):
    short = turn_clips("host_guest")[0][1][:4000]  # 0.25 s
    assert campplus.embed([short], 1).shape == (1, 192)
    with pytest.raises(ValueError, match="empty"):
        campplus.embed([np.zeros(0, np.float32)], 1)


def test_missing_weights_say_how_to_fetch_them(tmp_path):
    with pytest.raises(ModelUnavailableError, match="stages.runtime.weights"):
        weight_path("campplus", tmp_path)
    with pytest.raises(ModelUnavailableError, match="speaker encoder 'campplus'"):
        load_encoder(CAMPPLUS, weights=tmp_path / FILES["campplus"].member.rsplit("/", 1)[-1])


# -- SpeechBrain ECAPA: the real from_hparams loading path, on a locally saved checkpoint -------------------

ECAPA_HPARAMS = """\
    n_mels: 80
    pretrained_path: {path}
    compute_features: !new:speechbrain.lobes.features.Fbank
        n_mels: !ref <n_mels>
    mean_var_norm: !new:speechbrain.processing.features.InputNormalization
        norm_type: sentence
        std_norm: False
    embedding_model: !new:speechbrain.lobes.models.ECAPA_TDNN.ECAPA_TDNN
        input_size: !ref <n_mels>
        channels: [64, 64, 64, 64, 192]
        kernel_sizes: [5, 3, 3, 3, 1]
        dilations: [1, 2, 3, 4, 1]
        attention_channels: 32
        lin_neurons: 96
    modules:
        compute_features: !ref <compute_features>
        mean_var_norm: !ref <mean_var_norm>
        embedding_model: !ref <embedding_model>
    pretrainer: !new:speechbrain.utils.parameter_transfer.Pretrainer
        loadables:
            embedding_model: !ref <embedding_model>
        paths:
            embedding_model: !ref <pretrained_path>/embedding_model.ckpt
"""


@pytest.fixture(scope="module")
def ecapa_dir(tmp_path_factory):
    """A SpeechBrain model directory like speechbrain/spkrec-ecapa-voxceleb's, randomly initialised."""
    import torch
    from speechbrain.lobes.models.ECAPA_TDNN import ECAPA_TDNN

    path = tmp_path_factory.mktemp("ecapa")
    (path / "hyperparams.yaml").write_text(textwrap.dedent(ECAPA_HPARAMS).format(path=path))
    torch.manual_seed(0)
    model = ECAPA_TDNN(
        80,
        channels=[64, 64, 64, 64, 192],
        kernel_sizes=[5, 3, 3, 3, 1],
        dilations=[1, 2, 3, 4, 1],
        attention_channels=32,
        lin_neurons=96,
    )
    torch.save(model.state_dict(), path / "embedding_model.ckpt")
    return path, model


def test_ecapa_loads_a_local_directory_through_from_hparams_offline(ecapa_dir, monkeypatch):
    """Offline (HF_HUB_OFFLINE=1), the real EncoderClassifier.from_hparams loads the saved checkpoint: its
    embeddings are the saved network's, so the weights really came from the file. (Random weights: this
    proves the loading code, not speaker accuracy.)"""
    import torch

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path, saved = ecapa_dir
    encoder = load_encoder("ecapa", ecapa_source=str(path))
    assert isinstance(encoder, EcapaEncoder) and encoder.name == f"ecapa:{path}" and encoder.dimension == 96
    clips = [c for _, c in turn_clips("host_guest")[:2]]
    vectors = encoder.embed(clips, 2)
    assert vectors.shape == (2, 96)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    loaded = encoder.model.mods.embedding_model.state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in saved.state_dict().items())


def test_ecapa_from_the_hub_fails_fast_offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))  # an empty cache
    t0 = time.monotonic()
    with pytest.raises(ModelUnavailableError, match="ecapa"):
        load_encoder("ecapa")
    assert time.monotonic() - t0 < 30


def test_cosine_is_scale_free():
    a, b = np.array([1.0, 0.0]), np.array([3.0, 3.0])
    assert cosine(a, b) == pytest.approx(2**-0.5) and cosine(2 * a, b) == pytest.approx(cosine(a, b))
