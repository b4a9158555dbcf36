"""A small Prometheus registry for ``GET /metrics``: counters, gauges and one histogram, text format 0.0.4.

Written by hand (a few dozen lines) rather than adding prometheus-client: the
server needs labelled counters, gauges set at scrape time and a histogram of
micro-batch sizes, nothing more.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable

Labels = tuple[tuple[str, str], ...]


def _labels(labels: dict[str, str] | None) -> Labels:
    return tuple(sorted((labels or {}).items()))


def _fmt_labels(labels: Labels, extra: tuple[tuple[str, str], ...] = ()) -> str:
    pairs = labels + extra
    if not pairs:
        return ""
    body = ",".join(f'{k}="{_escape(v)}"' for k, v in pairs)
    return "{" + body + "}"


def _escape(value: str) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _num(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


class _Metric:
    kind = "untyped"

    def __init__(self, name: str, help: str) -> None:
        self.name = name
        self.help = help
        self._lock = threading.Lock()

    def header(self) -> list[str]:
        return [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]


class Counter(_Metric):
    kind = "counter"

    def __init__(self, name: str, help: str) -> None:
        super().__init__(name, help)
        self._values: dict[Labels, float] = {}

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        key = _labels(labels)
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def value(self, **labels: str) -> float:
        with self._lock:
            return self._values.get(_labels(labels), 0.0)

    def lines(self) -> list[str]:
        with self._lock:
            items = sorted(self._values.items())
        return [f"{self.name}{_fmt_labels(k)} {_num(v)}" for k, v in items] or [f"{self.name} 0"]


class Gauge(Counter):
    kind = "gauge"

    def set(self, value: float, **labels: str) -> None:
        with self._lock:
            self._values[_labels(labels)] = float(value)

    def replace(self, values: Iterable[tuple[dict[str, str], float]]) -> None:
        """Set every series at once (series not given disappear): for values read at scrape time."""
        fresh = {_labels(labels): float(value) for labels, value in values}
        with self._lock:
            self._values = fresh

    def lines(self) -> list[str]:
        with self._lock:
            items = sorted(self._values.items())
        return [f"{self.name}{_fmt_labels(k)} {_num(v)}" for k, v in items]


class Histogram(_Metric):
    kind = "histogram"

    def __init__(self, name: str, help: str, buckets: Iterable[float]) -> None:
        super().__init__(name, help)
        self.buckets = tuple(sorted(buckets)) + (math.inf,)
        self._series: dict[Labels, list[float]] = {}  # bucket counts..., sum, count

    def observe(self, value: float, **labels: str) -> None:
        key = _labels(labels)
        with self._lock:
            series = self._series.setdefault(key, [0.0] * (len(self.buckets) + 2))
            for i, bound in enumerate(self.buckets):
                if value <= bound:
                    series[i] += 1
            series[-2] += value
            series[-1] += 1

    def counts(self, **labels: str) -> dict[float, float]:
        """Cumulative count per upper bound, for tests and /health."""
        with self._lock:
            series = self._series.get(_labels(labels))
        return dict(zip(self.buckets, series or [0.0] * len(self.buckets)))

    def lines(self) -> list[str]:
        out = []
        with self._lock:
            items = sorted((k, list(v)) for k, v in self._series.items())
        for key, series in items:
            for bound, count in zip(self.buckets, series):
                out.append(f"{self.name}_bucket{_fmt_labels(key, (('le', _num(bound)),))} {_num(count)}")
            out.append(f"{self.name}_sum{_fmt_labels(key)} {_num(series[-2])}")
            out.append(f"{self.name}_count{_fmt_labels(key)} {_num(series[-1])}")
        return out


class Registry:
    def __init__(self) -> None:
        self._metrics: list[_Metric] = []

    def add(self, metric):
        self._metrics.append(metric)
        return metric

    def render(self) -> str:
        lines: list[str] = []
        for metric in self._metrics:
            lines += metric.header() + metric.lines()
        return "\n".join(lines) + "\n"


class Metrics:
    """Every series the server exports."""

    def __init__(self) -> None:
        r = self.registry = Registry()
        self.requests = r.add(Counter("isostage_http_requests_total", "HTTP requests by route, method and status."))
        self.texts = r.add(Counter("isostage_embedding_texts_total", "Texts embedded, by profile."))
        self.batch_size = r.add(Histogram("isostage_embedding_batch_size",
                                          "Texts per micro-batch sent to an embedding worker.",
                                          (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)))
        self.batch_seconds = r.add(Counter("isostage_embedding_batch_seconds_total",
                                           "Seconds embedding workers spent encoding, by profile."))
        self.queue = r.add(Gauge("isostage_embedding_queue_length", "Texts waiting for a micro-batch, by profile."))
        self.worker_starts = r.add(Counter("isostage_worker_starts_total", "Embedding worker processes started."))
        self.worker_restarts = r.add(Counter("isostage_worker_restarts_total",
                                             "Embedding workers replaced, by reason (crash, recycle, oom_exit)."))
        self.worker_stops = r.add(Counter("isostage_worker_stops_total", "Embedding workers stopped, by reason."))
        self.oom_retries = r.add(Counter("isostage_worker_oom_retries_total",
                                         "Micro-batches retried at half size after an out-of-memory."))
        self.crash_retries = r.add(Counter("isostage_worker_crash_retries_total",
                                           "Texts retried on a fresh worker after a worker crash."))
        self.workers_up = r.add(Gauge("isostage_worker_up", "1 while the profile's worker process is running."))
        self.jobs = r.add(Gauge("isostage_jobs", "Jobs by status."))
        self.job_queue = r.add(Gauge("isostage_job_queue_length", "Jobs waiting to run."))
        self.gpu_used = r.add(Gauge("isostage_gpu_memory_used_mib", "Device memory in use (NVML), by GPU."))
        self.gpu_total = r.add(Gauge("isostage_gpu_memory_total_mib", "Device memory (NVML), by GPU."))
        self.gpu_worker = r.add(Gauge("isostage_worker_gpu_memory_mib",
                                      "GPU memory held by each embedding worker process (NVML)."))

    def render(self) -> str:
        return self.registry.render()
