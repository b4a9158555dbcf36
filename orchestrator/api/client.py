"""A small Python client of the HTTP API (httpx).

    from orchestrator.api.client import Client

    with Client("http://127.0.0.1:8000", token=None) as api:
        response = api.embed(["a sentence", "another"], model="speed")
        vectors = api.vectors(response)                 # numpy float32, one row per input
        job = api.submit_job(["/data/videos/talk.mp4"])
        api.wait(job.id)
        result = api.result(job.id)

Every error answer raises :class:`contracts.errors.ApiError` with the status
and the server's OpenAI-style error.
"""

from __future__ import annotations

import base64
import time

import httpx
import numpy as np

from contracts.api import (
    EmbeddingRequest,
    EmbeddingResponse,
    ErrorResponse,
    Health,
    JobRecord,
    JobRequest,
    JobResult,
    SearchRequest,
    SearchResponse,
)
from contracts.errors import ApiError


class Client:
    def __init__(self, base_url: str, token: str | None = None, timeout: float = 600.0) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=base_url, headers=headers, timeout=timeout)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    def _call(self, method: str, path: str, **kwargs) -> httpx.Response:
        response = self.http.request(method, path, **kwargs)
        if response.status_code >= 400:
            try:
                error = ErrorResponse.model_validate_json(response.content).error
            except ValueError:
                raise ApiError(response.status_code, response.text[:500] or response.reason_phrase) from None
            raise ApiError(response.status_code, error.message, error.type, error.param, error.code)
        return response

    # -- embeddings ------------------------------------------------------------
    def embed(
        self,
        texts: str | list[str],
        model: str = "speed",
        encoding_format: str = "float",
        input_type: str | None = None,
    ) -> EmbeddingResponse:
        """``input_type="query"`` for search queries, ``"document"`` for what is searched (transcript segments
        are embedded as documents): a model with prompts embeds the two apart."""
        body = EmbeddingRequest(
            input=texts, model=model, encoding_format=encoding_format, input_type=input_type
        )
        response = self._call("POST", "/v1/embeddings", json=body.model_dump(exclude_none=True))
        return EmbeddingResponse.model_validate_json(response.content)

    @staticmethod
    def vectors(response: EmbeddingResponse) -> np.ndarray:
        """The embeddings as one float32 array, in input order (float or base64 responses)."""
        rows = sorted(response.data, key=lambda d: d.index)
        if rows and isinstance(rows[0].embedding, str):
            return np.stack([np.frombuffer(base64.b64decode(r.embedding), dtype="<f4") for r in rows])
        return np.asarray([r.embedding for r in rows], dtype=np.float32)

    # -- search ------------------------------------------------------------------
    def search(self, query: str, mode: str = "hybrid", k: int = 10, **filters: str | None) -> SearchResponse:
        """The server's output folders searched (``filters``: speaker, language, under, input)."""
        body = SearchRequest(query=query, mode=mode, k=k, **filters)
        response = self._call("POST", "/v1/search", json=body.model_dump(exclude_none=True))
        return SearchResponse.model_validate_json(response.content)

    # -- jobs --------------------------------------------------------------------
    def submit_job(self, paths: str | list[str], vocabulary: list[str] | None = None) -> JobRecord:
        body = JobRequest(
            paths=[paths] if isinstance(paths, str) else list(paths), vocabulary=vocabulary or []
        )
        return JobRecord.model_validate_json(self._call("POST", "/v1/jobs", json=body.model_dump()).content)

    def job(self, job_id: str) -> JobRecord:
        return JobRecord.model_validate_json(self._call("GET", f"/v1/jobs/{job_id}").content)

    def wait(self, job_id: str, timeout: float = 3600.0, poll_s: float = 0.5) -> JobRecord:
        """Poll until the job is done or failed; raise TimeoutError after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            record = self.job(job_id)
            if record.status in ("done", "failed"):
                return record
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still {record.status} after {timeout:.0f}s")
            time.sleep(poll_s)

    def result(self, job_id: str, embeddings: bool = False) -> JobResult:
        response = self._call(
            "GET", f"/v1/jobs/{job_id}/result", params={"embeddings": str(embeddings).lower()}
        )
        return JobResult.model_validate_json(response.content)

    # -- service -----------------------------------------------------------------
    def health(self) -> Health:
        return Health.model_validate_json(self._call("GET", "/health").content)

    def metrics(self) -> str:
        return self._call("GET", "/metrics").text
