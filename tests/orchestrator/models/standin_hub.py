"""A stand-in Hugging Face hub on 127.0.0.1: enough of the hub's HTTP layout for huggingface_hub's real
``model_info`` and ``snapshot_download`` (point ``HF_ENDPOINT`` at :attr:`StandinHub.endpoint`).

Served: ``GET /api/models/{repo}[/revision/{rev}]`` (id, sha, siblings, gated, cardData), and
``HEAD``/``GET /{repo}/resolve/{rev}/{file}`` with ``X-Repo-Commit``, ``ETag`` (the git blob sha1) or, for
LFS files, ``X-Linked-Etag`` (the sha256) and ``X-Linked-Size``; a ``Range: bytes=N-`` answers 206.
A gated repository answers its files 401 (``X-Error-Code: GatedRepo``) without ``Bearer <token>``;
``drop_at`` cuts every download of a file off at that byte (the connection closes mid-file).
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote


@dataclass
class Repo:
    files: dict[str, bytes]
    #: files stored in LFS (named by their sha256 in the cache), the others by their git blob sha1
    lfs: set[str] = field(default_factory=set)
    gated: bool = False
    license: str = "mit"

    @property
    def sha(self) -> str:
        digest = hashlib.sha1()  # a commit id: the same files give the same one
        for name in sorted(self.files):
            digest.update(name.encode() + hashlib.sha256(self.files[name]).digest())
        return digest.hexdigest()


def git_sha1(data: bytes) -> str:
    return hashlib.sha1(f"blob {len(data)}\0".encode() + data).hexdigest()


class StandinHub:
    """``with StandinHub(repos) as hub:`` serves ``repos`` (repo id -> :class:`Repo`) on a free port."""

    def __init__(self, repos: dict[str, Repo], token: str = "hf_standin") -> None:
        self.repos = repos
        self.token = token
        #: file name -> byte at which each download of it is cut off (None: served whole)
        self.drop_at: dict[str, int] = {}
        #: (method, path, Range header) of every request
        self.requests: list[tuple[str, str, str | None]] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet
                pass

            def do_HEAD(self) -> None:
                hub._answer(self, body=False)

            def do_GET(self) -> None:
                hub._answer(self, body=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> StandinHub:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    # -- answers -------------------------------------------------------------------------------------

    def _answer(self, h: BaseHTTPRequestHandler, body: bool) -> None:
        path = unquote(h.path.split("?", 1)[0])
        self.requests.append((h.command, path, h.headers.get("Range")))
        auth = h.headers.get("Authorization")
        if auth is not None and auth != f"Bearer {self.token}":
            return self._send(h, 401, b'{"error": "Invalid credentials in Authorization header"}', body)
        if path.startswith("/api/models/"):
            return self._info(h, path.removeprefix("/api/models/"), body)
        if "/resolve/" in path:
            repo_id, _, rest = path.lstrip("/").partition("/resolve/")
            _, _, name = rest.partition("/")
            return self._file(h, repo_id, name, authorized=auth is not None, body=body)
        return self._send(h, 200, b"stand-in hub", body)

    def _info(self, h, rest: str, body: bool) -> None:
        repo_id = rest.split("/revision/", 1)[0]
        repo = self.repos.get(repo_id)
        if repo is None:
            return self._send(
                h, 404, b'{"error": "Repository not found"}', body, {"X-Error-Code": "RepoNotFound"}
            )
        info = {
            "id": repo_id,
            "modelId": repo_id,
            "sha": repo.sha,
            "private": False,
            "gated": "manual" if repo.gated else False,
            "disabled": False,
            "tags": [],
            "cardData": {"license": repo.license},
            "siblings": [{"rfilename": name} for name in sorted(repo.files)],
        }
        self._send(h, 200, json.dumps(info).encode(), body, {"Content-Type": "application/json"})

    def _file(self, h, repo_id: str, name: str, authorized: bool, body: bool) -> None:
        repo = self.repos.get(repo_id)
        if repo is None:
            return self._send(h, 404, b"Repository not found", body, {"X-Error-Code": "RepoNotFound"})
        if repo.gated and not authorized:
            message = b"Access to model is restricted. You must have access to it and be authenticated."
            return self._send(h, 401, message, body, {"X-Error-Code": "GatedRepo"})
        data = repo.files.get(name)
        if data is None:
            return self._send(h, 404, b"Entry not found", body, {"X-Error-Code": "EntryNotFound"})
        headers = {"X-Repo-Commit": repo.sha, "Accept-Ranges": "bytes"}
        if name in repo.lfs:
            headers |= {
                "X-Linked-Etag": f'"{hashlib.sha256(data).hexdigest()}"',
                "X-Linked-Size": str(len(data)),
            }
        headers["ETag"] = (
            f'"{git_sha1(data)}"' if name not in repo.lfs else f'"{hashlib.sha256(data).hexdigest()}"'
        )
        start = 0
        if (wanted := h.headers.get("Range")) and wanted.startswith("bytes=") and body:
            start = int(wanted.removeprefix("bytes=").split("-", 1)[0] or 0)
        if start:
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        cut = self.drop_at.get(name)
        if cut is not None and body:  # promise the whole rest, send up to the cut, close the connection
            h.send_response(206 if start else 200)
            for key, value in headers.items():
                h.send_header(key, value)
            h.send_header("Content-Length", str(len(data) - start))
            h.end_headers()
            h.wfile.write(data[start : max(start, cut)])
            h.wfile.flush()
            h.close_connection = True
            return None
        self._send(h, 206 if start else 200, data[start:], body, headers)
        return None

    @staticmethod
    def _send(h, status: int, data: bytes, body: bool, headers: dict | None = None) -> None:
        h.send_response(status)
        for key, value in (headers or {}).items():
            h.send_header(key, value)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        if body:
            h.wfile.write(data)
