"""Specification of MPS handling, against the stand-in control program (same text commands, same -d semantics)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from freeride.gpu._fake_mps_control import read_log
from freeride.gpu.mps import Mps, MpsControl, MpsError, worker_env

STAND_IN = f"{sys.executable} -m freeride.gpu._fake_mps_control"


@pytest.fixture
def mps_dirs() -> Iterator[tuple[Path, Path]]:
    # Short: the control socket's path must fit a unix socket address.
    with tempfile.TemporaryDirectory(prefix="frmps-", dir="/tmp") as d:
        yield Path(d) / "pipe", Path(d) / "log"
        ctl = MpsControl(STAND_IN, Path(d) / "pipe", Path(d) / "log")
        if ctl.alive():
            ctl.quit()


def test_start_launches_a_daemon_that_answers_and_quits_it_on_close(mps_dirs: tuple[Path, Path]) -> None:
    pipe, logd = mps_dirs
    mps = Mps("start", MpsControl(STAND_IN, pipe, logd))
    mps.open()
    assert mps.state().label == "started"
    assert (pipe / "control").exists()
    assert oct(pipe.stat().st_mode & 0o777) == "0o755"
    mps.close()
    assert not mps.control.alive()
    assert read_log(logd)[-2:] == ["quit", "daemon stopped"]


def test_start_detects_a_running_daemon_uses_it_and_leaves_it_running(mps_dirs: tuple[Path, Path]) -> None:
    pipe, logd = mps_dirs
    theirs = MpsControl(STAND_IN, pipe, logd)
    theirs.start_daemon()
    with pytest.raises(MpsError, match="already running"):
        theirs.start_daemon()  # a second -d on the same pipe directory is refused, as the real one does
    mps = Mps("start", MpsControl(STAND_IN, pipe, logd))
    mps.open()
    assert mps.state().label == "existing"
    mps.close()
    assert theirs.alive()  # not ours to quit
    assert "quit" not in read_log(logd)


def test_use_without_a_daemon_fails_with_what_to_do(mps_dirs: tuple[Path, Path]) -> None:
    pipe, logd = mps_dirs
    with pytest.raises(MpsError, match=r"--mps use: no MPS control daemon answers at .*use --mps start"):
        Mps("use", MpsControl(STAND_IN, pipe, logd)).open()


def test_a_missing_control_program_is_named() -> None:
    with pytest.raises(MpsError, match="'/nonexistent/nvidia-cuda-mps-control' not found"):
        MpsControl("/nonexistent/nvidia-cuda-mps-control", Path("/tmp/x"), Path("/tmp/y")).send("get_server_list")


def test_clients_are_listed_per_server_and_terminated_by_pid(mps_dirs: tuple[Path, Path]) -> None:
    pipe, logd = mps_dirs
    mps = Mps("start", MpsControl(STAND_IN, pipe, logd))
    mps.open()
    assert mps.control.servers() == []  # no server before the first client
    env = worker_env(os.environ, gpu_uuid="", pipe_dir=pipe, log_dir=logd, no_mps_pipe_dir=pipe.parent / "none",
                     mem_limit_bytes=0, thread_percentage=0, use_mps=True)
    outsider = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    client = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    try:
        (server,) = mps.control.servers()
        assert mps.control.clients(server) == [client.pid]
        assert mps.stop_clients([outsider.pid]) == []
        assert mps.stop_clients([client.pid, outsider.pid]) == [(server, client.pid)]
        assert f"terminate_client {server} {client.pid}" in read_log(logd)
        assert f"terminated {client.pid} alive=1" in read_log(logd)
    finally:
        for p in (client, outsider):
            p.kill()
            p.wait()
        mps.close()


def test_a_worker_env_carries_its_mps_client_settings() -> None:
    base = {"PATH": "/bin", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=99G", "CUDA_MPS_PIPE_DIRECTORY": "/tmp/nvidia-mps"}
    env = worker_env(base, gpu_uuid="GPU-1234", pipe_dir=Path("/run/fr/pipe"), log_dir=Path("/run/fr/log"),
                     no_mps_pipe_dir=Path("/run/fr/no-mps"), mem_limit_bytes=3 * 2**30 + 5, thread_percentage=30,
                     use_mps=True)
    assert env == {
        "PATH": "/bin",
        "CUDA_VISIBLE_DEVICES": "GPU-1234",
        "CUDA_MPS_PIPE_DIRECTORY": "/run/fr/pipe",
        "CUDA_MPS_LOG_DIRECTORY": "/run/fr/log",
        "CUDA_MPS_CLIENT_PRIORITY": "1",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=3072M",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30",
    }


def test_a_no_mps_worker_gets_no_client_settings_and_a_pipe_dir_with_no_daemon() -> None:
    base = {"PATH": "/bin", "CUDA_MPS_PIPE_DIRECTORY": "/tmp/nvidia-mps", "CUDA_MPS_CLIENT_PRIORITY": "0"}
    env = worker_env(base, gpu_uuid="GPU-1234", pipe_dir=Path("/run/fr/pipe"), log_dir=Path("/run/fr/log"),
                     no_mps_pipe_dir=Path("/run/fr/no-mps"), mem_limit_bytes=2**30, thread_percentage=30,
                     use_mps=False)
    assert env == {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "GPU-1234", "CUDA_MPS_PIPE_DIRECTORY": "/run/fr/no-mps"}


def test_side_tasks_get_half_the_sms_under_mps_by_default() -> None:
    # The default the second H200 run chose (docs/benchmarks.md, "Second GPU run"): 50 %, which took the trainer's
    # slowdown from +0.27 % to -0.07 %; 0 still means "not set" (every SM).
    from freeride.agent.config import AgentConfig

    default = AgentConfig().mps_thread_percentage
    assert default == 50
    env = worker_env({}, gpu_uuid="GPU-x", pipe_dir=Path("/run/fr/pipe"), log_dir=None,
                     no_mps_pipe_dir=Path("/run/fr/no-mps"), mem_limit_bytes=0, thread_percentage=default, use_mps=True)
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    unset = worker_env({}, gpu_uuid="GPU-x", pipe_dir=Path("/run/fr/pipe"), log_dir=None,
                       no_mps_pipe_dir=Path("/run/fr/no-mps"), mem_limit_bytes=0, thread_percentage=0, use_mps=True)
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in unset
