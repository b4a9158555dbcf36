"""``pipeline enroll NAME clip...``: one voice profile from a few clips of one speaker.

Each clip is decoded (any container, PyAV), embedded with the configured speaker
encoder, and the profile keeps every clip's L2-normalised embedding and their
mean, L2-normalised again, with the encoder actually used and the similarity
threshold at which a diarized speaker is given this name.
"""

from __future__ import annotations

import logging
from pathlib import Path

from contracts import InputError, ProfileClip, StageRequest, VoiceProfile, WorkItem, sha256_file
from contracts.stage_settings import DEFAULT_THRESHOLDS, VoiceProfileSettings
from stages.runtime.base import TorchStage

log = logging.getLogger(__name__)


class VoiceProfileStage(TorchStage):
    name = "voice_profile"
    input = None
    #: the first clip; the others are ``clip1``, ``clip2``, ... in the item's inputs
    input_key = "clip0"
    output = VoiceProfile
    settings_model = VoiceProfileSettings

    def import_libraries(self) -> None:
        global av, np, speaker_encoder, audio
        import av  # decoding, through stages.audio
        import numpy as np

        import stages.audio as audio
        import stages.voices.encoders as speaker_encoder

        audio.STAGE.import_libraries()

    def load(self, request: StageRequest, device: str) -> str:
        settings: VoiceProfileSettings = self.settings
        self.kind = settings.encoder
        self.encoder = speaker_encoder.load_configured(settings, device)
        threshold = settings.threshold
        self.threshold = float(DEFAULT_THRESHOLDS[self.kind] if threshold is None else threshold)
        return self.encoder.name

    def process(self, item: WorkItem, upstream: str, request: StageRequest) -> VoiceProfile:
        paths = [Path(item.inputs[key]) for key in sorted(item.inputs, key=_clip_number)]
        clips = []
        for path in paths:
            audio.check_readable(path)
            samples, _ = audio.decode(path)
            if samples.size < audio.SAMPLE_RATE // 2:
                raise InputError(f"clip shorter than 0.5 s: {path}")
            clips.append(samples)
        vectors = self.encoder.embed(clips, self.batch_size)
        mean = vectors.mean(axis=0)
        mean = mean / max(float(np.linalg.norm(mean)), 1e-12)
        spread = [float(v @ mean) for v in vectors]
        log.info(
            "voice_profile: %s from %d clip(s); clip-to-profile similarity %s",
            item.id,
            len(paths),
            ", ".join(f"{s:.2f}" for s in spread),
        )
        return VoiceProfile(
            item_id=item.id,
            fingerprint=item.fingerprint,
            name=self.settings.name,
            encoder=self.kind,
            encoder_model=self.encoder.name,
            dimension=int(vectors.shape[1]),
            embedding=[float(x) for x in mean],
            clips=[
                ProfileClip(
                    path=str(path.resolve()),
                    sha256=sha256_file(path),
                    duration_s=s.size / audio.SAMPLE_RATE,
                    embedding=[float(x) for x in v],
                )
                for path, s, v in zip(paths, clips, vectors)
            ],
            threshold=self.threshold,
        )

    def close(self) -> None:
        self.encoder = None


def _clip_number(key: str) -> int:
    return int(key.removeprefix("clip")) if key.removeprefix("clip").isdigit() else 1 << 30


STAGE = VoiceProfileStage()
