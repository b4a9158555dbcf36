"""A job's inputs are read as the files they are: a playlist inside an input root reaches nothing outside it."""

from __future__ import annotations

from orchestrator.api.client import Client
from orchestrator.api.server import start_in_thread
from orchestrator.settings import Settings
from tests.fixtures.generate import HitCounter, pointer_files


def test_a_playlist_inside_a_root_is_refused_and_what_it_names_is_not_read(tmp_path):
    counter = HitCounter()
    root = tmp_path / "root"
    files = pointer_files(root, tmp_path / "elsewhere", counter.url)
    server = start_in_thread(
        Settings(server_dir=tmp_path / "server", port=0, input_roots=[root], device="cpu")
    )
    try:
        with Client(server.url) as api:
            job = api.submit_job([str(path) for path in files.values()])
            done = api.wait(job.id, timeout=300)
    finally:
        server.stop()
        counter.close()
    assert done.status == "failed" and done.error == "3 of 3 input(s) failed", done.error
    errors = {item.source.rsplit("/", 1)[-1]: item.error for item in done.inputs}
    assert all(item.status == "failed" for item in done.inputs), done.inputs
    assert errors["talk.m3u8"].startswith("not a readable media file (an HLS/M3U playlist")
    assert errors["web.m3u8"].startswith("not a readable media file (an HLS/M3U playlist")
    assert errors["joined.ffconcat"].startswith("not a readable media file (an FFmpeg concat list")
    assert counter.hits == [], "the server fetched nothing a playlist named"
