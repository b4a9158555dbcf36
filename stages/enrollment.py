"""Enrollment matching: speaker embeddings of each diarized turn, compared with the voice profiles.

Turns are embedded ``batch_size`` at a time (``VOICE_ENROLLMENT_BATCH_SIZE``,
seed 001: 4) with the configured encoder; each diarization cluster's
duration-weighted mean embedding is compared with every profile made with the
same encoder (cosine similarity). A cluster gets a profile's name when the
similarity reaches that profile's threshold; each name goes to one cluster at
most (the most similar).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from contracts import (
    Artifact,
    AudioArtifact,
    DiarizationArtifact,
    SpeakerEmbeddingsArtifact,
    SpeakerMatch,
    StageRequest,
    VoiceProfile,
    WorkItem,
    load_artifact,
    load_model,
    sha256_file,
)
from contracts.errors import ArtifactError, InputError
from contracts.stage_settings import EnrollmentSettings
from stages.runtime.base import Member, TorchStage, read_tracks, save_array

log = logging.getLogger(__name__)

SAMPLE_RATE = 16000
#: turns shorter than this are not embedded on their own (too little voice); a speaker with only short
#: turns is embedded from all of them joined
MIN_TURN_S = 0.5
#: long turns are cut to this, so one monologue does not dominate memory or time
MAX_TURN_S = 20.0
#: turns of several inputs are embedded together until this many batches' worth is collected
GROUP_BATCHES = 8


class EnrollmentStage(TorchStage):
    name = "enrollment"
    input = DiarizationArtifact
    input_key = "diarization"
    output = SpeakerEmbeddingsArtifact
    settings_model = EnrollmentSettings

    def import_libraries(self) -> None:
        global np, speaker_encoder
        import numpy as np

        import stages.voices.encoders as speaker_encoder

    def load(self, request: StageRequest, device: str) -> str:
        settings: EnrollmentSettings = self.settings
        self.kind = settings.encoder
        self.encoder = speaker_encoder.load_configured(settings, device)
        self.profiles = load_profiles(settings.profiles_dir, self.kind, settings.profiles)
        log.info(
            "enrollment: %d voice profile(s): %s",
            len(self.profiles),
            ", ".join(p.name for p in self.profiles),
        )
        return self.encoder.name

    packs_items = True

    def process(
        self, item: WorkItem, diarization: DiarizationArtifact, request: StageRequest
    ) -> SpeakerEmbeddingsArtifact:
        turns = self._turn_clips(item, diarization)
        return self._artifact(turns, self._embed(turns.clips))

    def process_packed(
        self, entries: Iterator[tuple[WorkItem, Artifact | str]], request: StageRequest
    ) -> Iterator[tuple[WorkItem, Artifact | BaseException]]:
        """The turns of successive inputs are embedded together (equal-length windows of several inputs share
        batches) until ``GROUP_BATCHES`` batches' worth is collected; the vectors are split back per input."""

        def prepare(item: WorkItem, diarization: DiarizationArtifact) -> Member:
            turns = self._turn_clips(item, diarization)
            return Member(item, turns.clips, turns.audio_s, turns)

        return self.pack_groups(
            request,
            entries,
            prepare,
            compute=self._embed,
            finish=lambda member, vectors: self._artifact(member.data, vectors),
            batches=GROUP_BATCHES,
        )

    def _embed(self, clips: list):
        if not clips:
            return np.zeros((0, int(self.encoder.dimension)), np.float32)
        return self.encoder.embed(clips, self.batch_size)

    def _turn_clips(self, item: WorkItem, diarization: DiarizationArtifact) -> _Turns:
        """``item``'s samples and the clips of its turns long enough to embed on their own."""
        try:
            audio = load_artifact(item.inputs["audio"], AudioArtifact)
        except (KeyError, ArtifactError) as exc:
            raise InputError(f"enrollment needs the decoded audio: {exc}") from exc
        samples = read_tracks(item, audio)[None]
        rows, clips = [], []
        for index, turn in enumerate(diarization.turns):
            if turn.end - turn.start >= MIN_TURN_S:
                rows.append(index)
                clips.append(_cut(samples, turn.start, min(turn.end, turn.start + MAX_TURN_S)))
        return _Turns(item, diarization, samples, rows, clips, audio.duration_s)

    def _artifact(self, turns: _Turns, vectors) -> SpeakerEmbeddingsArtifact:
        item, diarization, samples, rows = turns.item, turns.diarization, turns.samples, turns.rows
        speakers: dict[str, tuple[list, float]] = {}
        for row, index in enumerate(rows):
            turn = diarization.turns[index]
            vecs, seconds = speakers.setdefault(turn.speaker, ([], 0.0))
            vecs.append(vectors[row] * (turn.end - turn.start))
            speakers[turn.speaker] = (vecs, seconds + turn.end - turn.start)
        centroids = {}
        for label in diarization.speakers:
            if label in speakers:
                vecs, seconds = speakers[label]
                centroids[label] = (np.sum(vecs, axis=0), seconds)
            else:  # only short turns: embed them joined
                short = [t for t in diarization.turns if t.speaker == label]
                joined = np.concatenate([_cut(samples, t.start, t.end) for t in short])
                if joined.size >= SAMPLE_RATE // 4:
                    centroids[label] = (self.encoder.embed([joined], 1)[0], joined.size / SAMPLE_RATE)
        matches = match_speakers(centroids, self.profiles)
        for m in matches:
            log.info(
                "enrollment: %s %s -> %s (similarity %s, threshold %s)",
                item.id,
                m.speaker,
                m.name or "-",
                "-" if m.similarity is None else f"{m.similarity:.3f}",
                m.threshold,
            )
        dimension = int(self.encoder.dimension)
        sidecar = Path(item.output).with_suffix(".npy")
        digest = save_array(sidecar, np.asarray(vectors, np.float32).reshape(len(rows), dimension))
        return SpeakerEmbeddingsArtifact(
            item_id=item.id,
            fingerprint=item.fingerprint,
            source=diarization.source,
            sidecar=sidecar.name,
            sha256=digest,
            encoder=self.kind,
            encoder_model=self.encoder.name,
            dimension=dimension,
            turn_rows=rows,
            matches=matches,
            profiles=[p.name for p in self.profiles],
            **self.provenance(),
        )

    def close(self) -> None:
        self.encoder = None


@dataclass(eq=False)
class _Turns:
    """One input's turns to embed: the clips of the long-enough ones (``rows``: their turn indexes)."""

    item: WorkItem
    diarization: DiarizationArtifact
    samples: object
    rows: list[int]
    clips: list
    audio_s: float


def _cut(samples, start: float, end: float):
    return samples[int(start * SAMPLE_RATE) : int(end * SAMPLE_RATE)]


def load_profiles(
    directory: str | None, encoder: str, expected: dict[str, str] | None = None
) -> list[VoiceProfile]:
    """Every valid profile in ``directory`` made with ``encoder`` (others are logged and left out).

    ``expected`` (file stem -> sha256, what the parent fingerprinted): only those files are read, and a
    file that changed since the run was planned is left out with a warning, so the matching never uses
    profiles the artifact's fingerprint does not account for.
    """
    if not directory:
        return []
    profiles = []
    for path in sorted(Path(directory).glob("*.json")):
        if expected is not None:
            if path.stem not in expected:
                log.warning(
                    "enrollment: ignoring %s: added after the run was planned (rerun to use it)", path
                )
                continue
            if sha256_file(path) != expected[path.stem]:
                log.warning(
                    "enrollment: ignoring %s: changed after the run was planned (rerun to use it)", path
                )
                continue
        try:
            profile = load_model(path, VoiceProfile)
        except ArtifactError as exc:
            log.warning("enrollment: ignoring %s", exc)
            continue
        if profile.encoder != encoder:
            log.warning(
                "enrollment: ignoring profile %s: made with %s, this run embeds with %s (enroll again)",
                profile.name,
                profile.encoder,
                encoder,
            )
            continue
        profiles.append(profile)
    return profiles


def match_speakers(centroids: dict, profiles: list[VoiceProfile]) -> list[SpeakerMatch]:
    """Compare each speaker's centroid with each profile; give names where the threshold is passed.

    ``centroids`` maps a speaker label to (vector of any scale, seconds of speech). Each name goes to
    at most one speaker: pairs are taken from the most similar down.
    """
    import numpy as np

    labels = sorted(centroids)
    best: dict[str, tuple[VoiceProfile | None, float | None]] = {label: (None, None) for label in labels}
    pairs = []
    for label in labels:
        vec = np.asarray(centroids[label][0], dtype=np.float64)
        vec = vec / max(np.linalg.norm(vec), 1e-12)
        for profile in profiles:
            sim = float(vec @ np.asarray(profile.embedding, dtype=np.float64))
            pairs.append((sim, label, profile))
            if best[label][1] is None or sim > best[label][1]:
                best[label] = (profile, sim)
    named: dict[str, str] = {}
    taken: set[str] = set()
    for sim, label, profile in sorted(pairs, key=lambda p: -p[0]):
        if sim >= profile.threshold and label not in named and profile.name not in taken:
            named[label] = profile.name
            taken.add(profile.name)
    matches = []
    for label in labels:
        profile, sim = best[label]
        if label in named:  # report the profile that named it (not always the best one)
            profile = next(p for p in profiles if p.name == named[label])
            sim = next(s for s, lab, p in pairs if lab == label and p is profile)
        matches.append(
            SpeakerMatch(
                speaker=label,
                seconds=round(float(centroids[label][1]), 3),
                profile=profile.name if profile else None,
                similarity=None if sim is None else round(min(1.0, max(-1.0, sim)), 4),
                threshold=profile.threshold if profile else None,
                name=named.get(label),
            )
        )
    return matches


STAGE = EnrollmentStage()
