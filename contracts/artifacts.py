"""Artifacts: what one stage writes for one input and the next stage reads.

Each artifact is a JSON file; bulky arrays live in a ``.npy`` sidecar next to
it whose sha256 the artifact records. Every artifact records what really
happened (model actually used, batch size, device, fallbacks), so an output
can be explained afterwards.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

#: bumped whenever an artifact's meaning changes; older files are redone
SCHEMA_VERSION = 1

Sha256 = Field(pattern=r"^[0-9a-f]{64}$")


def _now() -> datetime:
    return datetime.now(UTC)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Artifact(Strict):
    """Fields every artifact carries."""

    schema_version: Literal[1] = SCHEMA_VERSION
    #: the input (video/audio) this artifact was made for
    item_id: str = Field(min_length=1)
    #: hash of the upstream artifact and the settings that produced this one;
    #: the orchestrator reuses an artifact only when it matches
    fingerprint: str = Field(min_length=1)
    created_at: datetime = Field(default_factory=_now)


class Provenance(Strict):
    """What really ran to make an artifact, so an output can be explained afterwards. The artifacts of the
    model stages inherit it: its fields sit at the top level of their JSON, beside the artifact's own
    (``stages.runtime.base.Stage.provenance`` fills them, with ``fallback_reason`` and ``batch_size`` where an
    artifact records those too)."""

    #: the model actually loaded (a path or a hub name; after any fallback)
    model: str
    #: what the settings asked for ("embedded", "auto", a profile's model, a name or a path)
    requested_model: str
    #: where it ran: "cpu", "cuda" or "cuda:N"
    device: str


class SidecarArtifact(Artifact):
    """An artifact whose arrays live in a ``.npy`` sidecar next to it, checked by sha256 on every read."""

    source: str
    sidecar: str = Field(pattern=r"^[^/\\]+\.npy$")
    sha256: str = Sha256


#: the audio stage also writes a compressed copy (Ogg Opus) of what it decoded beside its artifact under
#: this name; the parent keeps it for the transcript page (``orchestrator.layout.LISTEN``)
LISTEN_COPY = "listen.ogg"


#: how the audio stage treats a source's channels (``PIPELINE_CHANNELS``): "mix" them to mono (the one track),
#: transcribe each as its own track ("separate"), or separate only when they hold different speech ("auto";
#: docs/channels.md)
ChannelMode = Literal["mix", "separate", "auto"]


class ChannelTrack(Strict):
    """One channel of a separated source: its 16 kHz float32 samples in a ``.npy`` sidecar of its own."""

    #: the channel's index in the source (0: the first, left of a stereo file)
    channel: int = Field(ge=0)
    sidecar: str = Field(pattern=r"^[^/\\]+\.npy$")
    sha256: str = Sha256


class ChannelMeasure(Strict):
    """What the audio stage measured to tell whether a source's channels hold different speech, over 20 ms
    frames (``stages.audio.measure_channels``)."""

    #: per channel: seconds of frames with sound (10 dB above the channel's own floor, above -60 dBFS)
    active_s: list[float]
    #: per channel: the share of its frames with sound in which it is alone (every other channel silent
    #: or 20 dB quieter): 0 for copies of one signal, most of it for one speaker per channel
    alone: list[float]
    #: the highest correlation between two channels' levels (dB, frame by frame) over the frames where either
    #: has sound (1: copies, even at another gain; high: one sound on both, a music bed; near or below 0: a
    #: speaker per channel); None: fewer than two channels with sound
    correlation: float | None = None


class AudioArtifact(SidecarArtifact):
    """Decoded audio: 16 kHz mono float32 samples in a ``.npy`` sidecar (the mix of the source's channels),
    and, when the channels were separated, one sidecar per channel (``channel_tracks``)."""

    kind: Literal["audio"] = "audio"
    source_size: int = Field(ge=0)
    sample_rate: Literal[16000] = 16000
    num_samples: int = Field(gt=0)
    duration_s: float = Field(gt=0)
    #: what the source held, before resampling/downmixing
    source_codec: str
    source_sample_rate: int = Field(gt=0)
    source_channels: int = Field(gt=0)
    #: how long the container says the stream is (None: it does not say)
    expected_duration_s: float | None = None
    #: set when only part of the stream decoded: "decoded 4.9 s of 10.8 s (Invalid data found ...)"
    damage: str | None = None
    #: which audio stream was decoded (its index in the container; the one marked default, else the
    #: first) and how many audio streams the source has
    source_stream: int = Field(default=0, ge=0)
    audio_streams: int = Field(default=1, ge=1)
    #: said when the source had a choice: "2 audio tracks: decoded stream 2 (marked default)"
    track: str | None = None
    #: ``PIPELINE_CHANNELS`` as asked for this input
    channel_mode: ChannelMode = "mix"
    #: the channels' measure (None: not measured: "mix", or a source of one channel)
    channel_measure: ChannelMeasure | None = None
    #: what was decided and why: "separated: ..." or "mixed: ..." (None: "mix", or one channel)
    channel_decision: str | None = None
    #: the channels transcribed as their own tracks (empty: the mix is the one track)
    channel_tracks: list[ChannelTrack] = Field(default_factory=list)

    @model_validator(mode="after")
    def _duration_matches(self) -> AudioArtifact:
        if abs(self.num_samples / self.sample_rate - self.duration_s) > 1e-3:
            raise ValueError("duration_s does not match num_samples / sample_rate")
        return self


class Word(Strict):
    word: str
    start: float | None = None
    end: float | None = None
    #: the aligner's confidence in the word, 0..1 (wav2vec2: its score; Whisper: mean token probability)
    score: float | None = None
    speaker: str | None = None
    #: the other voices the diarization has during this word (two people at once); set in the files written
    #: from the artifacts (``orchestrator.corpus.speakers.overlaps``), None in the artifacts themselves
    overlap: list[str] | None = None


class Segment(Strict):
    id: int = Field(ge=0)
    start: float = Field(ge=0)
    end: float = Field(ge=0)
    text: str
    words: list[Word] | None = None
    speaker: str | None = None
    #: the other voices heard during this segment (see :attr:`Word.overlap`)
    overlap: list[str] | None = None
    #: the source channel it was transcribed from when the channels were separated (None: the mix)
    channel: int | None = Field(None, ge=0)
    #: the language this segment was decoded in (its words' too); None: the transcript's ``language``
    #: (artifacts written before languages were identified per speech region)
    language: str | None = None

    @model_validator(mode="after")
    def _ordered(self) -> Segment:
        if self.end < self.start:
            raise ValueError(f"segment {self.id} ends ({self.end}) before it starts ({self.start})")
        return self


class LanguageScore(Strict):
    language: str
    probability: float = Field(ge=0, le=1)


class LanguageId(Strict):
    """What language identification found for one input (stages/whisper/language.py)."""

    #: detected: from the speech; forced: ASR_LANGUAGE; undetermined: too little speech or too uncertain;
    #: not_detectable: the model is English-only and cannot tell
    status: Literal["detected", "forced", "undetermined", "not_detectable"]
    #: the identified language (None: undetermined / not detectable)
    language: str | None = None
    probability: float | None = Field(None, ge=0, le=1)
    #: the most probable languages, best first (within the allowed set when one was given)
    top: list[LanguageScore] = Field(default_factory=list)
    #: seconds of speech found by the VAD, and how many speech windows were scored
    speech_s: float = Field(0.0, ge=0)
    windows: int = Field(0, ge=0)
    #: the allowed set (``--languages``), empty: any
    allowed: list[str] = Field(default_factory=list)
    reason: str | None = None
    #: a scored window, or a speech region inside one, is confidently of another language than the best:
    #: each speech region was identified on its own (stages/whisper/language.py)
    mixed: bool = False
    #: speech regions identified one by one (0: none, the input is clearly of one language)
    regions: int = Field(0, ge=0)


class LanguageShare(Strict):
    """Seconds of a transcript's segments decoded in one language."""

    language: str
    seconds: float = Field(ge=0)


def terms_sha256(terms: list[str]) -> str:
    """What names a vocabulary file's terms (their list, in order): where a work item sends them by reference
    and an artifact records which were read."""
    return hashlib.sha256(json.dumps(terms, ensure_ascii=False).encode()).hexdigest()


class VocabularyFile(Strict):
    """A vocabulary file the parent found for an input: names and terms, one a line.

    The parent reads its terms; a work item names them by reference (``terms_file``, ``sha256``), and an
    artifact records only ``sha256`` and ``count`` (artifacts written before kept ``terms`` themselves)."""

    #: "folder": ``vocabulary.txt`` of the nearest folder above the input; "input": ``<input>.vocabulary.txt``
    level: Literal["folder", "input"]
    path: str
    #: the first ``orchestrator.planning.vocabulary.MAX_TERMS`` names and terms, in file order (empty: the
    #: file holds none and switches off the folders' above it, or they are in ``terms_file``; in an artifact,
    #: see ``count``)
    terms: list[str] = Field(default_factory=list)
    #: how many more the file holds, not read
    left_out: int = Field(0, ge=0)
    #: how many terms were read (None: ``terms`` holds them)
    count: int | None = Field(None, ge=0)
    #: :func:`terms_sha256` of the terms read
    sha256: str | None = None
    #: the run's file of these terms (a JSON list, named by ``sha256``), written once a run by the parent
    terms_file: str | None = None


class VocabularyUse(Strict):
    """What an input's Whisper prompt (the text before every window) was made of, and what of it was applied.

    Joined in this order: the run's initial prompt, the run's hotwords, the folder's terms, the input's terms;
    over Whisper's prompt budget the most general entries are left out first (``note`` says which)."""

    prompt: str | None = None
    hotwords: list[str] = Field(default_factory=list)
    files: list[VocabularyFile] = Field(default_factory=list)
    #: the text decoded before every window (after the budget)
    applied: str
    #: its length in Whisper tokens
    tokens: int = Field(ge=0)
    note: str | None = None


class TranscriptArtifact(Provenance, Artifact):
    kind: Literal["transcript"] = "transcript"
    source: str
    language: str
    segments: list[Segment]
    compute_type: str
    batch_size: int = Field(ge=1)
    #: what ran Whisper: "ctranslate2" or "torch" (None: not recorded, written before the runtime was)
    runtime: str | None = None
    #: why that runtime ran where the settings said "auto" and it was not CTranslate2
    runtime_note: str | None = None
    #: word-level alignment ran (``aligner`` names it); False: segment timestamps only
    aligned: bool = False
    duration_s: float = Field(ge=0)
    #: the aligner that ran, or why none did (model not available offline, ...); in the ASR stage's
    #: transcript (``asr.json``): "whisper-cross-attention:<model>" when its segments carry words timed
    #: as they were decoded (``aligned`` stays False there: the alignment stage decides)
    aligner: str | None = None
    alignment_note: str | None = None
    #: what named the speakers: the diarization model and the speaker encoder that matched voice
    #: profiles (None: that step did not run)
    diarization: str | None = None
    speaker_encoder: str | None = None
    #: why segments carry no speaker or only cluster labels (fast path, skipped enrollment, ...)
    speakers_note: str | None = None
    #: the source was damaged: only part of it was transcribed (the audio artifact's ``damage``)
    source_damage: str | None = None
    #: the source had several audio tracks: which one was transcribed (the audio artifact's ``track``)
    source_track: str | None = None
    #: the speech windows that were decoded (VAD pieces after stages.whisper.speech.clean_pieces; None: not recorded)
    speech: list[tuple[float, float]] | None = None
    #: why there are no segments (no speech found), or other notes on what was decoded
    speech_note: str | None = None
    #: decoded segments dropped as not speech (outside the detected speech, or scored as non-speech)
    dropped_segments: int = Field(0, ge=0)
    #: language identification (None: artifacts written before it existed)
    language_id: LanguageId | None = None
    #: seconds of segments per language, most first (``language`` is the first); None: not recorded
    languages: list[LanguageShare] | None = None
    #: the input holds several languages, each segment decoded in its own (segment ``language``)
    languages_note: str | None = None
    #: the vocabulary decoded with (run prompt and hotwords, folder and input files; None: none)
    vocabulary: VocabularyUse | None = None
    #: the English translation (``translate``, inputs not in English): one segment per decoded window, in
    #: the input's time, without words; the final transcript gives each its window's main speaker
    translation: list[Segment] | None = None

    @model_validator(mode="after")
    def _ids(self) -> TranscriptArtifact:
        if [s.id for s in self.segments] != list(range(len(self.segments))):
            raise ValueError("segment ids must be 0..n-1 in order")
        return self


class EmbeddingsArtifact(Provenance, SidecarArtifact):
    """One embedding per transcript segment, rows in segment order."""

    kind: Literal["embeddings"] = "embeddings"
    #: what was asked for: a profile ("speed", "quality") or a model name
    profile: str
    #: why the requested model was not used, when it was not
    fallback_reason: str | None = None
    dimension: int = Field(gt=0)
    count: int = Field(ge=0)
    normalized: bool
    batch_size: int = Field(ge=1)
    dtype: Literal["float32"] = "float32"
    #: the text's language is not one the model was trained for (None: it is, or unknown)
    language_note: str | None = None


class SpeakerTurn(Strict):
    start: float = Field(ge=0)
    end: float = Field(ge=0)
    #: cluster label, ``SPEAKER_00``, ``SPEAKER_01``, ... in order of first appearance
    speaker: str = Field(pattern=r"^SPEAKER_\d{2,}$")

    @model_validator(mode="after")
    def _ordered(self) -> SpeakerTurn:
        if self.end <= self.start:
            raise ValueError(f"turn ends ({self.end}) before it starts ({self.start})")
        return self


class DiarizationArtifact(Provenance, Artifact):
    """Who spoke when: turns labelled with anonymous clusters. Its ``model`` is the pipeline actually used:
    "pyannote:<model>" (through whisperx) or "embedded:<segmentation>+<encoder>"; ``requested_model``: "auto",
    "embedded" or a pyannote pipeline name/path."""

    kind: Literal["diarization"] = "diarization"
    source: str
    turns: list[SpeakerTurn]
    #: why the requested pipeline was not used, when it was not
    fallback_reason: str | None = None
    min_speakers: int | None = Field(default=None, ge=1)
    max_speakers: int | None = Field(default=None, ge=1)
    duration_s: float = Field(ge=0)
    #: each speaker's voice: the L2-normalised mean of the diarizer's embeddings of that speaker's clips,
    #: kept for corpus speakers (``orchestrator.corpus.speakers``). None: the diarizer kept none (the pyannote
    #: pipeline; artifacts written before they were kept)
    voices: dict[str, list[float]] | None = None
    #: the encoder that made ``voices`` (kind:model, as in voice profiles); same-encoder vectors compare
    voice_encoder: str | None = None

    @property
    def speakers(self) -> list[str]:
        return sorted({t.speaker for t in self.turns})

    @model_validator(mode="after")
    def _sorted(self) -> DiarizationArtifact:
        if any(b.start < a.start for a, b in zip(self.turns, self.turns[1:])):
            raise ValueError("turns must be sorted by start time")
        if self.voices:
            unknown = set(self.voices) - set(self.speakers)
            if unknown:
                raise ValueError(f"voices of speakers without turns: {sorted(unknown)}")
            if len({len(v) for v in self.voices.values()}) != 1 or self.voice_encoder is None:
                raise ValueError("voices must share one dimension and name their encoder")
            for label, vector in self.voices.items():
                require_unit(vector, f"voice of {label}")
        return self


def require_unit(vector: list[float], what: str) -> None:
    norm = sum(x * x for x in vector) ** 0.5
    if abs(norm - 1.0) > 1e-3:
        raise ValueError(f"{what} must be L2-normalised (norm {norm:.4f})")


class ProfileClip(Strict):
    path: str
    sha256: str = Sha256
    duration_s: float = Field(gt=0)
    embedding: list[float] = Field(min_length=1)


class VoiceProfile(Artifact):
    """An enrolled voice: ``pipeline enroll NAME clip...`` writes one per name into the profiles directory."""

    kind: Literal["voice_profile"] = "voice_profile"
    #: the name given to segments whose voice matches
    name: str = Field(min_length=1)
    #: encoder kind ("campplus", "ecapa") and the model actually loaded; only same-kind vectors compare
    encoder: str
    encoder_model: str
    dimension: int = Field(gt=0)
    #: mean of the clips' L2-normalised embeddings, L2-normalised again
    embedding: list[float]
    clips: list[ProfileClip] = Field(min_length=1)
    #: cosine similarity at or above which a speaker is given this name
    threshold: float = Field(ge=-1, le=1)

    @model_validator(mode="after")
    def _shapes(self) -> VoiceProfile:
        if len(self.embedding) != self.dimension or any(
            len(c.embedding) != self.dimension for c in self.clips
        ):
            raise ValueError(f"every embedding must have {self.dimension} values")
        require_unit(self.embedding, "embedding")
        for clip in self.clips:
            require_unit(clip.embedding, f"embedding of {clip.path}")
        return self


class SpeakerMatch(Strict):
    """One diarization cluster compared with the voice profiles."""

    speaker: str
    #: seconds of this speaker's speech that were embedded
    seconds: float = Field(ge=0)
    #: best-matching profile and its similarity (None: no profile to compare)
    profile: str | None = None
    similarity: float | None = Field(default=None, ge=-1.0001, le=1.0001)
    threshold: float | None = None
    #: the enrolled name given to this speaker, when the similarity passes the profile's threshold
    name: str | None = None


class SpeakerEmbeddingsArtifact(SidecarArtifact):
    """Speaker embeddings of each diarization turn (rows of the ``.npy`` sidecar) and the profile matches."""

    kind: Literal["speaker_embeddings"] = "speaker_embeddings"
    #: encoder kind and the model actually loaded
    encoder: str
    encoder_model: str
    dimension: int = Field(gt=0)
    #: index into the diarization's turns of each row (short turns are left out)
    turn_rows: list[int]
    matches: list[SpeakerMatch]
    #: names of the profiles compared (profiles of another encoder are left out, and listed in the log)
    profiles: list[str]
    device: str
    batch_size: int = Field(ge=1)
    dtype: Literal["float32"] = "float32"

    @model_validator(mode="after")
    def _names_unique(self) -> SpeakerEmbeddingsArtifact:
        named = [m.name for m in self.matches if m.name]
        if len(named) != len(set(named)):
            raise ValueError("an enrolled name can be given to one speaker only")
        return self
