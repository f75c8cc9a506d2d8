"""CUDA MPS: drive one control daemon per GPU through its control program, and give workers their MPS env.

The control program (`nvidia-cuda-mps-control`, injectable for tests) reads text commands on
stdin and talks to the daemon whose control socket lives in $CUDA_MPS_PIPE_DIRECTORY. Every
call here is one short blocking subprocess: the agent runs them off its event loop.
"""

from __future__ import annotations

import logging
import os
import shlex
import subprocess
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from freeride.gpu.device import GpuError

log = logging.getLogger(__name__)

MODES = ("off", "start", "use")
_MiB = 2**20
_START_WAIT_S = 10.0  # how long a freshly started daemon may take to answer


class MpsError(GpuError):
    """The MPS control daemon cannot be reached or refused a command."""


@dataclass(frozen=True)
class MpsState:
    mode: str  # off | start | use
    running: bool = False
    started_here: bool = False  # this agent started the daemon (and quits it on shutdown)
    pipe_dir: str = ""
    log_dir: str = ""

    @property
    def label(self) -> str:
        if self.mode == "off":
            return "off"
        if not self.running:
            return "unavailable"
        return "started" if self.started_here else "existing"


class MpsControl:
    """One control daemon, addressed by its pipe directory."""

    def __init__(self, program: str, pipe_dir: Path, log_dir: Path, timeout_s: float = 30.0,
                 visible_devices: str = "") -> None:
        self.argv = shlex.split(program)
        self.pipe_dir = pipe_dir
        self.log_dir = log_dir
        self._timeout_s = timeout_s
        self._visible = visible_devices

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["CUDA_MPS_PIPE_DIRECTORY"] = str(self.pipe_dir)
        env["CUDA_MPS_LOG_DIRECTORY"] = str(self.log_dir)
        if self._visible:
            env["CUDA_VISIBLE_DEVICES"] = self._visible  # the daemon's servers see only this GPU
        return env

    def send(self, command: str) -> list[str]:
        """Run one control command; its output lines. MpsError when no daemon answers or it refuses."""
        try:
            res = subprocess.run(self.argv, input=command + "\n", capture_output=True, text=True,
                                 env=self._env(), timeout=self._timeout_s, check=False)
        except FileNotFoundError:
            raise MpsError(f"MPS control program {self.argv[0]!r} not found; install the NVIDIA driver utilities "
                           "or pass --mps-control PATH") from None
        except subprocess.TimeoutExpired:
            raise MpsError(f"MPS control command {command!r} took over {self._timeout_s:.0f}s") from None
        lines = [ln.strip() for ln in res.stdout.splitlines() if ln.strip()]
        if res.returncode != 0:
            detail = (res.stderr.strip() or " ".join(lines) or f"exit code {res.returncode}").splitlines()[-1]
            raise MpsError(f"MPS control daemon at {self.pipe_dir} did not run {command!r}: {detail}")
        return lines

    def alive(self) -> bool:
        """The cheap liveness probe NVIDIA's own MPS daemon wrapper uses."""
        try:
            self.send("get_default_active_thread_percentage")
        except MpsError:
            return False
        return True

    def start_daemon(self) -> None:
        """`nvidia-cuda-mps-control -d` with this pipe and log directory; returns once it answers."""
        for d in (self.pipe_dir, self.log_dir):
            d.mkdir(parents=True, exist_ok=True)
            os.chmod(d, 0o755)  # as NVIDIA's k8s MPS daemon does: clients of this user must reach the socket
        try:
            res = subprocess.run([*self.argv, "-d"], capture_output=True, text=True, env=self._env(),
                                 timeout=self._timeout_s, check=False, stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            raise MpsError(f"MPS control program {self.argv[0]!r} not found; install the NVIDIA driver utilities "
                           "or pass --mps-control PATH") from None
        if res.returncode != 0:
            detail = (res.stderr.strip() or res.stdout.strip() or f"exit code {res.returncode}").splitlines()[-1]
            raise MpsError(f"starting the MPS control daemon failed: {detail}")
        deadline = time.monotonic() + _START_WAIT_S
        delay = 0.01
        while not self.alive():  # daemonising returns before the socket is up: bounded start-up retry
            if time.monotonic() > deadline:
                raise MpsError(f"the MPS control daemon started but does not answer at {self.pipe_dir} "
                               f"(see {self.log_dir}/control.log)")
            time.sleep(delay)
            delay = min(delay * 2, 0.5)

    def quit(self) -> None:
        self.send("quit")

    def servers(self) -> list[int]:
        return _pids(self.send("get_server_list"))

    def clients(self, server_pid: int) -> list[int]:
        return _pids(self.send(f"get_client_list {server_pid}"))

    def client_servers(self) -> dict[int, int]:
        """Every client process id -> the server process id it belongs to."""
        return {c: s for s in self.servers() for c in self.clients(s)}

    def terminate_client(self, server_pid: int, client_pid: int) -> None:
        """Cancel a client's outstanding GPU work (Volta+); it is then safe to SIGKILL it."""
        out = self.send(f"terminate_client {server_pid} {client_pid}")
        if out and out[-1] != "0":
            raise MpsError(f"terminate_client {server_pid} {client_pid} answered {out[-1]!r}")


def _pids(lines: Iterable[str]) -> list[int]:
    return [int(tok) for ln in lines for tok in ln.split() if tok.isdigit()]


class Mps:
    """The agent's MPS mode: off, start (our own daemon, or one found already running), or use an existing one."""

    def __init__(self, mode: str, control: MpsControl) -> None:
        if mode not in MODES:
            raise MpsError(f"--mps must be one of {', '.join(MODES)}, got {mode!r}")
        self.mode = mode
        self.control = control
        self._running = False
        self._started_here = False

    def open(self) -> None:
        if self.mode == "off":
            return
        if self.control.alive():
            self._running = True
            log.info("MPS: using the control daemon already answering at %s", self.control.pipe_dir)
            return
        if self.mode == "use":
            raise MpsError(f"--mps use: no MPS control daemon answers at {self.control.pipe_dir}; start one "
                           "(nvidia-cuda-mps-control -d with that CUDA_MPS_PIPE_DIRECTORY) or use --mps start")
        self.control.start_daemon()
        self._running = self._started_here = True
        log.info("MPS: started a control daemon (pipe %s, log %s)", self.control.pipe_dir, self.control.log_dir)

    def state(self) -> MpsState:
        return MpsState(self.mode, self._running, self._started_here, str(self.control.pipe_dir),
                        str(self.control.log_dir))

    @property
    def active(self) -> bool:
        return self._running

    def stop_clients(self, pids: Iterable[int]) -> list[tuple[int, int]]:
        """terminate_client every MPS client among pids (a worker and its children); the (server, client) pairs."""
        if not self._running:
            return []
        wanted = set(pids)
        done = []
        for client, server in self.control.client_servers().items():
            if client in wanted:
                self.control.terminate_client(server, client)
                done.append((server, client))
        return done

    def close(self) -> None:
        if self._started_here and self._running:
            try:
                self.control.quit()
                log.info("MPS: control daemon at %s stopped", self.control.pipe_dir)
            except MpsError as exc:
                log.warning("MPS: quitting the control daemon failed: %s", exc)
        self._running = False


def worker_env(
    base: Mapping[str, str],
    *,
    gpu_uuid: str,
    pipe_dir: Path | None,
    log_dir: Path | None,
    no_mps_pipe_dir: Path,
    mem_limit_bytes: int,
    thread_percentage: int,
    use_mps: bool,
) -> dict[str, str]:
    """A worker's environment on a GPU: only its GPU visible, and its MPS client settings or none at all.

    Set before the worker creates a CUDA context, which is when an MPS client reads them. With one
    GPU visible its ordinal is 0, so the pinned limit is written `0=<N>M`.
    """
    env = {k: v for k, v in base.items() if not k.startswith("CUDA_MPS_")}
    if gpu_uuid:
        env["CUDA_VISIBLE_DEVICES"] = gpu_uuid
    if not use_mps or pipe_dir is None:
        # A pipe directory with no daemon: the CUDA runtime finds no MPS and runs the process time-sliced.
        env["CUDA_MPS_PIPE_DIRECTORY"] = str(no_mps_pipe_dir)
        return env
    env["CUDA_MPS_PIPE_DIRECTORY"] = str(pipe_dir)
    if log_dir is not None:
        env["CUDA_MPS_LOG_DIRECTORY"] = str(log_dir)
    env["CUDA_MPS_CLIENT_PRIORITY"] = "1"  # below the trainer's NORMAL
    if mem_limit_bytes > 0:
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={max(1, mem_limit_bytes // _MiB)}M"
    if thread_percentage > 0:
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(thread_percentage)
    return env
