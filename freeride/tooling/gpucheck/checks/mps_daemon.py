"""`mps-daemon`: the MPS control daemon's life, every command's raw answer recorded (their formats are what
is unverified): `-d` in a private pipe and log directory, health, get_server_list, a client (a CUDA context on
a GPU run, a process whose environment names the pipe directory with --fake-gpu), get_client_list,
terminate_client, and `quit`, always.

On a GPU run it drives the real `nvidia-cuda-mps-control` and is skipped without it (never faked); with
--fake-gpu it drives the stand-in control program, and says so.
"""

from __future__ import annotations

import select
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from freeride.tooling.gpucheck import agents, procs
from freeride.tooling.gpucheck.checks.common import NO_MPS_BINARY, program_note
from freeride.tooling.gpucheck.model import CheckContext, Outcome, failed, passed, skipped

_HEALTH = "get_default_active_thread_percentage"  # the liveness probe the agent uses
_COMMAND_S = 15.0
_KEPT = ("rc", "stdout", "stderr", "duration_ms", "timed_out", "error")  # of each command's run


def pids(text: str) -> list[int]:
    return [int(tok) for tok in text.split() if tok.isdigit()]


class _Control:
    """The control program, each command's raw answer kept."""

    def __init__(self, program: str, env: dict[str, str]) -> None:
        self.argv = shlex.split(program)
        self.env = env
        self.log: list[dict[str, Any]] = []

    def send(self, command: str) -> dict[str, Any]:
        res = procs.run(self.argv, _COMMAND_S, env=self.env, stdin_text=command + "\n")
        entry = {"command": command, **{k: res[k] for k in _KEPT if k in res}}
        self.log.append(entry)
        return entry

    def start(self) -> dict[str, Any]:
        res = procs.run([*self.argv, "-d"], _COMMAND_S, env=self.env)
        entry = {"command": "-d", **{k: res[k] for k in _KEPT if k in res}}
        self.log.append(entry)
        return entry

    def wait_answering(self, timeout_s: float) -> tuple[bool, int, float]:
        """Bounded start-up retry, as the agent's: whether the daemon answered, after how many tries and ms."""
        t0 = time.monotonic()
        delay, tries = 0.01, 0
        while True:
            tries += 1
            if self.send(_HEALTH)["rc"] == 0:
                return True, tries, round((time.monotonic() - t0) * 1e3, 1)
            if time.monotonic() - t0 > timeout_s:
                return False, tries, round((time.monotonic() - t0) * 1e3, 1)
            time.sleep(delay)
            delay = min(delay * 2, 0.5)


def _client_code(ctx: CheckContext) -> str:
    ready = "print('ready', flush=True); sys.stdin.read()"
    if ctx.cuda:
        return (f"import sys, torch; x = torch.ones(1, device='cuda:{ctx.gpu}'); torch.cuda.synchronize(); "
                f"{ready}")
    return f"import sys; {ready}"


def _start_client(ctx: CheckContext, env: dict[str, str], timeout_s: float) -> tuple[subprocess.Popen[str], bool]:
    proc = subprocess.Popen([sys.executable, "-c", _client_code(ctx)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    return proc, bool(ready) and proc.stdout.readline().strip() == "ready"


def _end_client(proc: subprocess.Popen[str]) -> dict[str, Any]:
    if proc.poll() is None:
        proc.kill()
    _, err = proc.communicate()
    return {"exit_code": proc.returncode, "stderr_tail": procs.tail(err, lines=10)}


def _log_tails(logd: Path) -> dict[str, str]:
    return {p.name: procs.tail(p.read_text(errors="replace"), lines=30) for p in sorted(logd.glob("*.log"))}


def mps_daemon(ctx: CheckContext) -> Outcome:
    program = ctx.mps_program()
    if program is None:
        return skipped(NO_MPS_BINARY)
    pipe, logd = agents.mps_dirs(ctx.work)
    for d in (pipe, logd):
        d.mkdir(parents=True, exist_ok=True)
        d.chmod(0o755)
    env = procs.child_env({"CUDA_MPS_PIPE_DIRECTORY": str(pipe), "CUDA_MPS_LOG_DIRECTORY": str(logd)})
    control = _Control(program, env)
    details: dict[str, Any] = {**program_note(ctx, program), "pipe_dir": str(pipe), "log_dir": str(logd),
                               "commands": control.log}
    problems: list[str] = []
    started = control.start()
    if started["rc"] != 0:
        problems.append(f"-d exited {started['rc']}: {procs.last_line(started['stderr'] or '')}")
    else:
        try:
            _daemon_life(ctx, control, env, details, problems)
        finally:
            quit_answer = control.send("quit")  # always: a daemon left running would outlive the check
            if quit_answer["rc"] != 0:
                problems.append(f"quit exited {quit_answer['rc']}: {procs.last_line(quit_answer['stderr'])}")
            details["answered_after_quit"] = _answers_after_quit(control)
            if details["answered_after_quit"]:
                problems.append("the daemon still answered 5 s after quit")
    details["logs"] = _log_tails(logd)
    ms = details.get("health", {}).get("ms_to_answer", 0.0)
    return _verdict(problems, details, f"up in {ms:.0f} ms; server(s) {details.get('servers')}, client "
                                       f"{details.get('client', {}).get('pid', '-')} listed; terminate_client "
                                       f"answered {details.get('terminate_client_answer')}; quit ok")


def _daemon_life(ctx: CheckContext, control: _Control, env: dict[str, str], details: dict[str, Any],
                 problems: list[str]) -> None:
    """Health, servers, a client, its listing and terminate_client; each answer recorded, each problem said."""
    up, tries, ms = control.wait_answering(10.0)
    details["health"] = {"answered": up, "tries": tries, "ms_to_answer": ms}
    if not up:
        problems.append(f"the daemon never answered {_HEALTH} within 10 s of -d")
        return
    details["servers_before_client"] = pids(control.send("get_server_list")["stdout"])
    client, ready = _start_client(ctx, env, min(60.0, ctx.left_s(margin_s=15)))
    details["client"] = {"pid": client.pid, "ready": ready, "cuda_context": ctx.cuda}
    try:
        if not ready:
            problems.append("the client process did not come up" + (" (a CUDA context under MPS)" if ctx.cuda else ""))
            return
        servers = pids(control.send("get_server_list")["stdout"])
        details["servers"] = servers
        clients = {s: pids(control.send(f"get_client_list {s}")["stdout"]) for s in servers}
        details["clients"] = {str(s): c for s, c in clients.items()}
        details["server_processes"] = _server_processes(Path(env["CUDA_MPS_PIPE_DIRECTORY"]))
        owner = next((s for s, cs in clients.items() if client.pid in cs), None)
        client_ran = ctx.cuda or ctx.fake  # a real daemon starts a server only for a CUDA client
        if client_ran and not servers:
            problems.append("get_server_list listed no server while a client ran")
        elif client_ran and owner is None:
            problems.append(f"get_client_list did not list the client {client.pid} under any server {servers}")
        if owner is None:
            return
        answer = control.send(f"terminate_client {owner} {client.pid}")
        out = answer["stdout"].strip().splitlines()
        details["terminate_client_answer"] = out
        if answer["rc"] != 0 or (out and out[-1].strip() != "0"):
            problems.append(f"terminate_client answered {out!r} (exit code {answer['rc']}); the agent expects '0'")
        try:
            details["client_exit_after_terminate"] = client.wait(2)
        except subprocess.TimeoutExpired:
            details["client_exit_after_terminate"] = "still running 2 s after terminate_client"
    finally:
        details["client"]["end"] = _end_client(client)


def _answers_after_quit(control: _Control) -> bool:
    """Whether the daemon still answers once `quit` returned (it may take a moment to go)."""
    deadline = time.monotonic() + 5.0
    while control.send(_HEALTH)["rc"] == 0:
        if time.monotonic() > deadline:
            return True
        time.sleep(0.2)
    return False


def _server_processes(pipe: Path) -> list[dict[str, Any]]:
    """The daemon's processes: an MPS server (or the stand-in) whose environment names this pipe directory."""
    out = []
    for p in psutil.process_iter(["pid", "name", "cmdline"]):
        name = p.info.get("name") or ""
        if "mps" not in name and "_fake_mps_control" not in " ".join(p.info.get("cmdline") or []):
            continue
        try:
            if p.environ().get("CUDA_MPS_PIPE_DIRECTORY") == str(pipe):
                out.append({"pid": p.info["pid"], "name": name, "cmdline": " ".join(p.info.get("cmdline") or [])[:120]})
        except psutil.Error:
            continue
    return out


def _verdict(problems: list[str], details: dict[str, Any], summary: str) -> Outcome:
    prefix = "stand-in: " if details.get("stand_in") else ""
    if problems:
        return failed(prefix + "; ".join(problems), **details)
    return passed(prefix + summary, **details)
