"""Operations settings and the bubble histogram, as specifications."""

from __future__ import annotations

import grp
import os
from pathlib import Path

import pytest

from freeride.agent.config import AgentConfig, ConfigError, env_defaults
from freeride.agent.control.histogram import Histogram
from freeride.agent.edge.auth import LogBudget
from freeride.agent.server import _access_warning
from freeride.core.auth import TokenError, read_token


def test_metrics_and_tcp_are_off_and_the_socket_is_owner_and_group_only_by_default() -> None:
    c = AgentConfig().validate()
    assert (c.metrics_port, c.tcp, c.socket_mode_bits(), c.socket_gid()) == (0, "", 0o660, None)


def test_every_operations_flag_has_an_env_twin(tmp_path: Path) -> None:
    env = {"FREERIDE_METRICS_PORT": "9400", "FREERIDE_METRICS_ADDR": "0.0.0.0", "FREERIDE_SOCKET_MODE": "0600",
           "FREERIDE_SOCKET_GROUP": grp.getgrgid(os.getgid()).gr_name, "FREERIDE_TOKEN_FILE": str(tmp_path / "t")}
    c = AgentConfig(**env_defaults(env))  # type: ignore[arg-type]
    assert (c.metrics_port, c.metrics_addr, c.socket_mode, c.token_file) == (9400, "0.0.0.0", "0600", tmp_path / "t")
    assert c.socket_gid() == os.getgid()


@pytest.mark.parametrize(("change", "words"), [
    ({"tcp": "0.0.0.0:7070"}, "--tcp needs --token-file"),
    ({"socket_mode": "0440"}, "keep owner rw"),
    ({"socket_mode": "rw-rw----"}, "octal permissions"),
    ({"socket_group": "no-such-group-freeride"}, "is not a group"),
    ({"metrics_port": 70000}, "--metrics-port"),
])
def test_bad_operations_settings_are_refused_with_what_to_do(change: dict[str, object], words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        AgentConfig(**change).validate()  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", ["0666", "0662", "0601", "0777"])
def test_a_socket_mode_open_to_other_users_is_refused_unless_explicitly_allowed(mode: str) -> None:
    with pytest.raises(ConfigError, match=f"--socket-mode {mode} lets every local user .* --allow-world-socket"):
        AgentConfig(socket_mode=mode).validate()
    assert AgentConfig(socket_mode=mode, allow_world_socket=True).validate().socket_mode_bits() == int(mode, 8)
    env = env_defaults({"FREERIDE_SOCKET_MODE": mode, "FREERIDE_ALLOW_WORLD_SOCKET": "1"})
    assert AgentConfig(**env).validate().allow_world_socket is True  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="FREERIDE_ALLOW_WORLD_SOCKET='maybe' is not a valid switch"):
        env_defaults({"FREERIDE_ALLOW_WORLD_SOCKET": "maybe"})


def test_the_start_log_warns_when_root_shares_its_socket_with_a_group() -> None:
    gid = os.getgid()
    name = grp.getgrgid(gid).gr_name
    shared = _access_warning(AgentConfig(), euid=0, gid=gid)
    assert f"runs as root and its socket is open to group {name} (mode 0660)" in shared
    assert _access_warning(AgentConfig(socket_mode="0600"), euid=0, gid=gid) == ""
    assert _access_warning(AgentConfig(), euid=1000, gid=gid) == ""  # an unprivileged agent: the group is the design
    world = AgentConfig(socket_mode="0666", allow_world_socket=True)
    assert "lets every local user submit code that runs as root" in _access_warning(world, euid=0, gid=gid)


def test_a_token_file_must_hold_one_token(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("  abc123\n")
    assert read_token(path) == "abc123"
    for bad in ("", "two words"):
        path.write_text(bad)
        with pytest.raises(TokenError):
            read_token(path)
    with pytest.raises(TokenError, match="cannot read"):
        read_token(tmp_path / "missing")


def test_the_histogram_counts_each_length_in_the_first_bucket_that_holds_it() -> None:
    h = Histogram()
    for ns in (500_000, 1_000_000, 1_000_001, 30_000_000, 60 * 10**9):
        h.observe(ns)
    cumulative = dict(h.cumulative())
    assert cumulative[0.001] == 2  # bounds are inclusive ("le")
    assert cumulative[0.002] == 3 and cumulative[0.05] == 4 and cumulative[10.0] == 4
    assert cumulative[float("inf")] == 5
    assert h.sum_ns == 500_000 + 1_000_000 + 1_000_001 + 30_000_000 + 60 * 10**9


def test_refusal_logging_has_a_budget_that_refills_and_counts_what_it_skipped() -> None:
    now = [0.0]
    budget = LogBudget(burst=3, per_s=1.0, clock=lambda: now[0])
    assert [budget.take() for _ in range(5)] == [True, True, True, False, False]
    assert budget.suppressed == 2
    now[0] = 1.0  # one second refills one line
    assert budget.take() and not budget.take()


def test_size_env_twins_take_sizes_as_their_flags_do() -> None:
    env = {"FREERIDE_LOG_MAX_BYTES": "64KiB", "FREERIDE_HEADROOM_BYTES": "2GiB"}
    c = AgentConfig(**env_defaults(env)).validate()  # type: ignore[arg-type]
    assert (c.log_max_bytes, c.headroom_bytes) == (64 << 10, 2 << 30)
    assert AgentConfig(**env_defaults({"FREERIDE_LOG_MAX_BYTES": "65536"})).log_max_bytes == 65536  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="FREERIDE_LOG_MAX_BYTES='lots' is not a valid size"):
        env_defaults({"FREERIDE_LOG_MAX_BYTES": "lots"})


@pytest.mark.parametrize("raw", ["nan", "inf", "-inf"])
def test_a_seconds_env_twin_must_be_finite_as_its_flag_must(raw: str) -> None:
    with pytest.raises(ConfigError, match=r"FREERIDE_CHECKPOINT_TIMEOUT_S=.* is not a valid finite number"):
        env_defaults({"FREERIDE_CHECKPOINT_TIMEOUT_S": raw})


def test_the_log_total_and_the_disk_warning_have_env_twins_and_bounds() -> None:
    c = AgentConfig(**env_defaults({"FREERIDE_LOG_TOTAL_BYTES": "64MiB",  # type: ignore[arg-type]
                                    "FREERIDE_DISK_WARN_PERCENT": "80"})).validate()
    assert (c.log_total_bytes, c.disk_warn_percent) == (64 << 20, 80)
    assert AgentConfig().validate().log_total_bytes == 1 << 30  # a total by default, not only a cap per task
    with pytest.raises(ConfigError, match=r"--log-total-bytes must be at least twice --log-max-bytes \(131072 bytes"):
        AgentConfig(log_max_bytes=64 << 10, log_total_bytes=100_000).validate()
    for bad in (0, 101):
        with pytest.raises(ConfigError, match=r"--disk-warn-percent must be 1\.\.100"):
            AgentConfig(disk_warn_percent=bad).validate()
