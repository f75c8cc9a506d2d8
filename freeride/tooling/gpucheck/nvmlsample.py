"""Who NVML credits GPU memory to: both of its per-process lists, sampled in the background while a check runs.

Under MPS the plain list (nvmlDeviceGetComputeRunningProcesses) may show only the MPS server and the MPS
list the clients, or not: which one the target driver does is what a check records. A measurement loop in
the tooling, not a control path.
"""

from __future__ import annotations

import threading
from typing import Any

_LISTS = (("compute", "nvmlDeviceGetComputeRunningProcesses"), ("mps", "nvmlDeviceGetMPSComputeRunningProcesses"))
_MiB = 2**20


class NvmlSampler:
    def __init__(self, gpu: int, interval_s: float = 0.05) -> None:
        self.gpu = gpu
        self.interval_s = interval_s
        self.samples = 0
        self.peak_mib: dict[str, dict[int, float]] = {name: {} for name, _ in _LISTS}
        self.errors: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> NvmlSampler:
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            import pynvml as nv

            nv.nvmlInit()
        except Exception as exc:  # no library or driver: said in the summary
            self.errors["init"] = f"{type(exc).__name__}: {exc}"
            return
        try:
            handle = nv.nvmlDeviceGetHandleByIndex(self.gpu)
            while not self._stop.is_set():
                self._sample(nv, handle)
                self._stop.wait(self.interval_s)
        except nv.NVMLError as exc:
            self.errors["handle"] = str(exc)
        finally:
            nv.nvmlShutdown()

    def _sample(self, nv: Any, handle: Any) -> None:
        self.samples += 1
        for name, fn in _LISTS:
            if name in self.errors:
                continue
            try:
                entries = getattr(nv, fn)(handle)
            except (nv.NVMLError, AttributeError) as exc:
                self.errors[name] = f"{type(exc).__name__}: {exc}"
                continue
            peaks = self.peak_mib[name]
            for e in entries:
                used = e.usedGpuMemory
                mib = round(used / _MiB, 1) if isinstance(used, int) else -1.0  # None: NVML could not tell
                peaks[int(e.pid)] = max(peaks.get(int(e.pid), mib), mib)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)

    def attribution(self, roles: dict[int, str]) -> dict[str, Any]:
        """Every pid either list showed, with its peak MiB and its role (worker, MPS server, trainer stand-in...)."""
        seen = [{"list": name, "pid": pid, "role": roles.get(pid, "other"), "peak_mib": mib}
                for name, peaks in self.peak_mib.items() for pid, mib in sorted(peaks.items())]
        return {"samples": self.samples, "processes": seen, "errors": self.errors}
