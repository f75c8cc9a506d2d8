"""The agent's view of GPU memory: the device, each worker's use, the admission budget, MPS clients.

Kept apart from the task lifecycle (supervisor.py): this part speaks to the hardware layer
(freeride.gpu) and says what the lifecycle should do about it; it never changes a task's state
and keeps nothing per task (reservations and samples live in the task table).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor

import psutil

from freeride.agent.domain.views import GpuMemory
from freeride.agent.engine.admission import usable_bytes
from freeride.gpu import GpuError, MemoryProbe
from freeride.gpu.control import GpuControl, GpuSnapshot

log = logging.getLogger("freeride.agent")


class MemoryGuard:
    def __init__(self, gpu: GpuControl, probe: MemoryProbe, headroom_bytes: int) -> None:
        self.gpu = gpu
        self._probe = probe
        self._headroom = headroom_bytes
        self._error = ""  # the last GPU query failure, logged once
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="freeride-gpu")  # MPS commands

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def trouble(self, exc: GpuError) -> None:
        if str(exc) != self._error:
            self._error = str(exc)
            log.error("GPU query failed: %s (memory caps are not enforced while this lasts)", exc)

    def sample(self, workers: Mapping[str, int]) -> dict[str, int]:
        """Memory now of each worker (task id -> pid); a failed query reads as nothing used."""
        try:
            usage = self._probe.usage(list(workers.values()))
        except GpuError as exc:
            self.trouble(exc)
            usage = {}
        return {task_id: usage.get(pid, 0) for task_id, pid in workers.items()}

    def usable_bytes(self, worker_pids: Iterable[int], trainer_free_bytes: int) -> int | None:
        """What the resident side tasks may reserve in all (None: unbounded)."""
        available = None
        if self.gpu.device is not None:
            try:
                available = self.gpu.snapshot(worker_pids).available_bytes
            except GpuError as exc:
                self.trouble(exc)
        return usable_bytes(trainer_free_bytes, available, self._headroom)

    def device_total_bytes(self) -> int | None:
        """Memory of the device that caps apply to, when known: the probe's, else the host's in CPU mode."""
        device = self.gpu.device
        if device is not None:
            try:
                return device.memory().total_bytes or None
            except GpuError:
                return None
        return psutil.virtual_memory().total

    def read_snapshot(self, worker_pids: list[int]) -> GpuSnapshot | GpuError:
        """The device and the workers' memory now: blocking reads (NVML, each worker's PSS), so off the loop
        (MemoryWatchdog.off_loop); an error is returned for `telemetry`, which reports it on the loop."""
        try:
            return self.gpu.snapshot(worker_pids)
        except GpuError as exc:
            return exc

    def telemetry(self, read: GpuSnapshot | GpuError, trainer_free_bytes: int, reserved_bytes: int,
                  waiting: int) -> GpuMemory:
        """GPU telemetry for `freeride stats` and the metrics, from a `read_snapshot`: the device, the workers,
        the trainer's share."""
        snap: GpuSnapshot | None = None
        if isinstance(read, GpuError):
            self.trouble(read)
        else:
            snap = read
        usable = usable_bytes(trainer_free_bytes, snap.available_bytes if snap else None, self._headroom)
        device = snap if snap is not None and snap.mode != "cpu" else None
        return GpuMemory(
            mode=self.gpu.mode, mps=self.gpu.mps_state().label,
            side_tasks_used_bytes=snap.workers_used_bytes if snap else 0, side_tasks_reserved_bytes=reserved_bytes,
            usable_bytes=usable, headroom_bytes=self._headroom, waiting_tasks=waiting, device=device,
            trainer_peak_bytes=max(0, device.total_bytes - trainer_free_bytes) if device and trainer_free_bytes else 0,
        )

    # -- MPS clients -----------------------------------------------------------------------------
    def client_env(self, mem_limit_bytes: int, no_mps: bool) -> dict[str, str] | None:
        return self.gpu.client_env(os.environ, mem_limit_bytes, no_mps)

    def client_started(self, pid: int, no_mps: bool) -> bool:
        """Note a new worker; True when it must be stopped through MPS before it is killed."""
        self.gpu.client_started(pid)
        return self.gpu.stops_clients and not no_mps

    async def terminate_client(self, pid: int) -> None:
        """Cancel the worker's queued GPU work through MPS before its process is killed."""
        try:
            done = await asyncio.get_running_loop().run_in_executor(self._pool, self.gpu.stop_client, pid)
        except GpuError as exc:
            log.warning("MPS terminate_client for worker %d failed: %s; killing it anyway", pid, exc)
            return
        for server, client in done:
            log.info("MPS: terminated client %d of server %d before killing it", client, server)
