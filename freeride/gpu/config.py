"""The GPU layer's own configuration: which GPU, fake or real, MPS and how workers share the SMs, the memory kept
free. The agent builds it from its settings (freeride.agent.config, the "gpu" concern); `GpuControl.open` and the
memory guard take it. `problems()` says what is wrong in the words of the agent's flags."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal


@dataclass(frozen=True)
class GpuConfig:
    gpu: int = 0  # --gpu: the index this agent serves
    fake_spec: str = ""  # --fake-gpu: a FakeDevice spec; empty: NVML
    headroom_bytes: int = 1 << 30  # --headroom: GPU memory kept free beyond the trainer's needs
    memory_cap_restarts: int = 0  # --memory-cap-restarts
    mps: Literal["off", "start", "use"] = "off"  # --mps
    mps_program: str = "nvidia-cuda-mps-control"  # --mps-control
    pipe_dir: Path | None = None  # the MPS pipe directory (resolved; None with MPS off)
    log_dir: Path | None = None  # the MPS log directory (resolved)
    thread_percentage: int = 0  # --mps-thread-percentage: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE; 0: not set
    green_sms: int = 0  # --green-sms: a CUDA green context of N SMs; 0: off

    def problems(self) -> list[str]:
        """What is wrong, each naming its flag and what to use (empty: nothing)."""
        found = []
        if self.gpu < 0:
            found.append(f"--gpu must be >= 0, got {self.gpu}")
        if not 0 <= self.thread_percentage <= 100:
            found.append(f"--mps-thread-percentage must be 0 (unset) .. 100, got {self.thread_percentage}")
        if self.green_sms < 0:
            found.append(f"--green-sms must be >= 0 (0: off), got {self.green_sms}")
        if self.headroom_bytes < 0:
            found.append(f"--headroom must be >= 0, got {self.headroom_bytes} bytes")
        if self.memory_cap_restarts < 0:
            found.append(f"--memory-cap-restarts must be >= 0, got {self.memory_cap_restarts}")
        if not self.mps_program.strip():
            found.append("--mps-control is empty: give the MPS control program (nvidia-cuda-mps-control)")
        if self.mps != "off" and self.pipe_dir is not None and len(str(self.pipe_dir / "control")) > 100:
            found.append(f"MPS pipe dir {self.pipe_dir} is too long for its control socket; pick a shorter "
                         "--mps-pipe-dir")
        return found
