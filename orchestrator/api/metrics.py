"""The server's Prometheus series (``GET /metrics``), through ``prometheus-client``.

Each app gets its own :class:`~prometheus_client.CollectorRegistry` (tests run
several servers in one process). Counters and the micro-batch histogram are
updated as things happen; values that are only true at scrape time (jobs by
status, NVML memory) come from a collector the server registers
(:class:`ScrapeCollector`). :func:`sample` reads one value back from a page
with prometheus-client's own text parser (tests, bench).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families

# no `<name>_created` series: they double every counter's lines and nothing here reads them
disable_created_metrics()

#: the content type of :meth:`Metrics.render`'s page
CONTENT_TYPE = CONTENT_TYPE_LATEST

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


class Metrics:
    """Every series the server exports, in one registry."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            "isostage_http_requests",
            "HTTP requests by route, method and status.",
            ["route", "method", "status"],
            registry=r,
        )
        self.texts = Counter(
            "isostage_embedding_texts", "Texts embedded, by profile.", ["profile"], registry=r
        )
        self.batch_size = Histogram(
            "isostage_embedding_batch_size",
            "Texts per micro-batch sent to an embedding worker.",
            ["profile"],
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.batch_seconds = Counter(
            "isostage_embedding_batch_seconds",
            "Seconds embedding workers spent encoding, by profile.",
            ["profile"],
            registry=r,
        )
        self.queue = Gauge(
            "isostage_embedding_queue_length",
            "Texts waiting for a micro-batch, by profile.",
            ["profile"],
            registry=r,
        )
        self.worker_starts = Counter(
            "isostage_worker_starts", "Embedding worker processes started.", ["profile"], registry=r
        )
        self.worker_restarts = Counter(
            "isostage_worker_restarts",
            "Embedding workers replaced, by reason (crash, recycle, oom_exit).",
            ["profile", "reason"],
            registry=r,
        )
        self.worker_stops = Counter(
            "isostage_worker_stops",
            "Embedding workers stopped, by reason.",
            ["profile", "reason"],
            registry=r,
        )
        self.oom_retries = Counter(
            "isostage_worker_oom_retries",
            "Micro-batches retried at half size after an out-of-memory.",
            ["profile"],
            registry=r,
        )
        self.crash_retries = Counter(
            "isostage_worker_crash_retries",
            "Texts retried on a fresh worker after a worker crash.",
            ["profile"],
            registry=r,
        )
        self.rejected = Counter(
            "isostage_rejected_requests",
            "Requests refused with 429 (reason: concurrency, queue) or dropped (disconnect, deadline).",
            ["reason"],
            registry=r,
        )
        self.dropped_texts = Counter(
            "isostage_embedding_dropped_texts",
            "Queued texts dropped before a worker saw them (client gone, deadline).",
            ["profile"],
            registry=r,
        )
        self.bad_texts = Counter(
            "isostage_embedding_bad_texts",
            "Texts a worker could not embed while others of their micro-batch could (400).",
            ["profile"],
            registry=r,
        )
        self.workers_up = Gauge(
            "isostage_worker_up", "1 while the profile's worker process is running.", ["profile"], registry=r
        )

    def render(self) -> bytes:
        """The Prometheus text page (:data:`CONTENT_TYPE`)."""
        return generate_latest(self.registry)

    def value(self, name: str, **labels: str) -> float:
        """One sample's current value (0 when the series does not exist yet)."""
        return self.registry.get_sample_value(name, labels) or 0.0


class ScrapeCollector:
    """Gauges read when Prometheus scrapes: jobs by status, the job queue, GPU memory (NVML)."""

    def __init__(
        self,
        job_counts: Callable[[], dict[str, int]],
        queued: Callable[[], int],
        gpu: Callable[[], Iterable[tuple[str, float, float, dict[str, float]]]],
    ) -> None:
        """``gpu()`` yields (gpu index, used MiB, total MiB, {worker profile: MiB it holds})."""
        self.job_counts, self.queued, self.gpu = job_counts, queued, gpu

    def collect(self):
        jobs = GaugeMetricFamily("isostage_jobs", "Jobs by status.", labels=["status"])
        for status, count in sorted(self.job_counts().items()):
            jobs.add_metric([status], count)
        yield jobs
        yield GaugeMetricFamily("isostage_job_queue_length", "Jobs waiting to run.", value=self.queued())
        used = GaugeMetricFamily(
            "isostage_gpu_memory_used_mib", "Device memory in use (NVML), by GPU.", labels=["gpu"]
        )
        total = GaugeMetricFamily(
            "isostage_gpu_memory_total_mib", "Device memory (NVML), by GPU.", labels=["gpu"]
        )
        held = GaugeMetricFamily(
            "isostage_worker_gpu_memory_mib",
            "GPU memory held by each embedding worker process (NVML).",
            labels=["profile", "gpu"],
        )
        for index, used_mib, total_mib, workers in self.gpu():
            used.add_metric([index], used_mib)
            total.add_metric([index], total_mib)
            for profile, mib in workers.items():
                held.add_metric([profile, index], mib)
        yield from (used, total, held)


def sample(page: str, name: str, **labels: str) -> float:
    """One sample of a Prometheus text page, read with prometheus-client's parser (0 when absent).

    Label values are compared as text, except ``le`` which is compared as a number ("1" == "1.0").
    """

    def same(got: dict[str, str]) -> bool:
        if set(got) != set(labels):
            return False
        return all(float(got[k]) == float(v) if k == "le" else got[k] == v for k, v in labels.items())

    for family in text_string_to_metric_families(page):
        for s in family.samples:
            if s.name == name and same(s.labels):
                return s.value
    return 0.0
