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
        request_id="r",
        stage="audio",
        module="stages.audio",
        batch_size=1,
        result_path=str(tmp_path / "res.json"),
        settings=stage_settings("audio", **settings),
        items=[
            WorkItem(id=k, inputs={"source": v}, output=str(tmp_path / k / "audio.json"), fingerprint="fp")
            for k, v in sources.items()
        ],
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
    corr = np.corrcoef(w[: n - lag], m[lag:n])[0, 1]
    assert (
        art_info(tmp_path / "m").source_channels == 2 and art_info(tmp_path / "m").source_sample_rate == 44100
    )
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
    truncated.write_bytes((media / "speech.mp4").read_bytes()[:30_000])
    result = _run(tmp_path, {"t": str(truncated)})
    assert not result.items[0].ok and "media" in result.items[0].error


def test_directory_is_not_media(tmp_path):
    with pytest.raises(InputError, match="directory without media files"):
        from stages.audio import check_readable

        check_readable(tmp_path)


# -- damaged media and files that are not media --------------------------------------------


def damaged_mp4(path, media):
    """speech.mp4 with 4 kB of its audio data overwritten in the middle: it decodes part-way, then fails."""
    import random

    data = bytearray((media / "speech.mp4").read_bytes())
    rng = random.Random(1)
    start = int(len(data) * 0.45)
    data[start : start + 4000] = bytes(rng.randrange(256) for _ in range(4000))
    path.write_bytes(bytes(data))
    return path


def test_audio_damaged_part_way_is_kept_and_says_how_much_decoded(tmp_path, media):
    result = _run(tmp_path, {"d": str(damaged_mp4(tmp_path / "damaged.mp4", media))})
    assert result.items[0].ok
    art = load_artifact(tmp_path / "d" / "audio.json", AudioArtifact)
    assert art.expected_duration_s == pytest.approx(10.8, abs=0.1)
    assert art.damage.startswith(f"decoded {art.duration_s:.1f} s of 10.8 s (") and art.duration_s < 8
    whole = _run(tmp_path / "w", {"w": str(media / "speech.mp4")})
    assert (
        whole.items[0].ok and load_artifact(tmp_path / "w" / "w" / "audio.json", AudioArtifact).damage is None
    )


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
        result = _run(
            tmp_path,
            {
                "fifo": str(tmp_path / "fifo.mp4"),
                "sock": str(tmp_path / "sock.mp4"),
                "dev": "/dev/null",
                "loop": str(tmp_path / "loop.mp4"),
                "dangling": str(tmp_path / "dangling.mp4"),
                "ok": str(media / "speech.wav"),
            },
        )
    finally:
        sock.close()
    errors = {r.id: r.error for r in result.items}
    assert errors["fifo"].startswith("not a regular file (FIFO)")
    assert errors["sock"].startswith("not a regular file (socket)")
    assert errors["dev"].startswith("not a regular file (device file)")
    assert errors["loop"].startswith("symbolic link loop")
    assert errors["dangling"].startswith("broken symbolic link")
    assert errors["ok"] is None


# -- containers, tracks, files that point elsewhere, files that change -----------------


def _aligned_corr(reference: np.ndarray, other: np.ndarray) -> float:
    """Correlation of two decodes of the same speech after removing the codec's delay (first second)."""
    lag = int(np.argmax(np.correlate(other[:24000], reference[:16000], mode="valid")))
    n = min(reference.size, other.size - lag) - 4000
    return float(np.corrcoef(reference[:n], other[lag : lag + n])[0, 1])


@pytest.mark.parametrize(
    ("name", "fmt", "codec"),
    [
        ("a.webm", "webm", "libopus"),
        ("a.ogg", "ogg", "libopus"),
        ("a.flac", "flac", "flac"),
        ("a.m4a", "ipod", "aac"),
        ("a.mkv", "matroska", "mp3"),
        ("a.mp3", "mp3", "mp3"),
    ],
)
def test_common_audio_containers_decode_to_the_same_speech(tmp_path, name, fmt, codec):
    from tests.fixtures.generate import encode, speech

    reference = speech()
    path = encode(tmp_path / name, [reference], fmt, codec, rate=48000 if "opus" in codec else 44100)
    result = _run(tmp_path, {"x": str(path)})
    assert result.items[0].ok, result.items[0].error
    samples = np.load(tmp_path / "x" / "audio.npy")
    assert samples.size / 16000 == pytest.approx(reference.size / 16000, abs=0.1)
    assert _aligned_corr(reference, samples) > 0.9


def test_the_default_audio_track_is_decoded_and_recorded(tmp_path):
    from tests.fixtures.generate import encode, speech

    voice, hum = speech(), 0.2 * np.sin(2 * np.pi * 220 * np.arange(speech().size) / 16000).astype(np.float32)
    marked = encode(tmp_path / "marked.mkv", [hum, voice], "matroska", "libopus", default=1)
    unmarked = encode(tmp_path / "unmarked.mkv", [voice, hum], "matroska", "libopus")
    result = _run(tmp_path, {"m": str(marked), "u": str(unmarked)})
    assert all(r.ok for r in result.items), result.items
    m, u = art_info(tmp_path / "m"), art_info(tmp_path / "u")
    assert (m.source_stream, m.audio_streams) == (
        1,
        2,
    ) and m.track == "2 audio tracks: decoded stream 1 (marked default)"
    assert (u.source_stream, u.audio_streams) == (
        0,
        2,
    ) and u.track == "2 audio tracks: decoded stream 0 (the first)"
    for directory in ("m", "u"):  # the speech, not the hum, in both
        assert _aligned_corr(voice, np.load(tmp_path / directory / "audio.npy")) > 0.9
    single = _run(tmp_path / "s", {"s": str(encode(tmp_path / "one.mkv", [voice], "matroska", "libopus"))})
    assert single.items[0].ok and art_info(tmp_path / "s" / "s").track is None


def test_playlists_and_concat_lists_are_refused_without_reading_what_they_name(tmp_path):
    from tests.fixtures.generate import HitCounter, pointer_files

    server = HitCounter()
    try:
        files = pointer_files(tmp_path / "root", tmp_path / "elsewhere", server.url)
        result = _run(tmp_path / "out", {kind: str(path) for kind, path in files.items()})
    finally:
        server.close()
    errors = {r.id: r.error for r in result.items}
    assert errors["hls-file"].startswith(
        "not a readable media file (an HLS/M3U playlist: it points at other files"
    )
    assert errors["hls-url"].startswith("not a readable media file (an HLS/M3U playlist")
    assert errors["concat"].startswith("not a readable media file (an FFmpeg concat list")
    assert server.hits == [], "the URL a playlist names is never fetched"


def test_a_source_that_changed_since_planning_is_refused_with_what_changed(tmp_path, media):
    from contracts import SourceVersion

    source = tmp_path / "talk.wav"
    source.write_bytes((media / "speech.wav").read_bytes())
    st = source.stat()
    planned = SourceVersion(size=st.st_size, mtime_ns=st.st_mtime_ns)
    request = StageRequest(
        request_id="r",
        stage="audio",
        module="stages.audio",
        batch_size=1,
        result_path=str(tmp_path / "res.json"),
        settings=stage_settings("audio"),
        items=[
            WorkItem(
                id="t",
                inputs={"source": str(source)},
                output=str(tmp_path / "t" / "audio.json"),
                fingerprint="fp",
                source_version=planned,
            )
        ],
    )
    assert STAGE.run(request).items[0].ok, "unchanged: decoded"
    with open(source, "ab") as fh:
        fh.write(b"\0" * 3200)
    item = STAGE.run(request).items[0]
    assert not item.ok and item.error.startswith(
        f"source changed since the run was planned (size {st.st_size} -> {st.st_size + 3200} bytes)"
    )


def test_a_folder_swapped_for_a_link_out_of_the_roots_is_refused_where_the_file_is_opened(tmp_path, media):
    import os
    import shutil

    # Given a source inside the allowed root, checked by the parent...
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "talks").mkdir(parents=True)
    outside.mkdir()
    shutil.copy(media / "speech.wav", root / "talks" / "talk.wav")
    shutil.copy(media / "speech.wav", outside / "talk.wav")
    os.symlink(root / "talks" / "talk.wav", tmp_path / "link.wav")  # how the parent hands over odd names
    ok = _run(
        tmp_path / "before",
        {"a": str(root / "talks" / "talk.wav"), "l": str(tmp_path / "link.wav")},
        roots=[str(root)],
    )
    assert [i.ok for i in ok.items] == [True, True], ok.items
    # When its folder is replaced by a symbolic link to a folder outside the root before the child opens it
    shutil.rmtree(root / "talks")
    os.symlink(outside, root / "talks")
    result = _run(tmp_path / "after", {"a": str(root / "talks" / "talk.wav")}, roots=[str(root)])
    # Then nothing is decoded: the file actually opened is outside the roots
    assert not result.items[0].ok
    assert "outside the allowed input roots" in result.items[0].error, result.items[0].error
    assert not (tmp_path / "after" / "a" / "audio.npy").exists()
    # And without roots (the command line) the same path is read as the user gave it
    assert _run(tmp_path / "cli", {"a": str(root / "talks" / "talk.wav")}).items[0].ok
