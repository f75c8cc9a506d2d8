"""A stand-in for `nvidia-cuda-mps-control` that speaks the same text commands, for tests and --fake-gpu.

    python -m freeride.gpu._fake_mps_control -d     # start a daemon for $CUDA_MPS_PIPE_DIRECTORY
    echo get_server_list | python -m freeride.gpu._fake_mps_control

Like the real one: the daemon listens on `$CUDA_MPS_PIPE_DIRECTORY/control` (a unix socket) and
writes `nvidia-cuda-mps-control.pid` there; a second `-d` on the same directory fails; without a
daemon a command exits 1. Clients are the live processes of this user whose environment has this
pipe directory (what would connect at CUDA init); the daemon's own pid stands in for the one
server, listed once a client exists. Every command is appended to
`$CUDA_MPS_LOG_DIRECTORY/control.log` as `<unix time> <command>`; terminate_client adds whether
the client was still alive (`alive=1`): terminating must come before killing.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil

_PID_FILE = "nvidia-cuda-mps-control.pid"
_CONTROL = "control"  # the daemon's socket in the pipe directory


def _dirs() -> tuple[Path, Path]:
    pipe = Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps"))
    logd = Path(os.environ.get("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps"))
    return pipe, logd


def _clients(pipe: Path) -> list[int]:
    me = os.getpid()
    out = []
    for p in psutil.process_iter():
        if p.pid == me:
            continue
        try:
            if (p.environ().get("CUDA_MPS_PIPE_DIRECTORY") == str(pipe) and p.status() != psutil.STATUS_ZOMBIE
                    and not any("_fake_mps_control" in a for a in p.cmdline())):
                out.append(p.pid)
        except psutil.Error:
            continue
    return out


class _Daemon:
    def __init__(self, pipe: Path, logd: Path) -> None:
        self.pipe = pipe
        self.log = logd / "control.log"
        self.settings: dict[str, str] = {"active_thread_percentage": "100.0", "client_priority": "0"}
        self.running = True
        self._stopped = False

    def record(self, line: str) -> None:
        with open(self.log, "a") as f:
            f.write(f"{time.time():.6f} {line}\n")

    def handle(self, line: str) -> str:
        self.record(line)
        cmd, *args = line.split()
        me = os.getpid()
        if cmd == "quit":
            self.running = False
            return ""
        if cmd == "get_server_list":
            return str(me) if _clients(self.pipe) else ""
        if cmd in ("get_client_list", "get_device_client_list"):
            return "\n".join(map(str, _clients(self.pipe))) if args and args[0] == str(me) else ""
        if cmd == "ps":
            return "\n".join(f"{c} 0 GPU-fake {me} {c}" for c in _clients(self.pipe))
        if cmd == "terminate_client":
            if len(args) != 2 or not all(a.isdigit() for a in args):
                return "error: usage terminate_client <server PID> <client PID>"
            alive = psutil.pid_exists(int(args[1]))
            self.record(f"terminated {args[1]} alive={int(alive)}")
            return "0"
        if cmd.startswith("get_default_"):
            return self.settings.get(cmd.removeprefix("get_default_"), "")
        if cmd.startswith("set_default_") and args:
            self.settings[cmd.removeprefix("set_default_")] = " ".join(args)
            return ""
        return f"error: unknown command {cmd}"

    def serve(self) -> None:
        sock_path = self.pipe / _CONTROL
        with contextlib.suppress(FileNotFoundError):
            sock_path.unlink()
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        srv.bind(str(sock_path))
        srv.listen(16)
        (self.pipe / _PID_FILE).write_text(str(os.getpid()))
        self.record("daemon started")
        try:
            while self.running:
                conn, _ = srv.accept()
                with conn, conn.makefile("rw") as f:
                    for line in f:
                        if line.strip():
                            answer = self.handle(line.strip())
                            if not self.running:
                                self._stop(srv)  # before the answer: a `quit` that returned finds it stopped
                            f.write(answer + "\n\x00\n")  # NUL line: end of this answer
                            f.flush()
                        if not self.running:
                            break
        finally:
            self._stop(srv)

    def _stop(self, srv: socket.socket) -> None:
        if self._stopped:
            return
        self._stopped = True
        srv.close()
        (self.pipe / _CONTROL).unlink(missing_ok=True)
        (self.pipe / _PID_FILE).unlink(missing_ok=True)
        self.record("daemon stopped")


def read_log(logd: Path) -> list[str]:
    """The commands the stand-in received and what it did, in order, without their timestamps."""
    return [ln.split(" ", 1)[1] for ln in (logd / "control.log").read_text().splitlines()]


def _running_pid(pipe: Path) -> int:
    try:
        pid = int((pipe / _PID_FILE).read_text())
    except (OSError, ValueError):
        return 0
    return pid if psutil.pid_exists(pid) else 0


def _start(pipe: Path, logd: Path) -> int:
    if _running_pid(pipe):
        print("An instance of this daemon is already running", file=sys.stderr)
        return 1
    pipe.mkdir(parents=True, exist_ok=True)
    logd.mkdir(parents=True, exist_ok=True)
    subprocess.Popen([sys.executable, "-m", __spec__.name if __spec__ else "freeride.gpu._fake_mps_control",
                      "--serve"], start_new_session=True, stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True)
    return 0  # like `-d`: returns once daemonised, before the socket is up


def _client(pipe: Path) -> int:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(str(pipe / _CONTROL))
    except OSError:
        print("Cannot find MPS control daemon process", file=sys.stderr)
        return 1
    with s, s.makefile("rw") as f:
        for line in sys.stdin:
            if not line.strip():
                continue
            f.write(line.strip() + "\n")
            f.flush()
            answer = []
            for reply in f:
                if reply == "\x00\n":
                    break
                answer.append(reply.rstrip("\n"))
            text = "\n".join(a for a in answer if a)
            if text:
                print(text)
            if text.startswith("error:"):
                return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    pipe, logd = _dirs()
    if args == ["-d"]:
        return _start(pipe, logd)
    if args == ["--serve"]:
        _Daemon(pipe, logd).serve()
        return 0
    if args:
        print(f"unsupported arguments {args}", file=sys.stderr)
        return 2
    return _client(pipe)


if __name__ == "__main__":
    sys.exit(main())
