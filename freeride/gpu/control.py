"""The agent's GPU, in one object: the device (or none: CPU mode), MPS, and each worker's client settings.

Chosen once at agent start; every failure to find a GPU is said once and leaves the agent in
CPU mode, where resident memory stands in for GPU memory.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from freeride.gpu.config import GpuConfig
from freeride.gpu.device import Device, GpuError, NoGpuError
from freeride.gpu.mps import Mps, MpsControl, MpsState, worker_env
from freeride.gpu.open import open_device
from freeride.gpu.probe import DeviceProbe, HostProbe, MemoryProbe, process_tree

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GpuSnapshot:
    """Memory on the agent's device now; the trainer's share is what is not the workers'."""

    mode: str  # cpu | nvml | fake
    name: str = ""
    uuid: str = ""
    compute_mode: str = ""
    total_bytes: int = 0
    used_bytes: int = 0
    free_bytes: int = 0
    workers_used_bytes: int = 0

    @property
    def others_used_bytes(self) -> int:
        """Used by processes that are not this agent's workers: the trainer, mostly."""
        return max(0, self.used_bytes - self.workers_used_bytes)

    @property
    def available_bytes(self) -> int | None:
        """What side tasks could hold in all: free now plus what the workers already hold (None in CPU mode)."""
        return None if self.mode == "cpu" else self.free_bytes + self.workers_used_bytes


class GpuControl:
    def __init__(self, device: Device | None, mps: Mps | None, *, gpu: int, thread_percentage: int = 0,
                 no_mps_pipe_dir: Path = Path("/nonexistent/freeride-no-mps"), green_sms: int = 0) -> None:
        self.device = device
        self.mps = mps
        self.gpu = gpu
        self._threads = thread_percentage
        self._green_sms = green_sms
        self._no_mps_pipe = no_mps_pipe_dir
        self.probe: MemoryProbe = DeviceProbe(device) if device is not None else HostProbe()

    @classmethod
    def open(cls, config: GpuConfig) -> GpuControl:
        """Find the device; start or attach MPS. NoGpuError is logged once here and means CPU mode."""
        gpu, mps_mode, pipe_dir, log_dir = config.gpu, config.mps, config.pipe_dir, config.log_dir
        device: Device | None
        try:
            device = open_device(gpu, config.fake_spec)
        except NoGpuError as exc:
            log.warning("no GPU: %s; running in CPU mode, memory caps apply to the host memory a task holds "
                        "(install the NVIDIA driver, or try the GPU layer with --fake-gpu)", exc)
            device = None
        mps = None
        if device is not None and mps_mode != "off" and pipe_dir is not None and log_dir is not None:
            mps = Mps(mps_mode, MpsControl(config.mps_program, pipe_dir, log_dir, visible_devices=device.info.uuid))
            try:
                mps.open()
            except GpuError:
                device.close()
                raise
        elif mps_mode != "off":
            log.warning("--mps %s ignored: there is no GPU", mps_mode)
        if device is not None:
            i = device.info
            log.info("GPU %d: %s (%s), %.1f GiB, compute mode %s, MPS %s", i.index, i.name, i.uuid,
                     i.total_bytes / 2**30, device.compute_mode(), mps.state().label if mps else "off")
        no_mps = (pipe_dir.parent if pipe_dir is not None else Path("/nonexistent")) / "no-mps"
        return cls(device, mps, gpu=gpu, thread_percentage=config.thread_percentage, no_mps_pipe_dir=no_mps,
                   green_sms=config.green_sms)

    def count_groups(self, group_of: Callable[[int], Path | None]) -> None:
        """CPU mode: measure a worker by its own cgroup's memory.current where `group_of(pid)` names one
        (and the group accounts memory); PSS otherwise. Nothing changes on a GPU."""
        if isinstance(self.probe, HostProbe):
            self.probe.group_of = group_of

    @property
    def mode(self) -> str:
        return "cpu" if self.device is None else self.device.kind

    def mps_state(self) -> MpsState:
        return self.mps.state() if self.mps is not None else MpsState("off")

    @property
    def on_nvml(self) -> bool:
        """Whether the agent runs on a real GPU (not in CPU mode, not on the fake GPU): caps bound its memory."""
        return self.device is not None and self.device.kind == "nvml"

    def client_env(self, base: Mapping[str, str], mem_limit_bytes: int, no_mps: bool) -> dict[str, str] | None:
        """A worker's environment on this GPU; None in CPU mode (the worker inherits the agent's)."""
        if self.device is None:
            return None
        mps = self.mps if self.mps is not None and self.mps.active else None
        env = worker_env(
            base, gpu_uuid=self.device.info.uuid if self.on_nvml else "",
            pipe_dir=mps.control.pipe_dir if mps else None, log_dir=mps.control.log_dir if mps else None,
            no_mps_pipe_dir=self._no_mps_pipe, mem_limit_bytes=mem_limit_bytes,
            thread_percentage=self._threads, use_mps=mps is not None and not no_mps,
        )
        if self.on_nvml:
            env["FREERIDE_DEVICE"] = "cuda:0"  # its one visible GPU
        if self._green_sms > 0:
            env["FREERIDE_GREEN_SMS"] = str(self._green_sms)  # the worker's kernels on that many SMs (worker/green.py)
        return env

    def client_started(self, pid: int) -> None:
        if self.device is not None:
            self.device.add_client(pid)

    @property
    def stops_clients(self) -> bool:
        """Whether a worker must be terminated through MPS before it is killed."""
        return self.mps is not None and self.mps.active

    def stop_client(self, pid: int) -> list[tuple[int, int]]:
        """terminate_client the worker's MPS clients (it and its children): its queued GPU work is cancelled.

        Blocking (one control-program call per command): run it off the event loop.
        """
        if self.mps is None:
            return []
        return self.mps.stop_clients(process_tree(pid))

    def snapshot(self, worker_pids: Iterable[int] = ()) -> GpuSnapshot:
        """The device's memory and the workers' share of it, measured together."""
        used_by_workers = sum(self.probe.usage(list(worker_pids)).values())
        if self.device is None:
            return GpuSnapshot("cpu", workers_used_bytes=used_by_workers)
        m = self.device.memory()
        i = self.device.info
        return GpuSnapshot(self.device.kind, i.name, i.uuid, self.device.compute_mode(), m.total_bytes,
                           m.used_bytes, m.free_bytes, used_by_workers)

    def close(self) -> None:
        if self.mps is not None:
            self.mps.close()
        if self.device is not None:
            self.device.close()


def cpu_only() -> GpuControl:
    """CPU mode without looking for a GPU (unit tests, tools)."""
    return GpuControl(None, None, gpu=int(os.environ.get("FREERIDE_GPU", "0") or 0))
