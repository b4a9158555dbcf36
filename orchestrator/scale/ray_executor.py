"""Run stage requests as Ray tasks, across the GPUs and machines of a Ray cluster.

Each stage-chunk attempt is one Ray task with ``max_calls=1``: Ray starts a
worker process for it and ends that process after the call, so whatever the
task held, VRAM included, goes back to the node. Inside the task the stage runs
exactly as it does locally, in a spawned child (:class:`LocalExecutor` on that
node: the same exit codes, log file, progress lines, pid file and NVML checks),
so ``stages/`` and ``contracts/`` do not know Ray exists.

Request, result, artifacts, logs and progress lines live under the output
directory, which every node must see at the same path (shared storage). The
driver follows the log and progress files from there, and applies the one
retry policy (``orchestrator.run.outcome.next_step``) to what comes back: Ray's own
retries are off (``max_retries=0``) because they would rerun the whole batch at
the same size; a task that runs out of memory is resubmitted by the runner with
half the batch and only the items still to do.

``ray`` is an optional dependency (``uv sync --group ray``); it is imported
only when this executor is used, and never imports torch in the driver.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from contracts import ExitCode, StageRequest, StageResult
from contracts.errors import SettingsError
from orchestrator.process.executor import ChildExit, WarmChild, read_result
from orchestrator.process.hooks import ChildRun
from orchestrator.process.outcome import Outcome
from orchestrator.process.toolkit import following

log = logging.getLogger(__name__)

#: how the stage child logs (stages.runtime.child.LOG_FORMAT): the task's own lines join the same file
_TASK_LOG_FORMAT = "%(levelname)s %(name)s: %(message)s"


def _ray():
    try:
        import ray
    except ImportError:
        raise SettingsError(
            "the ray executor needs the optional ray dependencies: uv sync --group ray "
            "(bin/pipeline installs them for --executor ray)"
        ) from None
    return ray


def _watch_config(settings) -> dict[str, Any]:
    """What a node needs to watch a child like the local executor does (no secrets travel)."""
    return {
        name: getattr(settings, name)
        for name in (
            "gpu_monitor",
            "gpu_leak_tolerance_mib",
            "gpu_sample_s",
            "gpu_check_free",
            "pid_dir",
            "watchdog_floor_s",
            "watchdog_per_audio_s",
        )
    }


def stage_task(
    request_json: str,
    request_path: str,
    log_path: str,
    watch: dict[str, Any],
    started_path: str | None = None,
) -> tuple[ChildExit, StageResult | None]:
    """Body of the Ray task, run in a Ray worker: the stage in a spawned child, as on one machine.
    ``started_path`` is written first thing, with the id of the node that runs the task: the driver's sign
    that the cluster placed the task, and where (the node is named even if it dies with the task)."""
    import ray

    node = ray.get_runtime_context().get_node_id()
    if started_path is not None:
        Path(started_path).write_text(node)
    from orchestrator.process.executor import LocalExecutor, Watchdog
    from orchestrator.process.hooks import default_hooks
    from orchestrator.settings import Settings

    request = StageRequest.model_validate_json(request_json)
    stage = request.stage

    # The driver follows the child's log file itself; this worker's own lines (GPU checks,
    # warnings) go into the same file, so they reach the driver the same way.
    logging.basicConfig(level=logging.INFO, format=_TASK_LOG_FORMAT, filename=log_path, force=True)
    logging.getLogger("orchestrator.child").disabled = True
    logging.getLogger("orchestrator.scale.ray_executor").info(
        "%s: ray task on %s (node %s), pid %d, CUDA_VISIBLE_DEVICES=%s",
        stage,
        os.uname().nodename,
        node,
        os.getpid(),
        os.environ.get("CUDA_VISIBLE_DEVICES", "(unset)"),
    )
    # validated, and without reading this node's environment: only what the driver sent counts
    settings = Settings.model_validate(watch)
    executor = LocalExecutor(default_hooks(settings), watchdog=Watchdog.from_settings(settings), node=node)
    try:
        return executor.run(request, Path(request_path), Path(log_path))
    finally:
        executor.stop_all(grace_s=2.0)


class RayExecutor:
    """The :class:`~orchestrator.process.executor.Executor` interface over a Ray cluster."""

    def __init__(self, settings, address: str | None = None) -> None:
        ray = _ray()
        self.settings = settings
        self.address = address if address is not None else settings.ray_address
        self._started_cluster = False
        if not ray.is_initialized():
            if self.address:
                log.info("ray: connecting to %s", self.address)
                ray.init(address=self.address, log_to_driver=False)
            else:
                log.info("ray: starting a local cluster for this run (--ray-address to use a running one)")
                ray.init(num_cpus=settings.ray_num_cpus, include_dashboard=False, log_to_driver=False)
                self._started_cluster = True
        resources = ray.cluster_resources()
        self.cluster_gpus = float(resources.get("GPU", 0.0))
        self.cluster_cpus = float(resources.get("CPU", 0.0))
        log.info(
            "ray: cluster with %g CPU(s), %g GPU(s), %d node(s)",
            self.cluster_cpus,
            self.cluster_gpus,
            sum(1 for node in ray.nodes() if node.get("Alive")),
        )
        self._task = ray.remote(max_calls=1)(stage_task)  # a fresh worker process per call
        self._running: dict[str, Any] = {}
        self._cancelled: set[str] = set()
        self._lock = threading.Lock()

    # -- placement ------------------------------------------------------------------------

    def uses_gpus(self) -> bool:
        return self.cluster_gpus > 0 and self.settings.device != "cpu"

    def task_options(self, name: str, gpu: bool, stage: str | None = None) -> dict[str, Any]:
        """Ray options of one stage task (``max_calls=1`` is set on the function: Ray refuses it here):
        no retry behind the runner's back. The stage's own resources (``ray_stage_resources``) replace the
        CPUs and GPUs every task reserves, and add the custom resources that steer it to some nodes."""
        options: dict[str, Any] = {
            "name": name,
            "num_cpus": self.settings.ray_cpus_per_task,
            "num_gpus": self.settings.ray_gpus_per_task if gpu and self.uses_gpus() else 0,
            "max_retries": 0,
        }
        own = dict(self.settings.ray_stage_resources.get(stage, {})) if stage else {}
        if "CPU" in own:
            options["num_cpus"] = own.pop("CPU")
        if "GPU" in own:
            options["num_gpus"] = own.pop("GPU")
        if own:
            options["resources"] = own
        return options

    def slots(self) -> int:
        """Stage tasks the cluster can run at once: its GPUs (per task), else its CPUs (per task)."""
        if self.uses_gpus():
            return max(1, int(self.cluster_gpus / self.settings.ray_gpus_per_task))
        return max(1, int(self.cluster_cpus / max(self.settings.ray_cpus_per_task, 1.0)))

    # -- the executor interface ---------------------------------------------------------

    def warm_up(
        self, stage: str, module: str, request_path: Path, log_path: Path, env: dict[str, str] | None = None
    ) -> WarmChild | None:
        return None  # a task is placed when its request exists; nothing to import ahead on the driver

    def cancel(self, warm: WarmChild) -> None:
        pass

    def run(
        self,
        request: StageRequest,
        request_path: Path,
        log_path: Path,
        progress: tuple[Path, Callable[[str], None]] | None = None,
        warm: WarmChild | None = None,
        gpu: bool = True,
    ) -> tuple[ChildExit, StageResult | None]:
        ray = _ray()
        stage = request.stage
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.touch()
        name = request_path.name.removesuffix(".request.json")
        options = self.task_options(name, gpu, stage)
        placed = request_path.with_name(f"{name}.started")
        placed.unlink(missing_ok=True)
        started = time.perf_counter()
        # lines as "[chunk002-asr-1] ...": chunks run in parallel here
        with following(log_path, name, progress) as relay:
            ref = self._task.options(**options).remote(
                request.model_dump_json(),
                str(request_path),
                str(log_path),
                _watch_config(self.settings),
                str(placed),
            )
            with self._lock:
                self._running[name] = ref
            done: ChildExit | None = None
            result: StageResult | None = None
            try:
                done, result = self._wait(ray, ref, stage, name, placed, options)
            finally:
                if done is None:  # interrupted while waiting: never leave the task running
                    ray.cancel(ref, force=True)
                with self._lock:
                    self._running.pop(name, None)
                    cancelled = name in self._cancelled
                    self._cancelled.discard(name)
        if cancelled and done.outcome is not Outcome.OK:
            done, result = _exit(Outcome.INTERRUPTED, ExitCode.INTERRUPTED, "stopped"), None
        wall_s = time.perf_counter() - started
        # the task died after its child wrote a result
        if result is None and done.outcome is not Outcome.REFUSED:
            result = read_result(request, done.outcome)
        # the node's record; when Ray itself failed (no record came back), this side's view of the same child
        record = (
            done.record
            or ChildRun(
                request=request,
                request_path=request_path,
                outcome=done.outcome,
                signal=done.signal,
                wall_s=wall_s,
                result=result,
            ).record()
        )
        # where the cluster placed it, as the task wrote it first thing (None: never placed)
        node = placed.read_text().strip() if placed.exists() else ""
        record = record.model_copy(update={"node": node or None})
        return ChildExit(
            exitcode=done.exitcode,
            outcome=done.outcome,
            signal=done.signal,
            wall_s=wall_s,
            pid=done.pid,
            last_error=relay.last_error or done.last_error,
            gpu=done.gpu,
            record=record,
            in_flight=done.in_flight,
            hung=done.hung,
        ), result

    def _wait(
        self, ray, ref, stage: str, name: str, placed: Path, options: dict[str, Any]
    ) -> tuple[ChildExit, StageResult | None]:
        """The task's (ChildExit, result), or what Ray's failure means for the retry policy (no result).
        A task the cluster has not started (``placed`` not there) within ``ray_placement_timeout_s`` is
        cancelled and refused, with what it needs and what the cluster has."""
        exc = ray.exceptions
        limit = self.settings.ray_placement_timeout_s
        submitted = time.monotonic()
        while True:
            ready, _ = ray.wait([ref], timeout=0.5)
            if ready:
                break
            if limit and time.monotonic() - submitted > limit and not placed.exists():
                ray.cancel(ref, force=True)
                reason = unplaced_reason(
                    limit,
                    options,
                    ray.cluster_resources(),
                    [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")],
                )
                log.error("%s: ray task %s %s", stage, name, reason)
                return _exit(Outcome.REFUSED, None, reason), None
        try:
            return ray.get(ref)
        except exc.TaskCancelledError:
            return _exit(Outcome.INTERRUPTED, ExitCode.INTERRUPTED, "cancelled"), None
        except exc.OutOfMemoryError as err:  # Ray's memory monitor killed the worker: host memory ran out
            log.warning("%s: ray killed %s for memory: %s", stage, name, _first_line(err))
            return _exit(Outcome.OOM, ExitCode.OOM, "ray memory monitor: " + _first_line(err)), None
        except (
            exc.WorkerCrashedError,
            exc.NodeDiedError,
            exc.LocalRayletDiedError,
            exc.ActorDiedError,
            exc.ObjectLostError,
        ) as err:
            log.warning("%s: ray worker of %s died: %s", stage, name, _first_line(err))
            # as if the worker (and the child with it) had been killed: the retry policy respawns it
            return ChildExit(
                exitcode=-signal.SIGKILL,
                outcome=Outcome.KILLED,
                signal=signal.SIGKILL,
                wall_s=0.0,
                pid=None,
                last_error=f"ray worker died: {_first_line(err)}",
            ), None
        except exc.RayError as err:  # the task's own code raised (before or after the child)
            log.error("%s: ray task %s failed: %s", stage, name, _first_line(err))
            return _exit(Outcome.ERROR, ExitCode.FAILED, _first_line(err)), None

    def stop_all(self, grace_s: float = 5.0) -> None:
        """Cancel every running task (its worker is killed; the stage child dies with it)."""
        ray = _ray()
        with self._lock:
            running = dict(self._running)
            self._cancelled |= set(running)
        for name, ref in running.items():
            log.warning("cancelling ray task %s", name)
            ray.cancel(ref, force=True)

    def close(self) -> None:
        self.stop_all()
        if self._started_cluster:
            _ray().shutdown()
            self._started_cluster = False


def _exit(outcome: Outcome, code: ExitCode | None, error: str | None) -> ChildExit:
    return ChildExit(
        exitcode=None if code is None else int(code),
        outcome=outcome,
        signal=None,
        wall_s=0.0,
        pid=None,
        last_error=error,
    )


#: Ray's resource names as a person reads them
_RESOURCES = {"num_gpus": "GPU", "num_cpus": "CPU"}
_NAMED = set(_RESOURCES.values())


def unplaced_reason(
    limit_s: float, options: dict[str, Any], cluster: dict[str, float], nodes: list[dict[str, float]]
) -> str:
    """Why a task waits: whether any one node could ever hold it, or its resources are busy."""
    needs = {_RESOURCES[k]: float(v) for k, v in options.items() if k in _RESOURCES and v}
    needs |= {k: float(v) for k, v in options.get("resources", {}).items() if v}
    wanted = ", ".join(f"{v:g} {k}" for k, v in needs.items()) or "no resources"
    has = ", ".join(
        f"{cluster.get(k, 0.0):g} {k}" for k in ("GPU", "CPU", *(k for k in needs if k not in _NAMED))
    )
    fits = any(all(node.get(k, 0.0) >= v for k, v in needs.items()) for node in nodes)
    why = (
        "the cluster's nodes have them, but they stayed busy"
        if fits
        else "no node of the cluster has that much"
    )
    return (
        f"not placed within {limit_s:g} s: needs {wanted}, the cluster has {has}; {why} "
        "(PIPELINE_RAY_PLACEMENT_TIMEOUT_S; PIPELINE_RAY_GPUS_PER_TASK / _CPUS_PER_TASK / _STAGE_RESOURCES)"
    )


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
