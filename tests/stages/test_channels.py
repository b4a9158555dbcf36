"""The audio stage's channel measure and decision (``PIPELINE_CHANNELS``) on real decoded stereo recordings
made from the committed speech (tests/fixtures/generate.py: ``channel_recordings``)."""

from __future__ import annotations

import numpy as np
import pytest

from stages import audio
from tests.fixtures.generate import channel_recordings


@pytest.fixture(scope="module")
def decoded(tmp_path_factory):
    audio.STAGE.import_libraries()
    out = {}
    for name, path in channel_recordings(tmp_path_factory.mktemp("channels")).items():
        samples, info, channels = audio.decode_channels(path, by_channel=True)
        out[name] = (samples, info, channels)
    return out


def _decide(decoded, name: str, mode: str = "auto"):
    samples, _, channels = decoded[name]
    measure = audio.measure_channels(audio._fit(channels, samples.shape[0]))
    return measure, *audio.decide_channels(measure, mode)


def test_one_speaker_per_channel_talking_over_each_other_is_separated(decoded):
    measure, keep, why = _decide(decoded, "two_speakers")
    assert keep == [0, 1] and why.startswith("separated"), why
    assert measure.correlation < audio.MAX_CORRELATION and min(measure.active_s) > 3


@pytest.mark.parametrize("name", ["copy", "near_copy", "music_bed"])
def test_one_sound_on_both_channels_stays_mixed(decoded, name):
    """Copies (even at another gain with a little noise) and a music bed with speech in both: mixed, and the
    measure says why (levels that go together)."""
    measure, keep, why = _decide(decoded, name)
    assert keep == [] and "go together" in why, why
    assert measure.correlation >= audio.MAX_CORRELATION


def test_silence_on_one_side_is_mixed_under_auto_and_gets_no_empty_track_under_separate(decoded):
    measure, keep, why = _decide(decoded, "one_side")
    assert keep == [] and why == "mixed: only channel 1 has sound", why
    assert measure.active_s[1] == 0 and measure.correlation is None
    _, keep, why = _decide(decoded, "one_side", "separate")
    assert keep == [0] and "channel(s) 2 left out (no sound)" in why, why


def test_separate_keeps_every_channel_with_sound_even_copies(decoded):
    _, keep, _ = _decide(decoded, "copy", "separate")
    assert keep == [0, 1]


def test_the_mix_is_the_same_whatever_the_channels_mode(decoded, tmp_path):
    """Splitting the channels leaves the mono mix (diarization's, the listening copy's) as it was."""
    path = channel_recordings(tmp_path)["two_speakers"]
    mixed, _, none = audio.decode_channels(path)
    samples, _, channels = decoded["two_speakers"]
    assert none is None and np.array_equal(mixed, samples)
    assert channels.shape[0] == 2 and abs(channels.shape[1] - samples.shape[0]) < 200


def test_a_mono_source_has_no_channels_to_split(decoded):
    assert decoded["mono"][2] is None
