"""The issue's "done when": `pipeline enroll Host ...` then `pipeline process dialogue.mp4 --profiles ...`
names the host in the SRT, offline, each speaker stage in its own child."""

from __future__ import annotations

import json
import re

import pytest

from tests.conftest import MEDIA
from tests.test_cli import pipeline

pytestmark = pytest.mark.slow

SPEAKERS = MEDIA / "speakers"


def srt_speakers(path) -> list[str]:
    return re.findall(r"^\[([^\]]+)\] ", path.read_text(), flags=re.M)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("speakers")
    profiles, out = tmp / "profiles", tmp / "out"
    # -v: the children's own log lines on the console too (the tests below look for their pids)
    host = pipeline("enroll", "Host", str(SPEAKERS / "host_enroll_1.wav"), str(SPEAKERS / "host_enroll_2.wav"),
                    "--profiles", str(profiles), "-v")
    assert host.returncode == 0, host.stderr[-3000:]
    guest = pipeline("enroll", "Guest", str(SPEAKERS / "guest_enroll_1.wav"), "--profiles", str(profiles))
    assert guest.returncode == 0, guest.stderr[-3000:]
    done = pipeline("process", str(SPEAKERS / "host_guest.mp4"), str(SPEAKERS / "host_stranger.mp4"),
                    "--profiles", str(profiles), "--output", str(out), "--embedding-profile", "embedded", "-v")
    assert done.returncode == 0, done.stderr[-3000:]
    return host, done, profiles, out


def test_enroll_writes_a_profile_in_its_own_child(run):
    host, _, profiles, _ = run
    profile = json.loads((profiles / "Host.json").read_text())
    assert profile["name"] == "Host" and profile["encoder"] == "campplus" and len(profile["clips"]) == 2
    assert "[voice_profile] stages.child: voice_profile: pid" in host.stderr


def test_enrolled_speakers_are_named_in_the_srt_and_the_stranger_is_not(run):
    _, _, _, out = run
    assert set(srt_speakers(out / "host_guest" / "transcript.srt")) == {"Host", "Guest"}
    stranger = srt_speakers(out / "host_stranger" / "transcript.srt")
    assert "Host" in stranger and "Guest" not in stranger
    others = set(stranger) - {"Host"}
    assert len(others) == 1 and re.fullmatch(r"SPEAKER_\d\d", others.pop()), stranger


def test_turns_are_labelled_in_order(run):
    """Host and Guest alternate in the dialogue (4 turns): the transcript's segments follow them."""
    _, _, _, out = run
    transcript = json.loads((out / "host_guest" / "transcript.json").read_text())
    speakers = [s["speaker"] for s in transcript["segments"]]
    collapsed = [s for i, s in enumerate(speakers) if i == 0 or s != speakers[i - 1]]
    assert collapsed == ["Host", "Guest", "Host", "Guest"], speakers
    assert transcript["aligned"] is False and "not downloaded" in transcript["alignment_note"]
    assert transcript["diarization"] == "embedded:pyannote-segmentation-3.0+campplus"
    assert transcript["speaker_encoder"].startswith("campplus:")
    lines = [json.loads(line) for line in (out / "host_guest" / "segments.jsonl").read_text().splitlines()]
    assert [line["speaker"] for line in lines] == speakers
    assert (out / "host_guest" / "transcript.vtt").read_text().count("[Host] ") == speakers.count("Host")


def test_each_speaker_stage_ran_in_its_own_child(run):
    _, done, _, out = run
    report = json.loads((out / "run-report.json").read_text())
    runs = {r["stage"]: r for r in report["stages"]}
    assert list(runs) == ["audio", "asr", "diarization", "enrollment", "alignment", "embeddings"]
    pids = [r["attempts"][0]["pid"] for r in runs.values()]
    assert len(set(pids)) == len(pids)
    for stage in ("diarization", "enrollment", "alignment"):
        assert f"[{stage}] stages.child: {stage}: pid" in done.stderr
    item = report["inputs"][0]["stages"]
    assert item["enrollment"]["batch_size"] == 4 and item["diarization"]["status"] == "ok"
