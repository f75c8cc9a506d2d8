"""`freeride doctor`: what stands between this machine and a working agent, and how to fix each thing.

Read-only: it queries NVML and the MPS control daemon, looks at directories, and starts nothing.
The agent runs the same checks when it starts and logs the failures, one line each.
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import stat
from dataclasses import asdict, dataclass
from pathlib import Path

from freeride.agent.config import AgentConfig
from freeride.core import disk
from freeride.core.units import format_size
from freeride.errors import FreerideError
from freeride.gpu.device import Device, GpuError, NoGpuError
from freeride.gpu.mps import MpsControl
from freeride.gpu.open import open_device

log = logging.getLogger("freeride.agent")

OK, INFO, WARN, FAIL = "ok", "info", "warn", "fail"
FAULT_MODEL = (
    "MPS fault model: a fatal GPU fault in any MPS client reaches every client on that GPU (the trainer "
    "too, if it is a client), and the MPS server takes no new clients until they all exit"
)
CPU_MODE_FIX = "for GPU mode install the NVIDIA driver (libnvidia-ml.so.1); to try the GPU path here, --fake-gpu"
FAULT_FIX = "submit untrusted tasks with `freeride submit --no-mps` (they run time-sliced, outside MPS)"


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # ok | info | warn | fail
    detail: str
    fix: str = ""
    gpu_presence: bool = False  # the "is there a GPU at all" checks: the agent reports those its own way


def run_checks(config: AgentConfig) -> list[Check]:
    checks: list[Check] = []
    device = _device_checks(config, checks)
    try:
        if _cpu_mode(checks):
            _cpu_mode_mps_check(config, checks)
        else:
            _mps_checks(config, device, checks)
    finally:
        if device is not None:
            device.close()
    checks.append(_dir_check("socket-dir", config.socket_path.parent))
    checks.append(_dir_check("state-dir", config.state_dir))
    checks.append(disk_check(config.state_dir, config.disk_warn_percent))
    checks.append(Check("mps-fault-model", INFO, FAULT_MODEL, FAULT_FIX))
    return checks


def _device_checks(config: AgentConfig, checks: list[Check]) -> Device | None:
    if config.fake_gpu:
        checks.append(Check("nvml", OK, "not used: the agent runs with a fake GPU (--fake-gpu)"))
    else:
        from freeride.gpu.nvml import device_count, driver_version

        try:
            version, count = driver_version(), device_count()
        except NoGpuError as exc:  # no driver: CPU mode, which the agent supports (caps on the memory a task holds)
            checks.append(Check("nvml", INFO, f"{exc}: the agent runs in CPU mode (side tasks on the CPU, memory "
                                f"caps on the host memory a task holds)", CPU_MODE_FIX, True))
            return None
        except GpuError as exc:
            checks.append(Check("nvml", FAIL, str(exc), "check the driver with `nvidia-smi`", True))
            return None
        checks.append(Check("nvml", OK, f"driver {version}, {count} GPU(s)"))
    try:
        device = open_device(config.gpu, config.fake_gpu)
    except (GpuError, FreerideError) as exc:
        checks.append(Check("gpu", FAIL, str(exc), "pass --gpu with an index NVML lists (`nvidia-smi -L`)", True))
        return None
    i = device.info
    checks.append(Check("gpu", OK, f"GPU {i.index}: {i.name} ({i.uuid}), {i.total_bytes / 2**30:.1f} GiB"))
    mode = device.compute_mode()
    if mode == "PROHIBITED":
        checks.append(Check("compute-mode", FAIL, "compute mode PROHIBITED: no process may use this GPU",
                            f"sudo nvidia-smi -i {i.index} -c DEFAULT"))
    elif mode == "EXCLUSIVE_PROCESS" and config.mps == "off":
        checks.append(Check("compute-mode", WARN, "compute mode EXCLUSIVE_PROCESS: only one CUDA process (or one "
                            "MPS server) may use this GPU, so side tasks beside the trainer cannot",
                            f"use --mps start|use, or sudo nvidia-smi -i {i.index} -c DEFAULT"))
    elif mode == "EXCLUSIVE_PROCESS":
        checks.append(Check("compute-mode", WARN, "compute mode EXCLUSIVE_PROCESS: --no-mps tasks cannot run here "
                            "(only MPS clients share the GPU)", f"sudo nvidia-smi -i {i.index} -c DEFAULT to allow "
                            "time-sliced tasks"))
    else:
        checks.append(Check("compute-mode", OK, f"compute mode {mode}"))
    return device


def _cpu_mode(checks: list[Check]) -> bool:
    return any(c.name == "nvml" and c.status == INFO for c in checks)


def _cpu_mode_mps_check(config: AgentConfig, checks: list[Check]) -> None:
    if config.mps == "off":
        checks.append(Check("mps", OK, "MPS off (--mps off): there is no GPU to share"))
    else:  # the agent warns and goes on without MPS (gpu/control.py)
        checks.append(Check("mps", WARN, f"--mps {config.mps} is ignored in CPU mode: there is no GPU",
                            "leave --mps off on a host without a GPU"))


def _mps_checks(config: AgentConfig, device: Device | None, checks: list[Check]) -> None:
    if config.mps == "off":
        checks.append(Check("mps", OK, "MPS off (--mps off): side tasks time-slice with the trainer"))
        return
    argv = shlex.split(config.mps_control)
    if shutil.which(argv[0]) is None:
        checks.append(Check("mps-control", FAIL, f"MPS control program {argv[0]!r} not found",
                            "install the NVIDIA driver utilities (nvidia-cuda-mps-control) or pass --mps-control PATH"))
        return
    checks.append(Check("mps-control", OK, f"control program {shutil.which(argv[0])}"))
    pipe, logd = config.mps_pipe_path, config.mps_log_path
    checks.append(_dir_check("mps-pipe-dir", pipe, must_exist=config.mps == "use"))
    control = MpsControl(config.mps_control, pipe, logd, timeout_s=5.0)
    if control.alive():
        checks.append(Check("mps-daemon", OK, f"an MPS control daemon answers at {pipe}"))
    elif config.mps == "use":
        checks.append(Check("mps-daemon", FAIL, f"no MPS control daemon answers at {pipe} (--mps use)",
                            f"CUDA_MPS_PIPE_DIRECTORY={pipe} nvidia-cuda-mps-control -d, or use --mps start"))
    else:
        checks.append(Check("mps-daemon", OK, f"none answers at {pipe} yet: the agent will start one (--mps start)"))


def _dir_check(name: str, path: Path, must_exist: bool = False) -> Check:
    """A directory the agent writes: it must exist or be creatable, be writable, and not be open to everyone."""
    if not path.exists():
        if must_exist:
            return Check(name, FAIL, f"{path} does not exist", f"create it: mkdir -p {path}")
        parent = next((p for p in path.parents if p.exists()), Path("/"))
        if not os.access(parent, os.W_OK | os.X_OK):
            return Check(name, FAIL, f"{path} does not exist and {parent} is not writable by this user",
                         f"sudo install -d -o {os.getuid()} -m 0700 {path}, or pick another directory")
        return Check(name, OK, f"{path} will be created")
    if not path.is_dir():
        return Check(name, FAIL, f"{path} is not a directory", "remove it or pick another directory")
    if not os.access(path, os.W_OK | os.X_OK):
        return Check(name, FAIL, f"{path} is not writable by this user (uid {os.getuid()})",
                     f"sudo chown {os.getuid()} {path}, or pick another directory")
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & stat.S_IWOTH and not mode & stat.S_ISVTX:
        return Check(name, WARN, f"{path} is writable by every user (mode {mode:o})",
                     f"chmod o-w {path}: anyone could replace the sockets in it")
    return Check(name, OK, f"{path} (mode {mode:o})")


def disk_check(state_dir: Path, warn_percent: int) -> Check:
    """How full the state directory's file system is: a warning from `warn_percent` on, before it is full (a full
    one keeps tasks waiting and the database unwritten until space is freed)."""
    try:
        u = disk.usage(state_dir)
    except OSError as exc:
        return Check("state-disk", WARN, f"the space of {state_dir}'s file system is unknown: {exc}")
    detail = (f"{state_dir}: {u.used_ratio:.0%} of {format_size(u.total_bytes)} used, "
              f"{format_size(u.free_bytes) if u.free_bytes else '0 B'} free")
    if u.used_ratio * 100 >= warn_percent:
        return Check("state-disk", WARN, f"{detail} (at or above --disk-warn-percent {warn_percent})",
                     "free space: `freeride prune --older-than 7d` (or --retention 7d), `freeride rm ID`, a lower "
                     "--log-total-bytes, or a larger disk; when it is full, tasks wait and submissions are refused")
    return Check("state-disk", OK, detail)


def failed(checks: list[Check]) -> bool:
    return any(c.status == FAIL for c in checks)


def as_json(checks: list[Check]) -> dict[str, object]:
    return {"ok": not failed(checks), "checks": [{k: v for k, v in asdict(c).items() if k != "gpu_presence"}
                                                 for c in checks]}


def format_line(c: Check) -> str:
    return f"[{c.status.upper():4}] {c.name}: {c.detail}" + (f" -> fix: {c.fix}" if c.fix else "")


def log_failures(config: AgentConfig) -> None:
    """At agent start: one log line per failed or worrying check (GPU absence is reported by the GPU layer)."""
    try:
        checks = run_checks(config)
    except Exception:  # the doctor must never keep the agent from starting
        log.exception("start-up checks failed to run")
        return
    for c in checks:
        if c.status in (FAIL, WARN) and not c.gpu_presence:
            (log.error if c.status == FAIL else log.warning)("doctor: %s", format_line(c))
