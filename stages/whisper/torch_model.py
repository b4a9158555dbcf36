"""Whisper on torch: the ASR stage's model where CTranslate2 cannot use the device.

CTranslate2 has no build for CUDA 13 (machines with CUDA 13 drivers, Blackwell cards, DGX Spark: it reports no
CUDA device), so ``ASR_RUNTIME=torch`` (or ``auto`` where CTranslate2 sees no GPU) runs the same Whisper weights
through transformers' ``WhisperForConditionalGeneration`` instead: the encoder with SDPA attention, in float16 on
CUDA, over batched 30 s windows.

The classes here speak the small part of CTranslate2's ``Whisper`` and faster-whisper's ``Tokenizer`` that the ASR
stage uses (``encode``, ``generate`` with beam search, sampling and the no-speech probability, ``align`` for word
times from the alignment heads' cross-attention, ``detect_language``), so the stage keeps one code path for its
windows, joined short inputs, repetition guard, language identification and artifacts. The decoder runs here, step
by step, on the model's own modules with the encoder's keys and values computed once per batch and a preallocated
self-attention cache: it reads nothing of transformers' generation or cache classes, whose interfaces move between
releases (4.57 here, 5.x on the GPU image). Nothing here imports ctranslate2, faster-whisper or whisperX.

Weights: a transformers Whisper directory or hub name as is; a CTranslate2 directory (the embedded models ship only
as such) is converted once (stages/whisper/convert.py).
"""

from __future__ import annotations

import json
import logging
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

log = logging.getLogger(__name__)

SAMPLE_RATE = 16_000
N_FFT = 400
HOP_LENGTH = 160
CHUNK_S = 30
N_SAMPLES = SAMPLE_RATE * CHUNK_S
N_FRAMES = N_SAMPLES // HOP_LENGTH
#: the standard Whisper punctuation that stays with its word when words are split on spaces
_PUNCTUATION = '"#()*+/:;<=>@[\\]^_`{|}~「」『』'


#: faster-whisper's short model names and the transformers checkpoints of the same models on the hub
HUB_NAMES = {
    **{
        size: f"openai/whisper-{size}" for size in ("tiny", "base", "small", "medium", "large-v1", "large-v2")
    },
    **{f"{size}.en": f"openai/whisper-{size}.en" for size in ("tiny", "base", "small", "medium")},
    "large": "openai/whisper-large-v3",
    "large-v3": "openai/whisper-large-v3",
    "large-v3-turbo": "openai/whisper-large-v3-turbo",
    "turbo": "openai/whisper-large-v3-turbo",
    "distil-large-v2": "distil-whisper/distil-large-v2",
    "distil-large-v3": "distil-whisper/distil-large-v3",
    "distil-medium.en": "distil-whisper/distil-medium.en",
    "distil-small.en": "distil-whisper/distil-small.en",
}


# -- results, shaped as CTranslate2's -----------------------------------------------------------------------


@dataclass
class GenerationResult:
    sequences_ids: list[list[int]]
    scores: list[float]
    no_speech_prob: float = 0.0


@dataclass
class AlignmentResult:
    #: (text index, encoder frame) pairs of the DTW path; text index ``len(text)`` is end-of-text
    alignments: list[tuple[int, int]]
    text_token_probs: list[float] = field(default_factory=list)


# -- the tokenizer ------------------------------------------------------------------------------------------


class WhisperTokenizer:
    """The token ids and word splitting of a Whisper ``tokenizer.json`` (what faster-whisper's ``Tokenizer``
    offers the stage), for one language and task."""

    def __init__(self, tokenizer, multilingual: bool, task: str = "transcribe", language: str | None = None):
        self.tokenizer = tokenizer  # tokenizers.Tokenizer
        self.multilingual = multilingual
        self.task = self.token(f"<|{task}|>") if multilingual else None
        self.language_code = (language or "en") if multilingual else "en"
        self.language = self.token(f"<|{self.language_code}|>") if multilingual else None

    def token(self, text: str) -> int:
        found = self.tokenizer.token_to_id(text)
        if found is None:
            raise ValueError(f"the tokenizer has no token {text!r}")
        return found

    @property
    def sot(self) -> int:
        return self.token("<|startoftranscript|>")

    @property
    def sot_prev(self) -> int:
        return self.token("<|startofprev|>")

    @property
    def eot(self) -> int:
        return self.token("<|endoftext|>")

    @property
    def no_timestamps(self) -> int:
        return self.token("<|notimestamps|>")

    @property
    def timestamp_begin(self) -> int:
        return self.no_timestamps + 1

    @property
    def no_speech(self) -> int:
        found = self.tokenizer.token_to_id("<|nospeech|>")
        return found if found is not None else self.token("<|nocaptions|>")

    @property
    def sot_sequence(self) -> list[int]:
        sequence = [self.sot]
        if self.language is not None:
            sequence.append(self.language)
        if self.task is not None:
            sequence.append(self.task)
        return sequence

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode([t for t in tokens if t < self.eot])

    def split_to_word_tokens(self, tokens: list[int]) -> tuple[list[str], list[list[int]]]:
        if self.language_code in {"zh", "ja", "th", "lo", "my", "yue"}:
            return self._split_on_unicode(tokens)
        return self._split_on_spaces(tokens)

    def _split_on_unicode(self, tokens: list[int]) -> tuple[list[str], list[list[int]]]:
        """Words end where the decoded text of the tokens so far is whole (no replacement character)."""
        words, word_tokens, current = [], [], []
        decoded_full = self.tokenizer.decode(tokens, skip_special_tokens=False)
        position = 0
        for token in tokens:
            current.append(token)
            decoded = self.tokenizer.decode(current, skip_special_tokens=False)
            if "\ufffd" not in decoded or decoded_full[position + decoded.index("\ufffd")] == "\ufffd":
                words.append(decoded)
                word_tokens.append(current)
                current = []
                position += len(decoded)
        return words, word_tokens

    def _split_on_spaces(self, tokens: list[int]) -> tuple[list[str], list[list[int]]]:
        """A word starts at a token that begins with a space, and stands alone where it is punctuation or
        special; the rest joins the word before."""
        subwords, subword_tokens = self._split_on_unicode(tokens)
        words: list[str] = []
        word_tokens: list[list[int]] = []
        for subword, toks in zip(subwords, subword_tokens):
            special = toks[0] >= self.eot
            with_space = subword.startswith(" ")
            stripped = subword.strip()
            punctuation = bool(stripped) and (
                stripped in _PUNCTUATION or all(unicodedata.category(c).startswith("P") for c in stripped)
            )
            if special or with_space or punctuation or not words:
                words.append(subword)
                word_tokens.append(list(toks))
            else:
                words[-1] += subword
                word_tokens[-1].extend(toks)
        return words, word_tokens


# -- features -----------------------------------------------------------------------------------------------


class LogMel:
    """Whisper's log-mel spectrogram of 30 s windows, in torch on the model's device."""

    def __init__(self, n_mels: int, device: torch.device):
        from transformers.audio_utils import mel_filter_bank

        filters = mel_filter_bank(
            num_frequency_bins=1 + N_FFT // 2,
            num_mel_filters=n_mels,
            min_frequency=0.0,
            max_frequency=8000.0,
            sampling_rate=SAMPLE_RATE,
            norm="slaney",
            mel_scale="slaney",
        )
        self.filters = torch.as_tensor(np.asarray(filters, dtype=np.float32).T, device=device)
        self.window = torch.hann_window(N_FFT, device=device)
        self.device = device

    def __call__(self, pieces: list[np.ndarray]) -> torch.Tensor:
        """(batch, n_mels, 3000) features of up to 30 s of 16 kHz float32 samples each, zero-padded to 30 s."""
        audio = torch.zeros((len(pieces), N_SAMPLES), dtype=torch.float32)
        for row, piece in enumerate(pieces):
            piece = np.asarray(piece, dtype=np.float32)[:N_SAMPLES]
            audio[row, : piece.shape[0]] = torch.from_numpy(piece)
        audio = audio.to(self.device)
        stft = torch.stft(audio, N_FFT, HOP_LENGTH, window=self.window, return_complex=True)
        power = stft[..., :-1].abs() ** 2
        mel = self.filters @ power
        log_spec = torch.clamp(mel, min=1e-10).log10()
        peak = log_spec.amax(dim=(-2, -1), keepdim=True)
        log_spec = torch.maximum(log_spec, peak - 8.0)
        return (log_spec + 4.0) / 4.0


# -- the model ----------------------------------------------------------------------------------------------


def _load(path: str, device: torch.device, dtype: torch.dtype, local_files_only: bool):
    from transformers import WhisperForConditionalGeneration

    kwargs = {"local_files_only": local_files_only, "attn_implementation": "sdpa"}
    try:
        model = WhisperForConditionalGeneration.from_pretrained(path, dtype=dtype, **kwargs)
    except TypeError:  # transformers before 4.56 names it torch_dtype
        model = WhisperForConditionalGeneration.from_pretrained(path, torch_dtype=dtype, **kwargs)
    return model.to(device).eval()


class TorchWhisper:
    """A transformers Whisper speaking the part of CTranslate2's ``Whisper`` the ASR stage uses."""

    def __init__(
        self,
        path: str,
        device: str = "cpu",
        dtype: str = "auto",
        local_files_only: bool = True,
        model=None,
        tokenizer_path: str | None = None,
    ):
        """Load ``path`` (a transformers Whisper directory or hub name); ``model``: an already built
        ``WhisperForConditionalGeneration`` instead (a shape with random weights, for throughput), with the
        ``tokenizer.json`` of ``tokenizer_path``."""
        self.device = torch.device(device)
        if dtype == "auto":
            dtype = "float16" if self.device.type == "cuda" else "float32"
        self.dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}[dtype]
        self.compute_type = dtype
        self.model = model.to(self.device, self.dtype).eval() if model is not None else None
        if self.model is None:
            self.model = _load(path, self.device, self.dtype, local_files_only)
        path = tokenizer_path or path
        config = self.model.config
        self.config = config
        self.n_mels = config.num_mel_bins
        self.is_multilingual = config.vocab_size >= 51865
        self.heads = config.decoder_attention_heads
        self.head_dim = config.d_model // self.heads
        self.decoder = self.model.model.decoder
        self.max_positions = config.max_target_positions
        generation = getattr(self.model, "generation_config", None)
        heads = getattr(generation, "alignment_heads", None) if generation is not None else None
        if not heads:  # openai's choice where none is given: the cross-attention of the decoder's second half
            half = config.decoder_layers // 2
            heads = [(layer, h) for layer in range(half, config.decoder_layers) for h in range(self.heads)]
        self.alignment_heads = [(int(layer), int(h)) for layer, h in heads]
        self.suppress_ids, self.suppress_ids_begin = _suppression(path, generation)
        self.features = LogMel(self.n_mels, self.device)
        self._tokenizer = _tokenizer_file(path, local_files_only)
        languages = getattr(generation, "lang_to_id", None) if self.is_multilingual else None
        self.lang_tokens = dict(sorted((languages or {}).items()))

    # CTranslate2's names ------------------------------------------------------------------------------------

    @torch.inference_mode()
    def encode(self, features: torch.Tensor) -> torch.Tensor:
        features = torch.as_tensor(features).to(self.device, self.dtype)
        return self.model.model.encoder(features).last_hidden_state

    @torch.inference_mode()
    def generate(
        self,
        encoded: torch.Tensor,
        prompts: list[list[int]],
        beam_size: int = 1,
        patience: float = 1.0,
        num_hypotheses: int = 1,
        sampling_topk: int = 1,
        sampling_temperature: float = 1.0,
        length_penalty: float = 1.0,
        max_length: int = 448,
        suppress_blank: bool = True,
        suppress_tokens: list[int] | None = None,
        no_repeat_ngram_size: int = 0,
        repetition_penalty: float = 1.0,
        return_scores: bool = True,
        return_no_speech_prob: bool = True,
    ) -> list[GenerationResult]:
        """Decode each encoded window after its prompt: beam search (``beam_size`` > 1), greedy, or sampling at
        ``sampling_temperature`` (``sampling_topk`` 0: from the whole distribution) keeping the best of
        ``num_hypotheses``. Scores are as CTranslate2 gives them: the sum of the token log-probabilities
        (end-of-text included) over the text length to the power ``length_penalty``; and as in CTranslate2, at
        most ``max_length // 2`` tokens are generated."""
        suppress = set(self.suppress_ids if suppress_tokens is None or -1 in suppress_tokens else [])
        suppress |= {t for t in (suppress_tokens or []) if t >= 0}
        results: list[GenerationResult | None] = [None] * len(prompts)
        by_length: dict[int, list[int]] = {}
        for row, prompt in enumerate(prompts):
            by_length.setdefault(len(prompt), []).append(row)
        for rows in by_length.values():
            memory = encoded[rows] if len(rows) != encoded.shape[0] else encoded
            sampling = sampling_topk != 1 and sampling_temperature > 0
            width = max(1, num_hypotheses) if sampling else max(1, beam_size)
            decoded = _Search(
                self,
                memory,
                [prompts[r] for r in rows],
                width=width,
                sampling=sampling,
                temperature=sampling_temperature,
                topk=sampling_topk,
                patience=patience,
                length_penalty=length_penalty,
                max_length=max_length,
                suppress=sorted(suppress),
                suppress_blank=self.suppress_ids_begin if suppress_blank else [],
                repetition_penalty=repetition_penalty,
            ).run()
            for r, result in zip(rows, decoded):
                results[r] = result
        return [r for r in results if r is not None]

    @torch.inference_mode()
    def align(
        self,
        encoded: torch.Tensor,
        start_sequence: list[int],
        text_tokens: list[list[int]],
        num_frames: list[int] | int,
        median_filter_width: int = 7,
    ) -> list[AlignmentResult]:
        """Word timing: each text forced through the decoder after ``start_sequence`` and no-timestamps; the
        alignment heads' cross-attention (softmax over the window's frames, standardised over the tokens,
        median-filtered in time, averaged over heads) is warped onto the frames by DTW."""
        no_timestamps = self._token_id("<|notimestamps|>")
        eot = self._token_id("<|endoftext|>")
        frames = [num_frames] * len(text_tokens) if isinstance(num_frames, int) else list(num_frames)
        out = []
        for row, (text, n_frames) in enumerate(zip(text_tokens, frames)):
            tokens = [*start_sequence, no_timestamps, *text, eot]
            memory = encoded[row : row + 1]
            logits, attentions = _forward_all(self, memory, tokens, self.alignment_heads)
            start = len(start_sequence)
            # each text token's probability among the text tokens (those before end-of-text), as CTranslate2's
            probs = torch.softmax(logits[0, start : start + len(text), :eot].float(), dim=-1)
            text_probs = probs[
                torch.arange(len(text), device=probs.device), torch.as_tensor(text, device=probs.device)
            ].tolist()
            keep = max(1, min(attentions.shape[-1], n_frames // 2))
            weights = attentions[:, :, :keep].float().softmax(dim=-1)
            std, mean = torch.std_mean(weights, dim=-2, keepdim=True, unbiased=False)
            weights = ((weights - mean) / std.clamp(min=1e-12)).cpu().numpy()
            weights = _median_filter(weights, median_filter_width)
            matrix = weights.mean(axis=0)[start : start + len(text) + 1]
            text_index, time_index = _dtw(-matrix)
            out.append(
                AlignmentResult(
                    alignments=list(zip(text_index.tolist(), time_index.tolist())),
                    text_token_probs=text_probs,
                )
            )
        return out

    @torch.inference_mode()
    def detect_language(self, encoded: torch.Tensor) -> list[list[tuple[str, float]]]:
        """Per window: (``<|xx|>``, probability) of every language token, best first."""
        if not self.lang_tokens:
            raise ValueError("this Whisper model names no languages (an English-only model)")
        sot = self._token_id("<|startoftranscript|>")
        logits, _ = _forward_all(self, encoded, [sot], [])
        names = list(self.lang_tokens)
        ids = torch.as_tensor([self.lang_tokens[n] for n in names], device=logits.device)
        probs = torch.softmax(logits[:, -1, ids].float(), dim=-1).cpu().numpy()
        return [sorted(zip(names, map(float, row)), key=lambda pair: -pair[1]) for row in probs]

    def _token_id(self, text: str) -> int:
        found = self._tokenizer.token_to_id(text)
        if found is None:
            raise ValueError(f"the tokenizer has no token {text!r}")
        return found


def _tokenizer_file(path: str, local_files_only: bool):
    """The ``tokenizers.Tokenizer`` of a Whisper directory or hub name (its ``tokenizer.json``)."""
    import tokenizers

    local = Path(path) / "tokenizer.json"
    if not local.is_file():
        from huggingface_hub import hf_hub_download

        local = Path(hf_hub_download(path, "tokenizer.json", local_files_only=local_files_only))
    return tokenizers.Tokenizer.from_file(str(local))


def _suppression(path: str, generation) -> tuple[list[int], list[int]]:
    """(tokens never generated, tokens not generated first) as the model's configuration gives them."""
    suppress = list(getattr(generation, "suppress_tokens", None) or [])
    begin = list(getattr(generation, "begin_suppress_tokens", None) or [])
    local = Path(path) / "config.json"
    if not suppress and local.is_file():  # a converted CTranslate2 directory keeps CTranslate2's names too
        data = json.loads(local.read_text())
        suppress = list(data.get("suppress_ids") or [])
        begin = list(data.get("suppress_ids_begin") or begin)
    return suppress, begin


# -- the decoder, step by step ------------------------------------------------------------------------------


def _cross_kv(whisper: TorchWhisper, memory: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each decoder layer's cross-attention keys and values of the encoder output: (batch, heads, frames, dim)."""
    b, frames, _ = memory.shape
    out = []
    for layer in whisper.decoder.layers:
        attn = layer.encoder_attn
        k = attn.k_proj(memory).view(b, frames, whisper.heads, whisper.head_dim).transpose(1, 2)
        v = attn.v_proj(memory).view(b, frames, whisper.heads, whisper.head_dim).transpose(1, 2)
        out.append((k, v))
    return out


def _split_heads(x: torch.Tensor, whisper: TorchWhisper) -> torch.Tensor:
    b, t, _ = x.shape
    return x.view(b, t, whisper.heads, whisper.head_dim).transpose(1, 2)


def _step(
    whisper: TorchWhisper,
    tokens: torch.Tensor,
    offset: int,
    cache: list[list[torch.Tensor]],
    cross: list[tuple[torch.Tensor, torch.Tensor]],
    want_heads: list[tuple[int, int]] | None = None,
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The decoder over ``tokens`` (batch, t) at positions ``offset``...: logits of every position, the keys and
    values appended to ``cache`` (per layer [k, v, length]), and the cross-attention logits of ``want_heads``."""
    decoder = whisper.decoder
    b, t = tokens.shape
    positions = decoder.embed_positions.weight[offset : offset + t]
    x = decoder.embed_tokens(tokens) + positions
    scale = whisper.head_dim**-0.5
    picked: list[torch.Tensor] = []
    causal = t > 1
    for index, layer in enumerate(decoder.layers):
        attn = layer.self_attn
        h = layer.self_attn_layer_norm(x)
        q = _split_heads(attn.q_proj(h), whisper)
        k = _split_heads(attn.k_proj(h), whisper)
        v = _split_heads(attn.v_proj(h), whisper)
        keys, values, length = cache[index]
        keys[:, :, length : length + t] = k
        values[:, :, length : length + t] = v
        cache[index][2] = length + t
        k_all, v_all = keys[:, :, : length + t], values[:, :, : length + t]
        if causal:
            mask = torch.ones(t, length + t, dtype=torch.bool, device=x.device).tril(diagonal=length)
            o = torch.nn.functional.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask)
        else:
            o = torch.nn.functional.scaled_dot_product_attention(q, k_all, v_all)
        x = x + attn.out_proj(o.transpose(1, 2).reshape(b, t, -1))
        cross_attn = layer.encoder_attn
        h = layer.encoder_attn_layer_norm(x)
        q = _split_heads(cross_attn.q_proj(h), whisper)
        ck, cv = cross[index]
        wanted = [head for lay, head in (want_heads or []) if lay == index]
        if wanted:
            scores = (q[:, wanted] * scale) @ ck[:, wanted].transpose(-1, -2)
            picked.append(scores)
        o = torch.nn.functional.scaled_dot_product_attention(q, ck, cv)
        x = x + cross_attn.out_proj(o.transpose(1, 2).reshape(b, t, -1))
        h = layer.final_layer_norm(x)
        x = x + layer.fc2(layer.activation_fn(layer.fc1(h)))
    logits = whisper.model.proj_out(decoder.layer_norm(x))
    return logits, picked


def _new_cache(whisper: TorchWhisper, rows: int, length: int, like: torch.Tensor) -> list[list]:
    shape = (rows, whisper.heads, length, whisper.head_dim)
    return [[like.new_empty(shape), like.new_empty(shape), 0] for _ in range(len(whisper.decoder.layers))]


def _forward_all(
    whisper: TorchWhisper, memory: torch.Tensor, tokens: list[int], heads: list[tuple[int, int]]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits of every position of ``tokens`` (the same for every row of ``memory``) and the chosen heads'
    cross-attention logits (heads, positions, frames) of the first row."""
    ids = torch.as_tensor([tokens] * memory.shape[0], device=memory.device)
    cache = _new_cache(whisper, memory.shape[0], len(tokens), memory)
    logits, picked = _step(whisper, ids, 0, cache, _cross_kv(whisper, memory), heads)
    if picked:
        attention = torch.cat(
            [p[0] for p in picked], dim=0
        )  # layer by layer: the heads' order does not matter
    else:
        attention = torch.empty(0)
    return logits, attention


class _Search:
    """Beam search, greedy decoding or sampling over a batch of windows that share a prompt length."""

    def __init__(
        self,
        whisper: TorchWhisper,
        memory: torch.Tensor,
        prompts: list[list[int]],
        width: int,
        sampling: bool,
        temperature: float,
        topk: int,
        patience: float,
        length_penalty: float,
        max_length: int,
        suppress: list[int],
        suppress_blank: list[int],
        repetition_penalty: float,
    ):
        self.w = whisper
        self.memory = memory
        self.prompts = prompts
        self.width = width
        self.sampling = sampling
        self.temperature = temperature
        self.topk = topk
        self.patience = patience
        self.length_penalty = length_penalty
        self.max_length = max_length
        self.suppress = suppress
        self.suppress_blank = suppress_blank
        self.repetition_penalty = repetition_penalty
        tokens = whisper._tokenizer
        self.eot = tokens.token_to_id("<|endoftext|>")
        self.sot = tokens.token_to_id("<|startoftranscript|>")
        no_speech = tokens.token_to_id("<|nospeech|>")
        self.no_speech = no_speech if no_speech is not None else tokens.token_to_id("<|nocaptions|>")

    def run(self) -> list[GenerationResult]:
        w, width = self.w, self.width
        batch, prompt_len = len(self.prompts), len(self.prompts[0])
        device = self.memory.device
        rows = batch * width
        cross = [
            (k.repeat_interleave(width, 0), v.repeat_interleave(width, 0))
            for k, v in _cross_kv(w, self.memory)
        ]
        # CTranslate2's length rule: at most half of ``max_length`` new tokens, and no more than the prompt leaves
        # (its decoding starts at the prompt's last token); here also no more than the decoder has positions for
        limit = min(self.max_length, w.max_positions) - prompt_len + 1
        max_new = max(1, min(self.max_length // 2, limit))
        cache = _new_cache(w, rows, prompt_len + max_new, self.memory)
        prompt = torch.as_tensor(self.prompts, device=device).repeat_interleave(width, 0)
        logits, _ = _step(w, prompt, 0, cache, cross)
        sot_at = [p.index(self.sot) if self.sot in p else 0 for p in self.prompts]
        no_speech = torch.softmax(
            logits[::width][
                torch.arange(batch, device=device), torch.as_tensor(sot_at, device=device)
            ].float(),
            dim=-1,
        )[:, self.no_speech].tolist()
        last = logits[:, -1].float()
        vocab = last.shape[-1]
        mask = torch.zeros(vocab, dtype=torch.bool, device=device)
        # only the suppressed tokens, as CTranslate2 does: the log-probabilities (and so the scores, which the
        # stage's thresholds read) are over the whole vocabulary; the stage keeps only the text tokens
        mask[[t for t in self.suppress if t < vocab]] = True
        begin_mask = mask.clone()
        begin_mask[[t for t in self.suppress_blank if t < vocab]] = True
        generator = torch.Generator(device=device).manual_seed(0) if self.sampling else None

        scores = torch.zeros(rows, device=device)
        if not self.sampling:  # only the first of each row's identical beams starts
            scores.view(batch, width)[:, 1:] = float("-inf")
        sequences = torch.empty((rows, 0), dtype=torch.long, device=device)
        finished: list[list[tuple[float, list[int], float]]] = [[] for _ in range(batch)]
        done = [False] * batch
        wanted = max(1, round(width * self.patience)) if not self.sampling else width
        step = 0
        while True:
            logprobs = torch.log_softmax(
                self._adjust(last, sequences, begin_mask if step == 0 else mask), dim=-1
            )
            length = sequences.shape[1] + 1
            if self.sampling:
                choice = self._sample(last, sequences, begin_mask if step == 0 else mask, generator)
                token_lp = logprobs.gather(1, choice[:, None])[:, 0]
                new_scores = scores + token_lp
                origin = torch.arange(rows, device=device)
                tokens = choice
            else:
                total = (scores[:, None] + logprobs).view(batch, width * vocab)
                top_scores, top_index = total.topk(2 * width, dim=-1)
                # one copy to the host per step (not one per window): the choice below is plain Python
                scores_l = top_scores.tolist()
                origin_l = (top_index // vocab).tolist()
                tokens_l = (top_index % vocab).tolist()
                pick_rows, pick_tokens, pick_scores = [], [], []
                for b in range(batch):
                    kept = 0
                    candidates = zip(scores_l[b], origin_l[b], tokens_l[b])
                    for rank, (s, o, t) in enumerate(candidates):
                        if s == float("-inf"):
                            break
                        if (
                            t == self.eot
                        ):  # an ending among the best ``width`` candidates finishes a hypothesis
                            if rank < width and not done[b] and len(finished[b]) < wanted:
                                seq = sequences[b * width + o].tolist()
                                finished[b].append((s / max(1, len(seq)) ** self.length_penalty, seq, s))
                            continue
                        if kept < width:
                            pick_rows.append(b * width + o)
                            pick_tokens.append(t)
                            pick_scores.append(s)
                            kept += 1
                    while kept < width:  # fewer live hypotheses than beams: dead rows
                        pick_rows.append(b * width)
                        pick_tokens.append(self.eot)
                        pick_scores.append(float("-inf"))
                        kept += 1
                    if len(finished[b]) >= wanted:
                        done[b] = True
                origin = torch.as_tensor(pick_rows, device=device)
                tokens = torch.as_tensor(pick_tokens, device=device)
                new_scores = torch.as_tensor(pick_scores, device=device)
            sequences = torch.cat([sequences[origin], tokens[:, None]], dim=1)
            scores = new_scores
            if self.sampling:
                ended = tokens == self.eot
                for r in ended.nonzero().flatten().tolist():
                    b = r // width
                    if scores[r] != float("-inf"):
                        seq = sequences[r, :-1].tolist()
                        s = float(scores[r])
                        finished[b].append((s / max(1, len(seq)) ** self.length_penalty, seq, s))
                scores = torch.where(ended, torch.full_like(scores, float("-inf")), scores)
                for b in range(batch):
                    done[b] = len(finished[b]) >= width or bool(
                        torch.isinf(scores.view(batch, width)[b]).all()
                    )
            if all(done) or length >= max_new:
                break
            if not self.sampling and width > 1:  # the cache follows the chosen hypotheses
                for keys, values, n in cache:  # (only the filled part moves)
                    keys[:, :, :n] = keys[origin, :, :n]
                    values[:, :, :n] = values[origin, :, :n]
            logits, _ = _step(w, tokens[:, None], prompt_len + step, cache, cross)
            last = logits[:, -1].float()
            step += 1
        results = []
        for b in range(batch):
            # the length ran out before enough hypotheses ended: the live ones compete with those that ended
            if not done[b]:
                for r in range(b * width, (b + 1) * width):
                    if scores[r] != float("-inf"):
                        seq = [t for t in sequences[r].tolist() if t != self.eot]
                        s = float(scores[r])
                        finished[b].append((s / max(1, len(seq)) ** self.length_penalty, seq, s))
            best = max(finished[b], key=lambda f: f[0]) if finished[b] else (0.0, [], 0.0)
            results.append(
                GenerationResult(sequences_ids=[best[1]], scores=[best[0]], no_speech_prob=no_speech[b])
            )
        return results

    def _adjust(self, logits: torch.Tensor, sequences: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        logits = logits.masked_fill(mask, float("-inf"))
        if self.repetition_penalty != 1.0 and sequences.shape[1]:
            seen = torch.gather(logits, 1, sequences)
            seen = torch.where(seen < 0, seen * self.repetition_penalty, seen / self.repetition_penalty)
            logits = logits.scatter(1, sequences, seen)
        return logits

    def _sample(self, logits, sequences, mask, generator) -> torch.Tensor:
        logits = self._adjust(logits, sequences, mask) / self.temperature
        if self.topk > 1:
            kth = logits.topk(self.topk, dim=-1).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        return torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator)[:, 0]


def _median_filter(x: np.ndarray, width: int) -> np.ndarray:
    """Median over ``width`` frames along the last axis (edges reflected), as openai-whisper filters."""
    if width <= 1 or x.shape[-1] <= width // 2:
        return x
    pad = width // 2
    padded = np.pad(x, [(0, 0)] * (x.ndim - 1) + [(pad, pad)], mode="reflect")
    windows = np.lib.stride_tricks.sliding_window_view(padded, width, axis=-1)
    return np.median(windows, axis=-1)


def _dtw(cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The cheapest monotonic path through ``cost`` (tokens x frames): (token index, frame index) arrays. The
    table is filled one anti-diagonal at a time (every cell of one depends only on the two before it)."""
    n, m = cost.shape
    total = np.full((n + 1, m + 1), np.inf)
    total[0, 0] = 0.0
    trace = np.zeros((n + 1, m + 1), dtype=np.int8)
    for d in range(2, n + m + 1):
        i = np.arange(max(1, d - m), min(n, d - 1) + 1)
        j = d - i
        options = np.stack([total[i - 1, j - 1], total[i - 1, j], total[i, j - 1]])
        k = options.argmin(axis=0)
        total[i, j] = cost[i - 1, j - 1] + options[k, np.arange(len(i))]
        trace[i, j] = k
    i, j = n, m
    path = []
    while i > 0 and j > 0:
        path.append((i - 1, j - 1))
        k = trace[i, j]
        if k == 0:
            i, j = i - 1, j - 1
        elif k == 1:
            i -= 1
        else:
            j -= 1
    path.reverse()
    arr = np.array(path)
    return arr[:, 0], arr[:, 1]


# -- what the ASR stage holds: whisperX's pipeline, in its shape ----------------------------------------------


@dataclass
class Options:
    """The decoding options of whisperX's pipeline (its defaults), read by the ASR stage."""

    beam_size: int = 5
    best_of: int = 5
    patience: float = 1.0
    length_penalty: float = 1.0
    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0
    temperatures: list[float] = field(default_factory=lambda: [0.0, 0.2, 0.4, 0.6, 0.8, 1.0])
    compression_ratio_threshold: float | None = 2.4
    log_prob_threshold: float | None = -1.0
    no_speech_threshold: float | None = 0.6
    initial_prompt: str | None = None
    prefix: str | None = None
    hotwords: str | None = None
    suppress_blank: bool = True
    suppress_tokens: list[int] = field(default_factory=lambda: [-1])
    without_timestamps: bool = True


class TorchWhisperModel:
    """What faster-whisper's ``WhisperModel`` offers the stage: ``model`` (here a :class:`TorchWhisper`), the
    tokenizer, the prompt and the encoder."""

    max_length = 448

    def __init__(self, whisper: TorchWhisper):
        self.model = whisper
        self.hf_tokenizer = whisper._tokenizer
        self.feat_kwargs = {"feature_size": whisper.n_mels}

    def tokenizer(self, language: str | None, task: str = "transcribe") -> WhisperTokenizer:
        return WhisperTokenizer(self.hf_tokenizer, self.model.is_multilingual, task=task, language=language)

    def features(self, pieces: list[np.ndarray]) -> torch.Tensor:
        return self.model.features(pieces)

    def encode(self, features) -> torch.Tensor:
        return self.model.encode(features)

    def get_prompt(
        self,
        tokenizer: WhisperTokenizer,
        previous_tokens: list[int],
        without_timestamps: bool = False,
        prefix: str | None = None,
        hotwords: str | None = None,
    ) -> list[int]:
        """Whisper's prompt: earlier text (or hotwords) after ``<|startofprev|>``, then the start sequence."""
        prompt: list[int] = []
        half = self.max_length // 2 - 1
        if previous_tokens or (hotwords and not prefix):
            prompt.append(tokenizer.sot_prev)
            if hotwords and not prefix:
                prompt.extend(tokenizer.encode(" " + hotwords.strip())[:half])
            if previous_tokens:
                prompt.extend(previous_tokens[-half:])
        prompt.extend(tokenizer.sot_sequence)
        if without_timestamps:
            prompt.append(tokenizer.no_timestamps)
        if prefix:
            if not without_timestamps:
                prompt.append(tokenizer.timestamp_begin)
            prompt.extend(tokenizer.encode(" " + prefix.strip())[:half])
        return prompt


class TorchPipeline:
    """The ASR stage's model on the torch runtime, in the shape of whisperX's ``FasterWhisperPipeline``: the
    Whisper model, the decoding options and the voice activity detection.

    VAD: whisperX's (pyannote segmentation, its weights ship inside whisperx), so both runtimes cut the same
    windows; where whisperX is not installed (a bare GPU image), fixed windows of ``chunk_size`` seconds over the
    whole input, with :attr:`vad_note` saying so."""

    def __init__(self, whisper: TorchWhisper, options: Options, device: str):
        self.model = TorchWhisperModel(whisper)
        self.options = options
        self.vad_note: str | None = None
        self._vad_params = {"vad_onset": 0.500, "vad_offset": 0.363, "chunk_size": 30}
        try:
            from whisperx.vads import Pyannote
        except ImportError as exc:
            self.vad_model = None
            self.vad_note = f"whisperX is not installed ({exc}): no voice activity detection, fixed windows"
            self.speech_windows = fixed_windows
        else:
            self.vad_model = Pyannote(torch.device(device), token=None, **self._vad_params)

    def detect_language(self, samples: np.ndarray) -> str:
        """The likeliest language of the first 30 s (whisperX's own guess)."""
        whisper = self.model.model
        best = whisper.detect_language(whisper.encode(whisper.features([samples[:N_SAMPLES]])))[0][0]
        return best[0][2:-2]


def fixed_windows(samples: np.ndarray, chunk_size: int) -> list[tuple[float, float]]:
    """Windows of ``chunk_size`` seconds over the whole of ``samples`` (no voice activity detection)."""
    duration = len(samples) / SAMPLE_RATE
    starts = np.arange(0.0, duration, float(chunk_size))
    return [(float(s), float(min(duration, s + chunk_size))) for s in starts if duration - s > 0.1]
