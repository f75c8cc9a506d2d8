"""The Slurm prolog/epilog: run as slurmd runs them (fake SLURM_* variables), the prolog leaves one
serving agent per job GPU, the epilog stops them all and leaves no process behind, and neither
ever fails (a failing prolog or epilog drains the node)."""

from __future__ import annotations

import os
import select
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from support.cli import clean_env
from support.deploy_files import DEPLOY, REPO

from freeride.client import AgentClient
from freeride.tooling.harness import wait_for_task
from freeride.v1 import tasks_pb2

SLURM = DEPLOY / "slurm"
SCRIPTS = sorted(SLURM.glob("*.sh"))
TASKS = REPO / "tests" / "tasks" / "behaviours.py"


@pytest.fixture
def root() -> Iterator[Path]:
    """A short directory (unix socket paths are limited to ~100 bytes; pytest's tmp_path is long)."""
    path = Path(tempfile.mkdtemp(prefix="frs-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _slurm_env(root: Path, job_id: str, gpus: str, freeride_bin: Path | None = None) -> dict[str, str]:
    if freeride_bin is None:  # the installed `freeride` command, here this interpreter's
        freeride_bin = root / "freeride"
        freeride_bin.write_text(f'#!/bin/sh\nexec {sys.executable} -m freeride "$@"\n')
        freeride_bin.chmod(0o755)
    env = {k: v for k, v in clean_env(columns=None).items() if not k.startswith(("SLURM_", "CUDA_"))}
    return env | {
        "SLURM_JOB_ID": job_id, "SLURM_JOB_GPUS": gpus, "SLURM_JOB_UID": str(os.getuid()),
        "SLURM_JOB_GID": str(os.getgid()), "SLURM_JOB_USER": "tester",
        "FREERIDE_BIN": str(freeride_bin), "FREERIDE_ENV_FILE": str(DEPLOY / "systemd" / "freeride.env"),
        "FREERIDE_SLURM_RUN_ROOT": str(root / "run"), "FREERIDE_SLURM_STATE_ROOT": str(root / "lib"),
    }


def _run(script: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SLURM / script)], env=env, capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)


def _gone(pid: int, timeout_s: float = 30.0) -> bool:
    """True once `pid` has exited (a zombie counts): a pidfd becomes readable then, so no polling."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], timeout_s)[0])
    finally:
        os.close(fd)


def _processes_mentioning(text: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        if proc.info["status"] != psutil.STATUS_ZOMBIE and text in " ".join(proc.info["cmdline"] or []):
            found.append(proc)
    return found


def test_prolog_starts_one_agent_per_job_gpu_and_epilog_stops_them_all(root: Path) -> None:
    env = _slurm_env(root, "4242", "2,5")
    job_run, job_state = root / "run" / "job4242", root / "lib" / "job4242"
    try:
        prolog = _run("prolog.sh", env)
        assert prolog.returncode == 0, prolog.stderr
        pids = {}
        for k, gpu in enumerate((2, 5)):  # agent k serves the job's k-th GPU, physical index `gpu`
            with AgentClient(f"unix:{job_run}/agent-gpu{k}.sock", timeout_s=10) as client:
                assert client.health() == 1  # SERVING as soon as the prolog returns
            pid = int((job_state / f"gpu{gpu}" / "agent.pid").read_text())
            assert psutil.Process(pid).cmdline()[-6:-4] == ["--gpu", str(gpu)]
            pids[gpu] = pid
        assert stat.S_IMODE(job_run.stat().st_mode) == 0o700  # only the job's user reaches the sockets

        # The job's tasks are told where their agents are.
        task_prolog = _run("task-prolog.sh", env)
        assert f"export FREERIDE_SOCKET_DIR={job_run}\n" in task_prolog.stdout
        assert "export CUDA_MPS_PIPE_DIRECTORY=/run/nvidia-mps" in task_prolog.stdout

        # A side task with a live worker process: the epilog must stop it too.
        with AgentClient(f"unix:{job_run}/agent-gpu1.sock") as client:
            info = client.submit(tasks_pb2.TaskSpec(ref=f"{TASKS}:Counter"))
            wait_for_task(client, info.id, [tasks_pb2.TASK_STATE_READY])
        workers = {p.pid for p in _processes_mentioning(str(job_run))} - set(pids.values())
        assert len(workers) == 1  # the side task's worker, started with --agent unix:<job's socket>

        epilog = _run("epilog.sh", env)
        assert epilog.returncode == 0, epilog.stderr
        assert epilog.stderr.count("stopped") == 2 and "ERROR" not in epilog.stderr, epilog.stderr
        assert "leftover" not in epilog.stderr  # the agents stopped their workers themselves, in order
        # SIGTERMed and waited for, or SIGKILLed by the epilog: each ends (at once; 30 s only bounds a hang).
        assert all(_gone(pid) for pid in [*pids.values(), *workers])
        assert _processes_mentioning(str(root)) == []  # nothing left: no agent, no worker
        assert not job_run.exists()
        assert (job_state / "gpu5" / "freeride.db").exists()  # the ledger outlives the job
    finally:
        for proc in _processes_mentioning(str(root)):
            proc.kill()


def test_prolog_and_epilog_never_fail_the_job(root: Path) -> None:
    """Broken freeride, no GPUs, an epilog with nothing to stop: exit 0 every time, with a log line."""
    broken = _slurm_env(root, "7", "0", freeride_bin=root / "missing" / "freeride")
    prolog = _run("prolog.sh", broken)
    assert prolog.returncode == 0 and "ERROR" in prolog.stderr and "not executable" in prolog.stderr
    assert _processes_mentioning(str(root)) == []

    no_gpus = _run("prolog.sh", _slurm_env(root, "8", ""))
    assert no_gpus.returncode == 0 and "no GPUs allocated" in no_gpus.stderr
    assert not (root / "run" / "job8").exists()

    for job in ("7", "8"):
        assert _run("epilog.sh", _slurm_env(root, job, "0")).returncode == 0


def test_agent_that_never_serves_is_logged_and_the_job_still_starts(root: Path) -> None:
    failing = root / "freeride-broken"
    failing.write_text("#!/bin/sh\necho 'freeride: error: cannot open the GPU' >&2\nexit 2\n")
    failing.chmod(0o755)
    env = _slurm_env(root, "9", "1", freeride_bin=failing) | {"FREERIDE_SLURM_START_S": "2"}
    prolog = _run("prolog.sh", env)
    assert prolog.returncode == 0
    assert "agent for GPU 1 did not serve" in prolog.stderr
    assert _run("epilog.sh", env).returncode == 0


def test_scripts_are_valid_bash_and_pass_shellcheck() -> None:
    for script in SCRIPTS:
        subprocess.run(["bash", "-n", str(script)], check=True, timeout=30)
        if script.name != "common.sh":
            assert os.access(script, os.X_OK), f"{script.name} must be executable"
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck not installed (Debian package `shellcheck`; ./dev.sh test installs it as root)")
    result = subprocess.run([shellcheck, "-x", *map(str, SCRIPTS)], capture_output=True, text=True, timeout=60,
                            cwd=SLURM)
    assert result.returncode == 0, result.stdout
