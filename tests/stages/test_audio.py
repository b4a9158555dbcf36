"""PyAV decoding to 16 kHz mono float32, and clear errors for bad media."""

from __future__ import annotations

import numpy as np
import pytest

from contracts import AudioArtifact, InputError, StageRequest, WorkItem, load_artifact
from stages.audio import STAGE
from tests.conftest import stage_settings

STAGE.import_libraries()


def _run(tmp_path, sources: dict[str, str], **settings):
    request = StageRequest(
        request_id="r", stage="audio", module="stages.audio", batch_size=1, result_path=str(tmp_path / "res.json"),
        settings=stage_settings("audio", **settings),
        items=[WorkItem(id=k, inputs={"source": v}, output=str(tmp_path / k / "audio.json"), fingerprint="fp")
               for k, v in sources.items()],
    )
    return STAGE.run(request)


@pytest.mark.parametrize("name", ["speech.wav", "speech.mp4"])
def test_decodes_to_16k_mono_float32(tmp_path, media, name):
    result = _run(tmp_path, {"a": str(media / name)})
    assert result.items[0].ok
    art = load_artifact(tmp_path / "a" / "audio.json", AudioArtifact)
    samples = np.load(tmp_path / "a" / art.sidecar)
    assert samples.dtype == np.float32 and samples.ndim == 1 and art.sample_rate == 16000
    # espeak said ~10.8 s; the mp4's AAC track may pad a little
    assert 10.5 < art.duration_s < 13.0 and art.num_samples == samples.size
    assert 0.05 < np.abs(samples).max() < 2.0  # AAC decoding may overshoot 1.0 a little


def test_mp4_and_wav_decode_to_the_same_speech(tmp_path, media):
    _run(tmp_path, {"w": str(media / "speech.wav"), "m": str(media / "speech.mp4")})
    w = np.load(tmp_path / "w" / "audio.npy")
    m = np.load(tmp_path / "m" / "audio.npy")
    n = min(w.size, m.size) - 4000
    # AAC adds a small delay: align by cross-correlation over the first second
    lag = int(np.argmax(np.correlate(m[:20000], w[:16000], mode="valid")))
    corr = np.corrcoef(w[:n - lag], m[lag:n])[0, 1]
    assert art_info(tmp_path / "m").source_channels == 2 and art_info(tmp_path / "m").source_sample_rate == 44100
    assert corr > 0.9


def art_info(directory):
    return load_artifact(directory / "audio.json", AudioArtifact)


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("not_media.mp4", "not a readable media file"),
        ("no_audio.mp4", "no audio stream (has video)"),
        ("empty.wav", "empty file (0 bytes)"),
        ("missing.wav", "file not found"),
    ],
)
def test_bad_media_fails_alone_with_a_clear_reason(tmp_path, media, name, reason):
    result = _run(tmp_path, {"bad": str(media / name), "good": str(media / "speech.wav")})
    bad, good = result.items
    assert not bad.ok and reason in bad.error and str(media / name) in bad.error
    assert good.ok
    assert not (tmp_path / "bad").exists() or not any((tmp_path / "bad").iterdir())


def test_truncated_mp4_is_an_input_error(tmp_path, media):
    truncated = tmp_path / "truncated.mp4"
    truncated.write_bytes((media / "speech.mp4").read_bytes()[: 30_000])
    result = _run(tmp_path, {"t": str(truncated)})
    assert not result.items[0].ok and "media" in result.items[0].error


def test_directory_is_not_media(tmp_path):
    with pytest.raises(InputError, match="directory without media files"):
        from stages.audio import check_readable

        check_readable(tmp_path)


# -- damaged media and files that are not media (issue 12) --------------------------------------------


def damaged_mp4(path, media):
    """speech.mp4 with 4 kB of its audio data overwritten in the middle: it decodes part-way, then fails."""
    import random

    data = bytearray((media / "speech.mp4").read_bytes())
    rng = random.Random(1)
    start = int(len(data) * 0.45)
    data[start:start + 4000] = bytes(rng.randrange(256) for _ in range(4000))
    path.write_bytes(bytes(data))
    return path


def test_audio_damaged_part_way_is_kept_and_says_how_much_decoded(tmp_path, media):
    result = _run(tmp_path, {"d": str(damaged_mp4(tmp_path / "damaged.mp4", media))})
    assert result.items[0].ok
    art = load_artifact(tmp_path / "d" / "audio.json", AudioArtifact)
    assert art.expected_duration_s == pytest.approx(10.8, abs=0.1)
    assert art.damage.startswith(f"decoded {art.duration_s:.1f} s of 10.8 s (") and art.duration_s < 8
    whole = _run(tmp_path / "w", {"w": str(media / "speech.mp4")})
    assert whole.items[0].ok and load_artifact(tmp_path / "w" / "w" / "audio.json", AudioArtifact).damage is None


def test_damaged_audio_fails_when_asked(tmp_path, media):
    result = _run(tmp_path, {"d": str(damaged_mp4(tmp_path / "damaged.mp4", media))}, on_damaged="fail")
    assert not result.items[0].ok and result.items[0].error.startswith("damaged media: decoded ")


def test_files_that_are_not_regular_files_fail_alone_without_being_opened(tmp_path, media):
    import os
    import socket

    os.mkfifo(tmp_path / "fifo.mp4")  # opening it would block the decoder forever
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "sock.mp4"))
    (tmp_path / "loop.mp4").symlink_to(tmp_path / "loop.mp4")
    (tmp_path / "dangling.mp4").symlink_to(tmp_path / "nowhere.mp4")
    try:
        result = _run(tmp_path, {"fifo": str(tmp_path / "fifo.mp4"), "sock": str(tmp_path / "sock.mp4"),
                                 "dev": "/dev/null", "loop": str(tmp_path / "loop.mp4"),
                                 "dangling": str(tmp_path / "dangling.mp4"), "ok": str(media / "speech.wav")})
    finally:
        sock.close()
    errors = {r.id: r.error for r in result.items}
    assert errors["fifo"].startswith("not a regular file (FIFO)")
    assert errors["sock"].startswith("not a regular file (socket)")
    assert errors["dev"].startswith("not a regular file (device file)")
    assert errors["loop"].startswith("symbolic link loop")
    assert errors["dangling"].startswith("broken symbolic link")
    assert errors["ok"] is None
