"""Word timing from Whisper's own cross-attention (CTranslate2 ``Whisper.align``).

The transcript's text is forced through the decoder of the same CTranslate2 model
that produced it; CTranslate2 runs dynamic time warping over the alignment heads'
cross-attention and returns, for every text token, the encoder frame (20 ms) where
it is attended to, plus the token's probability. A word starts at the frame of its
first token and ends where the next word (or end-of-text) starts; its confidence is
the mean probability of its tokens. Segments (at most one 30 s window each, the ASR
stage's VAD windows) go through the model ``batch_size`` at a time.

Used by the alignment stage (child side); imports ctranslate2 and faster_whisper.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import ctranslate2
import numpy as np
import tokenizers
from faster_whisper.feature_extractor import FeatureExtractor
from faster_whisper.tokenizer import Tokenizer

from contracts import Segment, Word

log = logging.getLogger(__name__)

SAMPLE_RATE = 16_000
HOP = 160
#: Whisper's window
WINDOW_S = 30
#: encoder frames per second (mel frames are 10 ms, the encoder halves them)
FRAMES_PER_S = SAMPLE_RATE / HOP / 2


def model_directory(model: str) -> str:
    """The CTranslate2 directory of the ASR model: a path as recorded, else the local hub cache (never a download)."""
    if Path(model).is_dir():
        return model
    from faster_whisper.utils import download_model

    return download_model(model, local_files_only=True)


class WhisperAligner:
    def __init__(self, model: str, language: str, device: str, compute_type: str):
        path = model_directory(model)
        dev, _, index = device.partition(":")
        self.model = ctranslate2.models.Whisper(path, device=dev, device_index=int(index or 0),
                                                compute_type=compute_type, intra_threads=os.cpu_count() or 1)
        multilingual = self.model.is_multilingual
        self.tokenizer = Tokenizer(tokenizers.Tokenizer.from_file(str(Path(path) / "tokenizer.json")), multilingual,
                                   task="transcribe", language=language if multilingual else None)
        self.features = FeatureExtractor(feature_size=self.model.n_mels)
        log.info("whisper aligner: %s on %s (%s)", path, device, compute_type)

    def align(self, samples: np.ndarray, segments: list[Segment], batch_size: int) -> list[Segment]:
        """The segments with timed words (start, end, confidence) and start/end from their words."""
        out: list[Segment] = []
        for first in range(0, len(segments), max(1, batch_size)):
            out.extend(self._batch(samples, segments[first:first + max(1, batch_size)]))
        return [s.model_copy(update={"id": n}) for n, s in enumerate(out)]

    def _batch(self, samples: np.ndarray, batch: list[Segment]) -> list[Segment]:
        n = WINDOW_S * SAMPLE_RATE
        mels, frames, tokens = [], [], []
        for seg in batch:
            piece = samples[int(seg.start * SAMPLE_RATE):int(seg.end * SAMPLE_RATE)][:n]
            mel = self.features(piece, padding=n)[:, : n // HOP]
            mels.append(mel)
            frames.append(max(1, len(piece) // HOP))
            tokens.append(self.tokenizer.encode(" " + seg.text.strip()))
        features = ctranslate2.StorageView.from_array(np.ascontiguousarray(np.stack(mels).astype(np.float32)))
        results = self.model.align(features, self.tokenizer.sot_sequence, tokens, frames)
        return [self._words(seg, toks, res) for seg, toks, res in zip(batch, tokens, results)]

    def _words(self, seg: Segment, tokens: list[int], result) -> Segment:
        words, word_tokens = self.tokenizer.split_to_word_tokens(tokens + [self.tokenizer.eot])
        # the frame where each text token (and the final end-of-text) is first attended to
        first_frame: dict[int, int] = {}
        for text_index, time_index in result.alignments:
            first_frame.setdefault(int(text_index), int(time_index))
        probs = list(result.text_token_probs)
        timed: list[Word] = []
        position = 0
        last = 0.0
        for word, toks in zip(words, word_tokens):
            begin, end = position, position + len(toks)
            position = end
            if word == "" or toks == [self.tokenizer.eot]:
                continue
            start_f = first_frame.get(begin)
            end_f = first_frame.get(end, first_frame.get(len(tokens)))
            start = seg.start + (start_f / FRAMES_PER_S if start_f is not None else last - seg.start)
            stop = seg.start + end_f / FRAMES_PER_S if end_f is not None else seg.end
            start = min(max(start, seg.start, last), seg.end)
            stop = min(max(stop, start), seg.end)
            last = start
            p = probs[begin:end]
            timed.append(Word(word=word.strip(), start=round(start, 3), end=round(stop, 3),
                              score=round(float(np.mean(p)), 3) if p else None))
        timed = attach_punctuation([w for w in timed if w.word])
        if not timed:
            return seg
        return seg.model_copy(update={"words": timed, "start": timed[0].start,
                                      "end": max(timed[-1].end, timed[0].start)})


def attach_punctuation(words: list[Word]) -> list[Word]:
    """Punctuation the tokenizer split off ("roads", "?") joined to the word before it (its time stays the word's)."""
    out: list[Word] = []
    for w in words:
        if out and not any(ch.isalnum() for ch in w.word):
            out[-1] = out[-1].model_copy(update={"word": out[-1].word + w.word})
        else:
            out.append(w)
    return out
