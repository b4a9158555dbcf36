"""Word timing from Whisper's own cross-attention (CTranslate2 ``Whisper.align``).

The transcript's text is forced through the decoder of the same CTranslate2 model
that produced it; CTranslate2 runs dynamic time warping over the alignment heads'
cross-attention and returns, for every text token, the encoder frame (20 ms) where
it is attended to, plus the token's probability. A word starts at the frame of its
first token and ends where the next word (or end-of-text) starts; its confidence is
the mean probability of its tokens. Segments (at most one 30 s window each, the ASR
stage's VAD windows) go through the model ``batch_size`` at a time, in batches of
similar length whose encoder input ends 1 s after the longest segment: CTranslate2's
encoder takes inputs shorter than 30 s (tiny.en, int8, 2 CPU cores: 0.24 s for 30 s,
0.055 s for 15 s), and the word times stay within a frame or two of the padded ones.

Used by the alignment stage (child side), which imports ctranslate2 and faster_whisper; the ASR stage's
torch runtime uses :func:`timed_words` alone.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np

from contracts import Segment, Word
from stages.runtime.clock import model_time

log = logging.getLogger(__name__)

SAMPLE_RATE = 16_000
HOP = 160
#: Whisper's window
WINDOW_S = 30
#: encoder frames per second (mel frames are 10 ms, the encoder halves them)
FRAMES_PER_S = SAMPLE_RATE / HOP / 2
#: how transcripts name this aligner (``<WORD_TIMING>:<the ASR model as requested>``)
WORD_TIMING = "whisper-cross-attention"
#: audio after a batch's longest segment given to the encoder (a negative value: Whisper's full 30 s)
MARGIN_S = 1.0


def model_directory(model: str) -> str:
    """The CTranslate2 directory of the ASR model: a path as recorded, else the local hub cache (never a download)."""
    if Path(model).is_dir():
        return model
    from faster_whisper.utils import download_model

    return download_model(model, local_files_only=True)


class WhisperAligner:
    def __init__(self, model: str, language: str, device: str, compute_type: str):
        import ctranslate2
        import tokenizers
        from faster_whisper.feature_extractor import FeatureExtractor
        from faster_whisper.tokenizer import Tokenizer

        self._storage = ctranslate2.StorageView.from_array
        path = model_directory(model)
        dev, _, index = device.partition(":")
        self.model = ctranslate2.models.Whisper(
            path,
            device=dev,
            device_index=int(index or 0),
            compute_type=compute_type,
            intra_threads=os.cpu_count() or 1,
        )
        multilingual = self.model.is_multilingual
        self.tokenizer = Tokenizer(
            tokenizers.Tokenizer.from_file(str(Path(path) / "tokenizer.json")),
            multilingual,
            task="transcribe",
            language=language if multilingual else None,
        )
        self.features = FeatureExtractor(feature_size=self.model.n_mels)
        log.info("whisper aligner: %s on %s (%s)", path, device, compute_type)

    def align(self, samples: np.ndarray, segments: list[Segment], batch_size: int) -> list[Segment]:
        """The segments with timed words (start, end, confidence) and start/end from their words.

        Segments go through the model in batches of similar length (shortest first), each batch's
        mel cut to its longest segment plus ``MARGIN_S`` instead of Whisper's padded 30 s: the
        encoder's cost grows with its input, and the timings stay those of the padded window
        (bench/alignment.py prints the difference)."""
        size = max(1, batch_size)
        order = sorted(range(len(segments)), key=lambda k: segments[k].end - segments[k].start)
        timed: dict[int, Segment] = {}
        for first in range(0, len(order), size):
            chosen = order[first : first + size]
            for k, seg in zip(chosen, self._batch(samples, [segments[k] for k in chosen])):
                timed[k] = seg
        return [timed[k].model_copy(update={"id": k}) for k in range(len(segments))]

    def _batch(self, samples: np.ndarray, batch: list[Segment]) -> list[Segment]:
        n = WINDOW_S * SAMPLE_RATE
        pieces = [samples[int(seg.start * SAMPLE_RATE) : int(seg.end * SAMPLE_RATE)][:n] for seg in batch]
        width = n if MARGIN_S < 0 else min(n, max(len(p) for p in pieces) + int(MARGIN_S * SAMPLE_RATE))
        width = min(n, -(-width // (2 * HOP)) * 2 * HOP)  # whole encoder frames
        mels, frames, tokens = [], [], []
        for seg, piece in zip(batch, pieces):
            mels.append(self.features(piece, padding=width)[:, : width // HOP])
            frames.append(max(1, len(piece) // HOP))
            tokens.append(self.tokenizer.encode(" " + seg.text.strip()))
        features = self._storage(np.ascontiguousarray(np.stack(mels).astype(np.float32)))
        with model_time():
            results = self.model.align(features, self.tokenizer.sot_sequence, tokens, frames)
        return [self._words(seg, toks, res) for seg, toks, res in zip(batch, tokens, results)]

    def _words(self, seg: Segment, tokens: list[int], result) -> Segment:
        return with_words(seg, timed_words(self.tokenizer, tokens, result, seg.start, seg.end))


def timed_words(tokenizer, tokens: list[int], result, start_s: float, end_s: float) -> list[Word]:
    """The words of ``tokens`` (text tokens, no special ones) timed from one ``Whisper.align`` result of the
    window that starts at ``start_s`` (and whose speech ends at ``end_s``): seconds, and the mean probability
    of each word's tokens as its confidence. Shared by this aligner and the ASR stage, which aligns over the
    encoder output it has just decoded."""
    words, word_tokens = tokenizer.split_to_word_tokens(tokens + [tokenizer.eot])
    # the frame where each text token (and the final end-of-text) is first attended to
    first_frame: dict[int, int] = {}
    for text_index, time_index in result.alignments:
        first_frame.setdefault(int(text_index), int(time_index))
    probs = list(result.text_token_probs)
    timed: list[Word] = []
    position = 0
    last = start_s
    for word, toks in zip(words, word_tokens):
        begin, end = position, position + len(toks)
        position = end
        if word == "" or toks == [tokenizer.eot]:
            continue
        start_f = first_frame.get(begin)
        end_f = first_frame.get(end, first_frame.get(len(tokens)))
        start = start_s + start_f / FRAMES_PER_S if start_f is not None else last
        stop = start_s + end_f / FRAMES_PER_S if end_f is not None else end_s
        start = min(max(start, start_s, last), end_s)
        stop = min(max(stop, start), end_s)
        last = start
        p = probs[begin:end]
        timed.append(
            Word(
                word=word.strip(),
                start=round(start, 3),
                end=round(stop, 3),
                score=round(float(np.mean(p)), 3) if p else None,
            )
        )
    return attach_punctuation([w for w in timed if w.word])


def with_words(seg: Segment, words: list[Word]) -> Segment:
    """``seg`` with its timed words, starting at its first word and ending at its last (unchanged without words)."""
    if not words:
        return seg
    return seg.model_copy(
        update={"words": words, "start": words[0].start, "end": max(words[-1].end, words[0].start)}
    )


def attach_punctuation(words: list[Word]) -> list[Word]:
    """Punctuation the tokenizer split off ("roads", "?") joined to the word before it (its time stays the word's)."""
    out: list[Word] = []
    for w in words:
        if out and not any(ch.isalnum() for ch in w.word):
            out[-1] = out[-1].model_copy(update={"word": out[-1].word + w.word})
        else:
            out.append(w)
    return out
