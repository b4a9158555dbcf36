"""allow_hub=auto: one short check of the hub endpoint per run decides whether children may download."""

from __future__ import annotations

import http.server
import json
import socket
import threading
import time

import pytest

from contracts import WorkItem, load_model
from orchestrator.models.hub import resolve_hub
from orchestrator.process.executor import LocalExecutor
from orchestrator.process.hooks import default_hooks
from orchestrator.process.pidfiles import ChildRegistry
from orchestrator.registry import StageSpec
from orchestrator.run.runner import StageRunner
from orchestrator.settings import Settings
from tests.fixtures.stages import FixtureSettings, NoteArtifact


class _Hub(http.server.BaseHTTPRequestHandler):
    requests = 0

    def do_HEAD(self):  # http.server's naming
        type(self).requests += 1
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def hub():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Hub.requests = 0
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _probe_child(tmp_path, settings: Settings) -> dict:
    """What a real stage child sees of the hub variables under ``settings``."""
    runner = StageRunner(
        LocalExecutor(default_hooks(registry=ChildRegistry(tmp_path / "pids"))),
        tmp_path / "run",
        env=settings.child_env(),
        device="cpu",
        max_signal_retries=0,
    )
    item = WorkItem(
        id="a", inputs={"source": "x"}, output=str(tmp_path / "a" / "note.json"), fingerprint="fp"
    )
    outcomes, _ = runner.run(
        StageSpec(
            "envprobe",
            "tests.fixtures.stages_envprobe",
            NoteArtifact,
            settings=FixtureSettings(names=["HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"]),
        ),
        [item],
    )
    assert outcomes["a"].ok
    return json.loads(load_model(tmp_path / "a" / "note.json", NoteArtifact).text)


@pytest.mark.slow
def test_an_endpoint_that_answers_lets_the_children_download(hub, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", hub)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    settings = resolve_hub(Settings())
    assert settings.allow_hub is True and _Hub.requests == 1
    seen = _probe_child(tmp_path, settings)
    assert seen["HF_HUB_OFFLINE"] is None and seen["TRANSFORMERS_OFFLINE"] is None


@pytest.mark.slow
def test_a_closed_port_means_offline_at_once(tmp_path, monkeypatch):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed once the block ends
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    started = time.monotonic()
    settings = resolve_hub(Settings())
    assert settings.allow_hub is False and time.monotonic() - started < 1.0
    assert _probe_child(tmp_path, settings)["HF_HUB_OFFLINE"] == "1"


def test_an_endpoint_that_never_answers_is_given_up_within_the_timeout(monkeypatch):
    # Given a port that accepts connections and never answers (a black hole, not a refusal)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    try:
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{listener.getsockname()[1]}")
        started = time.monotonic()
        settings = resolve_hub(Settings(hub_check_timeout_s=0.5))
        # Then the run goes offline after the timeout, far below the 3 s a run may lose to the check
        assert settings.allow_hub is False and time.monotonic() - started < 2.0
    finally:
        listener.close()


@pytest.mark.parametrize("forced", [True, False])
def test_forced_hub_access_asks_nobody(hub, monkeypatch, forced):
    monkeypatch.setenv("HF_ENDPOINT", hub)
    assert resolve_hub(Settings(allow_hub=forced)).allow_hub is forced and _Hub.requests == 0


def test_unresolved_auto_is_offline_for_children():
    assert Settings().allow_hub == "auto" and not Settings().hub
    assert Settings().child_env()["HF_HUB_OFFLINE"] == "1"


def test_what_the_children_downloaded_is_named_once_per_repository(tmp_path):
    from orchestrator.models.hub import cached_repos, downloads
    from tests.orchestrator.gpu.test_vram import write_cache

    write_cache(tmp_path, "Systran/faster-whisper-small", {"config.json": b"{}"})
    before = cached_repos(tmp_path)
    # the run's children fetch a model and the rest of another one
    write_cache(tmp_path, "BAAI/bge-small-en-v1.5", {"model.safetensors": b"x" * (3 << 20)})
    write_cache(tmp_path, "Systran/faster-whisper-small", {"model.bin": b"y" * (2 << 20)}, commit="1" * 40)
    after = cached_repos(tmp_path)
    assert downloads(before, after) == [
        "downloaded BAAI/bge-small-en-v1.5 (3 MiB) into the Hugging Face cache",
        "downloaded Systran/faster-whisper-small (2 MiB) into the Hugging Face cache",
    ]
    assert downloads(after, after) == [] and cached_repos(tmp_path / "none") == {}
