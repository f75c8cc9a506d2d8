"""Each concern of the agent's configuration is a type of its own that checks itself (freeride.agent.config), and
the components take their own concern: GpuControl.open the GPU layer's; the scheduler, the supervisor, its watchdog
and the worker streams the workers'; a trainer's link the access settings."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from freeride.agent import config as config_module
from freeride.agent.config import AccessConfig, AgentConfig, ConfigError, CpuConfig, StateConfig, WorkerConfig
from freeride.agent.control.scheduler import SchedulerConfig
from freeride.gpu.config import GpuConfig
from freeride.gpu.control import GpuControl

ROWS: list[tuple[str, Any, str]] = [
    ("margin", WorkerConfig(margin_ms=-1), "--margin-ms must be >= 0"),
    ("workers", WorkerConfig(max_workers=0), "--max-workers must be >= 1"),
    ("check timeout", WorkerConfig(check_timeout_s=41), "--check-timeout-s must be > 0 and at most 40"),
    ("backoff", WorkerConfig(restart_backoff_s=-1), "--restart-backoff-s must be >= 0"),
    ("memory check", WorkerConfig(memory_check_s=0), "--memory-check-s must be > 0"),
    ("log size", StateConfig(log_max_bytes=100), "--log-max-bytes must be at least 4KiB"),
    ("log total", StateConfig(log_max_bytes=1 << 20, log_total_bytes=1 << 20), "at least twice --log-max-bytes"),
    ("disk warning", StateConfig(disk_warn_percent=0), "--disk-warn-percent must be 1..100"),
    ("retention", StateConfig(retention="soon"), "--retention:"),
    ("tcp", AccessConfig(Path("/tmp/s.sock"), tcp="nohost"), "--tcp must be HOST:PORT"),
    ("token", AccessConfig(Path("/tmp/s.sock"), tcp="127.0.0.1:1"), "--tcp needs --token-file"),
    ("world socket", AccessConfig(Path("/tmp/s.sock"), socket_mode="0666"), "--allow-world-socket"),
    ("metrics port", AccessConfig(Path("/tmp/s.sock"), metrics_port=70000), "--metrics-port must be between"),
    ("socket path", AccessConfig(Path("/tmp/" + "x" * 100)), "too long for a unix socket"),
    ("nice", CpuConfig(worker_nice=99), "--worker-nice"),
    ("cpus", CpuConfig(worker_cpus="a-b"), "--worker-cpus"),
    ("agent cpus", CpuConfig(agent_cpus="99999"), "--agent-cpus"),
]


@pytest.mark.parametrize(("concern", "message"), [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_each_concern_checks_itself(concern: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        concern.check()


@pytest.mark.parametrize(("config", "message"), [
    (GpuConfig(thread_percentage=101), "--mps-thread-percentage must be 0 (unset) .. 100"),
    (GpuConfig(green_sms=-1), "--green-sms must be >= 0"),
    (GpuConfig(headroom_bytes=-1), "--headroom must be >= 0"),
    (GpuConfig(gpu=-1), "--gpu must be >= 0"),
    (GpuConfig(mps_program=" "), "--mps-control is empty"),
    (GpuConfig(mps="start", pipe_dir=Path("/" + "p" * 100)), "pick a shorter --mps-pipe-dir"),
])
def test_the_gpu_layers_concern_says_its_problems_in_the_agents_flags(config: GpuConfig, message: str) -> None:
    problems = config.problems()
    assert len(problems) == 1 and message in problems[0]


def test_a_good_concern_has_nothing_to_say() -> None:
    for concern in (WorkerConfig(), StateConfig(), AccessConfig(Path("/tmp/s.sock")), CpuConfig(worker_nice=19)):
        concern.check()
    assert GpuConfig().problems() == []


def test_the_whole_configuration_is_its_concerns(tmp_path: Path) -> None:
    config = AgentConfig(state_dir=tmp_path, socket=tmp_path / "a.sock", margin_ms=0.5, hang_timeout_s=2.0,
                         fake_gpu="default", gpu=3, mps_thread_percentage=40, retention="7d", worker_nice=10)
    assert config.workers.margin_ms == 0.5 and config.state.retention_s == 7 * 86400
    assert config.access.worker_target == f"unix:{tmp_path / 'a.sock'}"
    assert config.cpu.worker_placement().nice == 10
    assert config.gpu_layer == GpuConfig(gpu=3, fake_spec="default", mps="off", pipe_dir=None,
                                         log_dir=config.mps_log_path, thread_percentage=40)
    assert SchedulerConfig.of(config.workers) == SchedulerConfig(margin_ns=500_000, hang_timeout_ns=2 * 10**9)


def test_the_whole_configuration_refuses_what_a_concern_refuses(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--max-workers must be >= 1"):
        AgentConfig(state_dir=tmp_path, socket=tmp_path / "a.sock", max_workers=0).validate()
    with pytest.raises(ConfigError, match="--green-sms must be >= 0"):
        AgentConfig(state_dir=tmp_path, socket=tmp_path / "a.sock", green_sms=-2).validate()


def test_the_gpu_layer_opens_from_its_own_concern() -> None:
    gpu = GpuControl.open(GpuConfig(gpu=0, fake_spec="name=Fake H100,total=80GiB", thread_percentage=30, green_sms=8))
    try:
        assert gpu.mode == "fake" and gpu.device is not None and gpu.device.info.name == "Fake H100"
        assert gpu.gpu == 0 and gpu.mps is None  # MPS off: no daemon
    finally:
        gpu.close()


IMPORTS_IT = re.compile(r"^\s*from freeride\.agent\.config import [^\n]*\bAgentConfig\b", re.MULTILINE)


def test_only_the_agents_front_holds_the_whole_configuration() -> None:
    """The wings' components take their own concern; the front (and the server that starts it) builds them from
    the whole. A new component reaching for AgentConfig shows up here."""
    agent = Path(config_module.__file__).parent
    holders = sorted(str(p.relative_to(agent)) for wing in ("control", "domain", "edge", "engine", "procs", "state")
                     for p in (agent / wing).glob("*.py") if IMPORTS_IT.search(p.read_text()))
    assert holders == ["engine/front.py"]

