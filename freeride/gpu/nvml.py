"""The real device: NVML through nvidia-ml-py (imported as `pynvml`).

Every NVML failure becomes a GpuError (or NoGpuError when the driver or device is missing)
with the NVML message, so callers never see pynvml's generated exception classes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from freeride.gpu.device import COMPUTE_MODES, DeviceInfo, GpuError, MemoryInfo, NoGpuError

log = logging.getLogger(__name__)
T = TypeVar("T")

_init_lock = threading.Lock()


def _pynvml() -> Any:
    try:
        import pynvml
    except ImportError as exc:  # pragma: no cover - nvidia-ml-py is a dependency
        raise NoGpuError(f"nvidia-ml-py is not installed ({exc}); pip install nvidia-ml-py") from None
    return pynvml


def nvml_init() -> Any:
    """nvmlInit (reference-counted by NVML); NoGpuError when there is no library or driver."""
    nv = _pynvml()
    with _init_lock:
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            raise NoGpuError(f"NVML unavailable: {exc}") from None
    return nv


def driver_version() -> str:
    nv = nvml_init()
    try:
        return str(nv.nvmlSystemGetDriverVersion())
    finally:
        nv.nvmlShutdown()


def device_count() -> int:
    nv = nvml_init()
    try:
        return int(nv.nvmlDeviceGetCount())
    finally:
        nv.nvmlShutdown()


class NvmlDevice:
    kind = "nvml"

    def __init__(self, nv: Any, handle: Any, info: DeviceInfo) -> None:
        self._nv = nv
        self._handle = handle
        self.info = info
        self._mps_listing = True  # cleared when the driver lacks the MPS process list

    @classmethod
    def open(cls, index: int) -> NvmlDevice:
        nv = nvml_init()
        try:
            count = nv.nvmlDeviceGetCount()
            if index >= count:
                raise NoGpuError(f"GPU {index} does not exist: NVML sees {count} device(s); pass --gpu 0..{count - 1}")
            handle = nv.nvmlDeviceGetHandleByIndex(index)
            mem = nv.nvmlDeviceGetMemoryInfo(handle)
            info = DeviceInfo(index, str(nv.nvmlDeviceGetUUID(handle)), str(nv.nvmlDeviceGetName(handle)),
                              int(mem.total))
        except NoGpuError:
            nv.nvmlShutdown()
            raise
        except nv.NVMLError as exc:
            nv.nvmlShutdown()
            raise NoGpuError(f"NVML cannot open GPU {index}: {exc}") from None
        return cls(nv, handle, info)

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except self._nv.NVMLError as exc:
            raise GpuError(f"NVML {what} on GPU {self.info.index} failed: {exc}") from None

    def memory(self) -> MemoryInfo:
        m = self._call("memory info", lambda: self._nv.nvmlDeviceGetMemoryInfo(self._handle))
        return MemoryInfo(int(m.total), int(m.free), int(m.used))

    def process_memory(self) -> dict[int, int]:
        """Compute processes, plus MPS clients (under MPS the plain list may show only the MPS server)."""
        out: dict[int, int] = {}
        procs = list(self._call("process list", lambda: self._nv.nvmlDeviceGetComputeRunningProcesses(self._handle)))
        if self._mps_listing:
            try:
                procs += self._nv.nvmlDeviceGetMPSComputeRunningProcesses(self._handle)
            except (self._nv.NVMLError_NotSupported, self._nv.NVMLError_FunctionNotFound):
                self._mps_listing = False
            except self._nv.NVMLError as exc:
                raise GpuError(f"NVML MPS process list on GPU {self.info.index} failed: {exc}") from None
        for p in procs:
            if p.usedGpuMemory is not None:  # None: the driver cannot attribute memory (e.g. WDDM)
                out[int(p.pid)] = max(out.get(int(p.pid), 0), int(p.usedGpuMemory))
        return out

    def compute_mode(self) -> str:
        try:
            mode = self._nv.nvmlDeviceGetComputeMode(self._handle)
        except self._nv.NVMLError:
            return "UNKNOWN"
        return COMPUTE_MODES.get(int(mode), "UNKNOWN")

    def add_client(self, pid: int) -> None:
        """NVML sees every process with a CUDA context on its own."""

    def close(self) -> None:
        try:
            self._nv.nvmlShutdown()
        except self._nv.NVMLError as exc:
            log.debug("nvmlShutdown: %s", exc)
