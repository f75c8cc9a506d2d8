"""The systemd units: systemd itself accepts them, and the agent started exactly as the unit starts it
tells systemd READY=1 once it serves, STOPPING=1 on SIGTERM, and exits 0 within TimeoutStopSec."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from support.deploy_files import DEPLOY, Unit, parse_environment, read_env_file, specifiers

from freeride.agent import _systemd
from freeride.agent.config import AgentConfig, declared
from freeride.client import AgentClient

SYSTEMD = DEPLOY / "systemd"
AGENT_BIN = "/opt/freeride/bin/freeride"  # where docs/deploy.md installs the CLI
MPS_BIN = "/usr/bin/nvidia-cuda-mps-control"
def _systemd_analyze() -> str:
    path = shutil.which("systemd-analyze")
    if path is None:
        pytest.skip("systemd-analyze not installed (Debian package `systemd`; ./dev.sh test installs it as root)")
    return path


def test_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    """`systemd-analyze verify` loads the units as systemd would and reports any key it rejects.

    verify also requires each Exec binary to exist: the copies verified here point the agent's and
    MPS's binaries at /bin/true, and that is the only change made to them.
    """
    analyze = _systemd_analyze()
    for name in ("freeride-agent@.service", "nvidia-mps.service"):
        text = (SYSTEMD / name).read_text()
        assert AGENT_BIN in text or MPS_BIN in text
        (tmp_path / name).write_text(text.replace(AGENT_BIN, "/bin/true").replace(MPS_BIN, "/bin/true"))
    result = subprocess.run(
        [analyze, "verify", "--man=no", "./freeride-agent@0.service", "./freeride-agent@7.service",
         "./nvidia-mps.service"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )
    # Unknown keys and bad values are only warnings (exit 0): any output at all is a failure.
    assert result.returncode == 0 and not result.stderr.strip() and not result.stdout.strip(), (
        f"systemd-analyze verify:\n{result.stdout}{result.stderr}"
    )


def test_agent_unit_is_a_notify_service_ordered_after_the_gpu_daemons() -> None:
    unit = Unit(SYSTEMD / "freeride-agent@.service")
    assert unit.get("Service", "Type") == "notify"
    assert unit.get("Service", "Restart") == "on-failure"
    assert unit.get("Service", "KillMode") == "mixed"  # SIGTERM to the agent only: it stops its workers in order
    for key in ("After", "Wants"):
        wanted = " ".join(unit.all("Unit", key)).split()
        assert "nvidia-persistenced.service" in wanted and "nvidia-mps.service" in wanted
    assert unit.get("Service", "RuntimeDirectory") == "freeride"
    assert unit.get("Service", "StateDirectory") == "freeride/gpu%i"
    grace_s = float(read_env_file(SYSTEMD / "freeride.env")["FREERIDE_SHUTDOWN_GRACE_S"])
    assert float(unit.get("Service", "TimeoutStopSec")) >= grace_s + 10


def test_env_file_sets_only_variables_the_agent_reads() -> None:
    """A misspelt FREERIDE_* name would be silently ignored: every name must be a flag's twin."""
    known = {d.env for d in declared()} | {"FREERIDE_LOG_LEVEL"}
    path = SYSTEMD / "freeride.env"
    active = read_env_file(path)
    assert {k for k in active if k.startswith("FREERIDE_")} <= known
    for key in ("FREERIDE_GPU", "FREERIDE_STATE_DIR", "FREERIDE_SOCKET"):
        assert key not in active, f"{key} belongs to the unit (systemd owns the paths)"
    commented = {line.lstrip("#").split("=")[0] for line in path.read_text().splitlines()
                 if line.startswith("#FREERIDE_")}
    assert commented <= known
    defaults = AgentConfig()
    for d in declared():
        if (raw := active.get(d.env)) is not None and d.name not in ("state_dir", "socket"):
            assert type(getattr(defaults, d.name))(raw) == getattr(defaults, d.name), f"{d.name}: not the default"


def test_notify_reaches_an_abstract_namespace_socket() -> None:
    name = f"freeride-test-notify-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as listener:
        listener.bind("\0" + name)
        listener.settimeout(10)
        assert _systemd.notify("READY=1", "STATUS=ok", env={"NOTIFY_SOCKET": "@" + name})
        assert listener.recv(4096).decode().split("\n") == ["READY=1", "STATUS=ok"]


def test_notify_is_a_no_op_outside_systemd() -> None:
    assert not _systemd.notify("READY=1", env={})
    assert not _systemd.notify("READY=1", env={"NOTIFY_SOCKET": "vsock:2:1234"})  # unsupported: warn, go on
    assert not _systemd.notify("READY=1", env={"NOTIFY_SOCKET": "/nonexistent/notify"})


def _unit_command(unit: Unit, tmp_path: Path, gpu: str) -> tuple[list[str], dict[str, str], Path]:
    """ExecStart=, Environment= and EnvironmentFile= resolved the way systemd resolves them for the instance.

    Emulated: %t (/run) and %S (/var/lib) are directories under tmp_path; systemd creates
    RuntimeDirectory= and StateDirectory= before starting, so this does too; the installed
    /etc/default/freeride is the shipped freeride.env; the binary is this interpreter's freeride.
    """
    values = {"i": gpu, "I": gpu, "t": str(tmp_path / "run"), "S": str(tmp_path / "lib"), "n": f"freeride-agent@{gpu}"}
    override = tmp_path / "freeride-gpu.env"  # an operator's per-GPU file, read after the defaults
    override.write_text("# GPU-specific\nFREERIDE_LOG_FORMAT=json\n")
    installed = {"/etc/default/freeride": SYSTEMD / "freeride.env", f"/etc/default/freeride-gpu{gpu}": override}
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
    if "PYTHONPATH" in os.environ:  # a development checkout's freeride, as the test runs it
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    for key, base in (("RuntimeDirectory", "t"), ("StateDirectory", "S")):
        path = Path(values[base]) / specifiers(unit.get("Service", key), values)
        path.mkdir(parents=True)
        env[key.upper().replace("DIRECTORY", "_DIRECTORY")] = str(path)
    for line in unit.all("Service", "Environment"):
        env.update(parse_environment(specifiers(line, values)))
    for line in unit.all("Service", "EnvironmentFile"):  # files override Environment=, later files win
        optional, name = line.startswith("-"), specifiers(line.lstrip("-"), values)
        source = installed.get(name, Path(name))
        if not source.exists():
            assert optional, f"required EnvironmentFile {name} is missing"
            continue
        env.update(read_env_file(source))
    argv = [specifiers(word, values) for word in unit.get("Service", "ExecStart").split()]
    assert argv[0] == AGENT_BIN
    socket_path = Path(argv[argv.index("--socket") + 1])
    return [sys.executable, "-m", "freeride", *argv[1:]], env, socket_path


def test_agent_started_like_the_unit_notifies_ready_when_serving_and_stopping_on_sigterm(short_dir: Path) -> None:
    unit = Unit(SYSTEMD / "freeride-agent@.service")
    argv, env, sock = _unit_command(unit, short_dir, gpu="3")
    notify_path = short_dir / "notify"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as listener:
        listener.bind(str(notify_path))
        listener.settimeout(60)  # bounds a hang only; the datagram wakes the test
        env["NOTIFY_SOCKET"] = str(notify_path)
        log_path = short_dir / "journal.log"
        with open(log_path, "wb") as journal:
            proc = subprocess.Popen(argv, env=env, stdout=journal, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, cwd="/")
        try:
            ready = listener.recv(4096).decode().split("\n")
            assert ready[0] == "READY=1", f"{ready}\n{log_path.read_text()}"
            assert ready[1] == f"STATUS=serving GPU 3 on unix:{sock}"
            # READY=1 means serving: the health check answers at once, no waiting.
            with AgentClient(f"unix:{sock}", timeout_s=10) as client:
                assert client.health() == 1  # SERVING
            state_dir = short_dir / "lib" / "freeride" / "gpu3"
            assert (state_dir / "freeride.db").exists()  # the state lives where systemd keeps it

            proc.send_signal(getattr(signal, unit.get("Service", "KillSignal")))
            stopping = listener.recv(4096).decode().split("\n")
            assert stopping[0] == "STOPPING=1"
            code = proc.wait(timeout=float(unit.get("Service", "TimeoutStopSec")))
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert code == 0, log_path.read_text()
    assert not sock.exists()
    # The per-GPU file overrode the shared default (text): every journal line is a JSON object.
    lines = log_path.read_text().splitlines()
    assert lines and all(json.loads(line)["logger"] for line in lines)
    # Restart=on-failure must not restart a clean stop, and must not loop on a configuration error.
    assert "2" in unit.get("Service", "RestartPreventExitStatus").split()
