"""End to end: `bin/pipeline process` on the committed fixtures, offline, with real models."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest

from tests.conftest import MAX_WER, MEDIA, ROOT, SPEECH_TEXT, wer

BAD = {
    "not_media.mp4": "not a readable media file",
    "no_audio.mp4": "no audio stream",
    "empty.wav": "empty file (0 bytes)",
    "missing.mp4": "file not found",
}


def pipeline(*args: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(ROOT / "bin" / "pipeline"), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("out")
    inputs = [str(MEDIA / "speech.mp4")] + [str(MEDIA / name) for name in BAD]
    done = pipeline("process", *inputs, "--output", str(out))
    return done, out


@pytest.mark.slow
def test_exit_code_is_1_when_some_inputs_fail(run):
    done, _ = run
    assert done.returncode == 1, done.stderr[-3000:]


@pytest.mark.slow
def test_good_input_gets_every_output(run):
    _, out = run
    names = {p.name for p in (out / "speech").iterdir() if p.is_file()}
    assert {
        "transcript.json",
        "transcript.srt",
        "transcript.vtt",
        "transcript.txt",
        "embeddings.npy",
        "segments.jsonl",
    } <= names
    assert not (out / "speech" / ".work").exists(), "decoded audio is scratch, removed after success"


@pytest.mark.slow
def test_transcript_has_the_spoken_words(run):
    _, out = run
    transcript = json.loads((out / "speech" / "transcript.json").read_text())
    text = " ".join(s["text"] for s in transcript["segments"])
    assert wer(SPEECH_TEXT, text) < MAX_WER, text
    assert transcript["language"] == "en" and transcript["aligned"] is True
    # offline, no wav2vec2 on disk: Whisper's cross-attention times every word
    assert transcript["aligner"] == "whisper-cross-attention:embedded"
    words = [w for s in transcript["segments"] for w in s["words"]]
    assert " ".join(w["word"] for w in words).split() == text.split()
    assert all(
        s["start"] <= w["start"] <= w["end"] <= s["end"] and w["score"] is not None
        for s in transcript["segments"]
        for w in s["words"]
    )
    assert transcript["model"] == "whisper tiny.en (embedded)", "named, never a path on this machine"
    # one espeak voice: one speaker, and every caption says so (as its corpus speaker, orchestrator.corpus.speakers)
    assert {s["speaker"] for s in transcript["segments"]} == {"SPEAKER_00"}
    txt = (out / "speech" / "transcript.txt").read_text()
    assert txt.count("[S0001] ") == 1, "one line per speaker turn"
    assert txt.replace("[S0001] ", "").split() == text.split()
    srt = (out / "speech" / "transcript.srt").read_text()
    assert srt.startswith("1\n00:00:0") and " --> " in srt
    assert (out / "speech" / "transcript.vtt").read_text().startswith("WEBVTT\n\n00:00:0")


@pytest.mark.slow
def test_embeddings_have_one_unit_row_per_segment(run):
    _, out = run
    transcript = json.loads((out / "speech" / "transcript.json").read_text())
    vectors = np.load(out / "speech" / "embeddings.npy")
    meta = json.loads((out / "speech" / "embeddings.json").read_text())
    assert vectors.shape == (len(transcript["segments"]), 384) == (meta["count"], meta["dimension"])
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    # offline, the "speed" profile falls back to the embedded model and says so
    assert meta["profile"] == "speed" and meta["requested_model"] == "BAAI/bge-small-en-v1.5"
    assert meta["model"] == "all-MiniLM-L6-v2 (embedded)" and meta["fallback_reason"]
    lines = [json.loads(line) for line in (out / "speech" / "segments.jsonl").read_text().splitlines()]
    assert [line["embedding_row"] for line in lines] == list(range(len(lines)))
    np.testing.assert_allclose(np.array([line["embedding"] for line in lines]), vectors, atol=1e-6)
    assert [line["text"] for line in lines] == [s["text"] for s in transcript["segments"]]


@pytest.mark.slow
def test_the_run_report_says_where_the_time_went(run):
    done, out = run
    report = json.loads((out / "run-report.json").read_text())
    # the run's wall is split into computing (some child between its first item and its last) and exposed
    wall, computing, exposed = report["wall_s"], report["computing_s"], report["exposed_s"]
    assert 0 < exposed <= wall and 0 < computing <= wall
    assert computing + exposed == pytest.approx(wall, abs=1e-3)
    assert f"exposed {exposed:.1f} s of {wall:.1f} s" in done.stdout + done.stderr
    for stage in report["stages"]:
        assert stage["waited_s"] >= 0, stage["stage"]
        for child in stage["attempts"]:
            t = child["timeline"]
            assert (
                t["spawned"] < t["imported"] < t["loaded"] <= t["first_item"] < t["last_item"] < t["exited"]
            )
            assert 0 <= child["model_s"] <= child["compute_s"], stage["stage"]
    asr = next(s for s in report["stages"] if s["stage"] == "asr")
    (child,) = asr["attempts"]
    speech = next(i for i in report["inputs"] if i["id"] == "speech")
    assert child["audio_s"] == pytest.approx(speech["duration_s"])
    assert child["model_s"] > 0, "Whisper's encode and generate are model time"
    # the ASR child was forked from the fork server (the default start method): its libraries were imported
    # there once, so its own import is short (a warm spawned child's import ahead of its request is counted:
    # tests/orchestrator/process/test_timeline.py), and the run's wait for ASR is from the audio stage's exit
    assert child["import_s"] < 1.0 and asr["waited_s"] > 0
    audio = report["stages"][0]["attempts"][-1]  # the stage before ASR
    assert asr["waited_s"] == pytest.approx(child["timeline"]["first_item"] - audio["timeline"]["exited"])


@pytest.mark.slow
def test_each_bad_input_fails_alone_with_a_one_line_reason(run):
    done, out = run
    report = json.loads((out / "run-report.json").read_text())
    by_name = {item["source"].rsplit("/", 1)[-1]: item for item in report["inputs"]}
    assert by_name["speech.mp4"]["status"] == "ok" and report["ok"] == 1 and report["failed"] == len(BAD)
    for name, reason in BAD.items():
        item = by_name[name]
        assert item["status"] == "failed" and item["failed_stage"] == "audio"
        assert reason in item["error"] and "\n" not in item["error"]
        assert f"FAILED {MEDIA / name}: [audio] {reason}" in done.stderr
    speech = by_name["speech.mp4"]["stages"]
    assert set(speech) == {"audio", "asr", "diarization", "alignment", "embeddings"}
    assert speech["asr"]["batch_size"] == 16 and speech["asr"]["retries"] == 0
    asr_run = next(s for s in report["stages"] if s["stage"] == "asr")
    assert asr_run["attempts"][0]["outcome"] == "ok" and asr_run["attempts"][0]["load_s"] > 0
    assert asr_run["attempts"][0]["import_s"] < 1.0, "whisperX was imported before the request came"


@pytest.mark.slow
def test_child_logs_go_to_their_files_not_the_console(run):
    done, out = run
    [run_dir] = (out / ".runs").iterdir()
    logs = {path.name.split("-")[1]: path.read_text() for path in run_dir.glob("chunk001-*-1.log")}
    assert "stages.runtime.child: asr: pid" in logs["asr"]
    assert "stages.embeddings: embeddings: model 'BAAI/bge-small-en-v1.5'" in logs["embeddings"]
    assert "[asr]" not in done.stderr, (
        "the console shows them only with -v (tests/scenarios/test_cli_console.py)"
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["process"], "Missing argument"),
        (["process", "x.mp4", "--device", "gpu"], "invalid setting device"),
        (["process", "x.mp4", "--asr-batch-size", "0"], "Invalid value"),
        (["enroll", "Host", "missing.wav"], "clip not found: missing.wav"),
        (["enroll", "Host", "x.wav", "--encoder", "xvector"], "invalid setting speaker_encoder"),
        (["process", "x.mp4", "--min-speakers", "3", "--max-speakers", "2"], "invalid setting max_speakers"),
        # checked before anything runs (each input failed in its child with a wrong hint, or the run wrote
        # into the current folder), the dry run as the run
        (["process", "x.mp4", "--language", "zz"], "'zz' is not a language code Whisper knows"),
        (["process", "x.mp4", "--languages", "en,xx", "--dry-run"], "'xx' is not a language code"),
        (["process", "x.mp4", "-o", ""], "the output folder is empty"),
        (["process", "x.mp4", "-o", "pyproject.toml", "--dry-run"], "is a file, not a folder"),
        (["process", "x.mp4", "-o", "pyproject.toml"], "is a file, not a folder"),
        (["process", "x.mp4", "--device", "cuda:7", "--dry-run"], "--device cuda:7: no"),
        (["process", "x.mp4", "--device", "cuda:7"], "--device cuda:7: no"),
        (["process", "x.mp4", "-o", "file:///proc/isostage-out"], "cannot write to the output URL"),
    ],
)
def test_usage_errors_exit_with_2(args, message):
    before = sorted(ROOT.iterdir())
    done = pipeline(*args)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and sorted(ROOT.iterdir()) == before, "nothing is written"


def test_playlists_and_concat_lists_fail_alone_and_nothing_they_name_is_read(tmp_path):
    from tests.fixtures.generate import HitCounter, pointer_files

    server = HitCounter()
    try:
        files = pointer_files(tmp_path / "root", tmp_path / "elsewhere", server.url)
        done = pipeline("process", *map(str, files.values()), "--output", str(tmp_path / "out"))
    finally:
        server.close()
    assert done.returncode == 1, done.stderr[-2000:]
    report = json.loads((tmp_path / "out" / "run-report.json").read_text())
    reasons = {item["source"].rsplit("/", 1)[-1]: item["error"] for item in report["inputs"]}
    assert reasons["talk.m3u8"].startswith("not a readable media file (an HLS/M3U playlist")
    assert reasons["web.m3u8"].startswith("not a readable media file (an HLS/M3U playlist")
    assert reasons["joined.ffconcat"].startswith("not a readable media file (an FFmpeg concat list")
    assert report["failed"] == 3 and server.hits == []
