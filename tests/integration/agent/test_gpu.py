"""The GPU layer end to end on a real agent with the shipped fake GPU and the stand-in MPS control program:
memory admission, the workers' MPS environment, terminate_client before kill, telemetry, doctor."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support.agents import FAST, BackgroundTrainer, spec

from freeride.gpu._fake_mps_control import read_log
from freeride.gpu.mps import MpsControl
from freeride.tooling.harness import AgentProcess, wait_for_info, wait_for_task
from freeride.v1 import tasks_pb2

GiB = 2**30
MiB = 2**20
STAND_IN = f"{sys.executable} -m freeride.gpu._fake_mps_control"
LIVE = [tasks_pb2.TASK_STATE_READY, tasks_pb2.TASK_STATE_RUNNING]


def _agent(tmp_path: Path, *args: str) -> AgentProcess:
    return AgentProcess(state_dir=tmp_path / "state", extra_args=[*FAST, *args]).start()


@pytest.mark.parametrize("mode", [["--fake-gpu"], []], ids=["fake-gpu", "cpu"])
def test_every_worker_knows_the_index_of_its_agents_gpu(tmp_path: Path, mode: list[str]) -> None:
    agent = AgentProcess(state_dir=tmp_path / "state", gpu=3, extra_args=[*FAST, *mode]).start()
    try:
        with agent.client() as c:
            task = c.submit(tasks_pb2.TaskSpec(ref=spec("EnvDump").ref, args={"path": str(tmp_path / "env.json")}))
            wait_for_task(c, task.id, LIVE)  # setup() wrote the file before the worker said it is ready
    finally:
        assert agent.stop() == 0
    seen = json.loads((tmp_path / "env.json").read_text())
    assert (seen["env"]["FREERIDE_GPU"], seen["gpu"]) == ("3", 3)


def test_a_task_that_does_not_fit_waits_visibly_and_starts_when_memory_frees_up(tmp_path: Path) -> None:
    # 4 GiB GPU, 1 GiB used by others, 512 MiB headroom: side tasks may reserve 2.5 GiB.
    agent = _agent(tmp_path, "--fake-gpu", "name=Fake A100,total=4GiB,used=1GiB", "--headroom", "512MiB")
    try:
        with agent.client() as c:
            a = c.submit(tasks_pb2.TaskSpec(ref=spec("Counter").ref, mem_limit_bytes=2 * GiB))
            # a's worker up and idle first: its resident memory, read twice per admission (the fake's "NVML" and
            # the workers' share), no longer grows between the two reads as it does while the worker imports.
            wait_for_task(c, a.id, LIVE)
            b = c.submit(tasks_pb2.TaskSpec(ref=spec("Counter").ref, mem_limit_bytes=GiB))
            assert b.state == tasks_pb2.TASK_STATE_SUBMITTED
            # 2.5 GiB - 2 GiB reserved, less any drift of a's worker's memory between those two reads
            assert re.fullmatch(r"waiting for memory: needs 1024 MiB, (5[01]\d) MiB free for side tasks", b.reason)
            assert c.get(b.id).pid == 0  # not started to fail
            m = c.stats().gpu.memory
            assert (m.mode, m.name, m.total_bytes, m.mps) == ("fake", "Fake A100", 4 * GiB, "off")
            assert (m.side_tasks_reserved_bytes, m.waiting_tasks) == (2 * GiB, 1)
            assert 5 * GiB // 2 - 16 * MiB < m.usable_bytes <= 5 * GiB // 2
            # The trainer leaves only 1.5 GiB.
            with BackgroundTrainer(agent, [10.0], compute_ms=10.0, free_bytes=3 * GiB // 2) as trainer:
                wait_for_info(c, b.id, lambda t: "0 MiB free" in t.reason)
                c.cancel(a.id)  # frees 2 GiB, but the trainer's hint bounds side tasks to 1 GiB: b fits exactly
                wait_for_task(c, b.id, LIVE)
                small = c.submit(tasks_pb2.TaskSpec(ref=spec("Counter").ref, mem_limit_bytes=512 * MiB))
                assert small.reason.startswith("waiting for memory: needs 512 MiB, 0 MiB free")
                trainer.free_bytes = 3 * GiB  # the trainer's peak shrank: 2.5 GiB usable again
                wait_for_task(c, small.id, LIVE)
                stats = c.stats()
            m = stats.gpu.memory
            assert stats.gpu.trainer_free_memory_bytes == 3 * GiB
            assert m.trainer_peak_bytes == GiB
            assert (m.side_tasks_reserved_bytes, m.waiting_tasks) == (GiB + 512 * MiB, 0)
            # The fake's figure is each worker's RSS, as of the last watchdog sample (every 0.25 s): b has been
            # running for a while; `small` may have come up after the last sample.
            assert next(t for t in stats.tasks if t.id == b.id).memory_bytes > 0
            assert m.side_tasks_used_bytes > 0  # measured now; the tasks' figures are the last watchdog sample
            assert m.others_used_bytes == pytest.approx(GiB, abs=16 * MiB)  # the trainer's share
    finally:
        assert agent.stop() == 0


def test_a_waiting_task_starts_when_the_devices_free_memory_grows(tmp_path: Path) -> None:
    state = tmp_path / "gpu.json"
    state.write_text(json.dumps({"used_bytes": 3 * GiB + 768 * MiB}))  # 256 MiB free: none usable
    agent = _agent(tmp_path, "--fake-gpu", f"total=4GiB,file={state},mode=EXCLUSIVE_PROCESS", "--headroom", "256MiB")
    try:
        with agent.client() as c:
            t = c.submit(tasks_pb2.TaskSpec(ref=spec("Counter").ref, mem_limit_bytes=256 * MiB))
            assert t.reason.startswith("waiting for memory: needs 256 MiB")
            state.write_text(json.dumps({"used_bytes": GiB}))  # the trainer released memory
            wait_for_task(c, t.id, LIVE)
            state.write_text(json.dumps({"used_bytes": 4 * GiB}))  # full again
            gone = c.submit(tasks_pb2.TaskSpec(ref=spec("Counter").ref, mem_limit_bytes=256 * MiB))
            assert gone.reason.startswith("waiting for memory: needs 256 MiB, 0 MiB free")
            c.cancel(gone.id)  # a waiting task can be cancelled
            assert wait_for_task(c, gone.id, [tasks_pb2.TASK_STATE_CANCELLED]).pid == 0
            assert c.stats().gpu.memory.waiting_tasks == 0
    finally:
        assert agent.stop() == 0
    # The agent ran the doctor's checks at start and logged what is wrong, one line each.
    assert "doctor: [WARN] compute-mode: compute mode EXCLUSIVE_PROCESS" in agent.log_path.read_text()


def test_mps_workers_get_client_settings_untrusted_ones_none_and_a_capped_one_is_terminated_before_kill(
    tmp_path: Path, short_dir: Path
) -> None:
    pipe, logd = short_dir / "pipe", short_dir / "log"
    agent = _agent(tmp_path, "--fake-gpu", "total=8GiB", "--headroom", "0", "--mps", "start", "--mps-control", STAND_IN,
                   "--mps-pipe-dir", str(pipe), "--mps-log-dir", str(logd), "--mps-thread-percentage", "25")
    try:
        with agent.client() as c:
            assert c.stats().gpu.memory.mps == "started"
            trusted = c.submit(tasks_pb2.TaskSpec(ref=spec("EnvDump").ref, args={"path": str(tmp_path / "t.json")},
                                                  mem_limit_bytes=GiB))
            cli = subprocess.run(
                [sys.executable, "-m", "freeride", "submit", "--agent", agent.target, "--json", "--no-mps",
                 "--mem", "1GiB", spec("EnvDump").ref, f"path={tmp_path / 'u.json'}"],
                capture_output=True, text=True, timeout=60, check=True,
            )
            untrusted = c.get(json.loads(cli.stdout)[0]["task"]["id"])
            for t in (trusted, untrusted):
                wait_for_task(c, t.id, LIVE)
            env = json.loads((tmp_path / "t.json").read_text())["env"]
            assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(pipe)
            assert env["CUDA_MPS_LOG_DIRECTORY"] == str(logd)
            assert env["CUDA_MPS_CLIENT_PRIORITY"] == "1"
            assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=1024M"
            assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
            plain = json.loads((tmp_path / "u.json").read_text())["env"]
            assert not {k for k in plain if k.startswith("CUDA_MPS_")} - {"CUDA_MPS_PIPE_DIRECTORY"}
            assert not Path(plain["CUDA_MPS_PIPE_DIRECTORY"]).exists()  # no daemon there: time-sliced
            assert c.get(untrusted.id).spec.no_mps

            hog = c.submit(tasks_pb2.TaskSpec(ref=spec("Hog").ref, args={"step_mb": "4"}, mem_limit_bytes=150 * MiB))
            pid = wait_for_task(c, hog.id, LIVE).pid
            with BackgroundTrainer(agent, [40.0]):
                failed = wait_for_task(c, hog.id, [tasks_pb2.TASK_STATE_FAILED])
            assert failed.reason.startswith("memory_cap_exceeded")
            control = read_log(logd)
            server = int(MpsControl(STAND_IN, pipe, logd).servers()[0])
            assert f"terminate_client {server} {pid}" in control
            assert f"terminated {pid} alive=1" in control  # MPS cancelled its GPU work before the SIGKILL
            assert c.get(trusted.id).state in LIVE  # the other clients are untouched
    finally:
        assert agent.stop() == 0
    # It started the daemon, so it stops it (the daemon has stopped by the time it answers `quit`).
    assert read_log(logd)[-2:] == ["quit", "daemon stopped"]


def test_mps_use_without_a_daemon_refuses_to_start_with_one_line(tmp_path: Path, short_dir: Path) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "freeride", "agent", "--state-dir", str(tmp_path / "s"), "--socket",
         str(short_dir / "a.sock"), "--fake-gpu", "--mps", "use", "--mps-control", STAND_IN,
         "--mps-pipe-dir", str(short_dir / "none")],
        capture_output=True, text=True, timeout=60,
    )
    assert res.returncode == 2
    assert res.stderr.strip().splitlines()[-1].startswith("freeride: error: --mps use: no MPS control daemon answers")


def _doctor(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "freeride", "doctor", *args], capture_output=True, text=True,
                          timeout=60)


def test_doctor_reports_cpu_mode_without_a_driver_and_passes_with_the_fake(tmp_path: Path) -> None:
    where = ["--state-dir", str(tmp_path / "state"), "--socket", str(tmp_path / "a.sock")]
    res = _doctor(*where)
    try:
        import pynvml

        pynvml.nvmlInit()
        pytest.skip("this machine has an NVIDIA driver")
    except pynvml.NVMLError:
        pass
    # No driver is CPU mode, which the agent supports: said as such, and not a failure (exit 0).
    assert res.returncode == 0, res.stdout
    assert ("[INFO] nvml: NVML unavailable: NVML Shared Library Not Found: the agent runs in CPU mode (side tasks "
            "on the CPU, memory caps on the host memory a task holds) -> fix: for GPU mode install the NVIDIA driver"
            ) in res.stdout
    assert "[OK  ] mps: MPS off (--mps off): there is no GPU to share" in res.stdout
    assert "[FAIL]" not in res.stdout
    assert "[INFO] mps-fault-model: MPS fault model: a fatal GPU fault in any MPS client" in res.stdout
    mps = _doctor(*where, "--mps", "start", "--json")
    assert mps.returncode == 0
    statuses = {c["name"]: c["status"] for c in json.loads(mps.stdout)["checks"]}
    assert statuses["nvml"] == "info" and statuses["mps"] == "warn"  # the agent ignores --mps without a GPU
    # Something else wrong still fails in CPU mode.
    (tmp_path / "file").write_text("")
    broken = _doctor("--state-dir", str(tmp_path / "file"), "--socket", str(tmp_path / "a.sock"))
    assert broken.returncode == 1

    fake = _doctor(*where, "--fake-gpu", "name=Fake H100,total=80GiB", "--json")
    assert fake.returncode == 0
    report = json.loads(fake.stdout)
    assert report["ok"]
    assert {c["name"]: c["status"] for c in report["checks"]} == {
        "nvml": "ok", "gpu": "ok", "compute-mode": "ok", "mps": "ok", "socket-dir": "ok", "state-dir": "ok",
        "state-disk": "ok",
        "mps-fault-model": "info",
    }

    (tmp_path / "file").write_text("")
    bad = _doctor("--state-dir", str(tmp_path / "file"), "--socket", str(tmp_path / "a.sock"), "--fake-gpu",
                  "--mps", "use", "--mps-control", "/nonexistent/mps-control")
    assert bad.returncode == 1
    assert f"[FAIL] state-dir: {tmp_path / 'file'} is not a directory" in bad.stdout
    assert "[FAIL] mps-control: MPS control program '/nonexistent/mps-control' not found" in bad.stdout
