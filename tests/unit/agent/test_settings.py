"""The agent's settings, frozen: no flag or FREERIDE_* twin disappears or is renamed by accident.

Each setting is declared once, on its AgentConfig field (freeride.agent.config); the flags of `freeride agent` and
`freeride doctor` are generated from the declarations and the twins read through them. A change to the lists below
is a change to the product's interface: say so in docs/operations.md and deploy/systemd/freeride.env.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest
from support.paths import REPO

from freeride.agent.config import AgentConfig, ConfigError, declared, env_defaults
from freeride.cli import app
from freeride.cli.settings import agent_config

FLAGS = [
    "--agent-cpus", "--allow-world-socket", "--bubble-path", "--cgroups", "--check-timeout-s",
    "--checkpoint-interval-s", "--checkpoint-timeout-s", "--disk-warn-percent", "--fake-gpu", "--gpu",
    "--green-sms", "--hang-timeout-s", "--headroom", "--log-format", "--log-max-bytes", "--log-total-bytes",
    "--margin-ms",
    "--max-restarts", "--max-workers", "--memory-cap-restarts", "--memory-check-s", "--metrics-addr",
    "--metrics-port", "--mps", "--mps-control", "--mps-log-dir", "--mps-pipe-dir", "--mps-thread-percentage",
    "--restart-backoff-s", "--retention", "--shutdown-grace-s", "--socket", "--socket-group", "--socket-mode",
    "--state-dir", "--tcp", "--token-file", "--worker-cpus", "--worker-nice", "--worker-sched",
]
ENVS = [
    "FREERIDE_AGENT_CPUS", "FREERIDE_ALLOW_WORLD_SOCKET", "FREERIDE_BUBBLE_PATH", "FREERIDE_CGROUPS",
    "FREERIDE_CHECKPOINT_INTERVAL_S", "FREERIDE_CHECKPOINT_TIMEOUT_S", "FREERIDE_CHECK_TIMEOUT_S",
    "FREERIDE_DISK_WARN_PERCENT", "FREERIDE_FAKE_GPU", "FREERIDE_GPU", "FREERIDE_GREEN_SMS",
    "FREERIDE_HANG_TIMEOUT_S",
    "FREERIDE_HEADROOM_BYTES", "FREERIDE_LOG_FORMAT", "FREERIDE_LOG_MAX_BYTES", "FREERIDE_LOG_TOTAL_BYTES",
    "FREERIDE_MARGIN_MS", "FREERIDE_MAX_RESTARTS", "FREERIDE_MAX_WORKERS", "FREERIDE_MEMORY_CAP_RESTARTS",
    "FREERIDE_MEMORY_CHECK_S", "FREERIDE_METRICS_ADDR", "FREERIDE_METRICS_PORT", "FREERIDE_MPS",
    "FREERIDE_MPS_CONTROL", "FREERIDE_MPS_LOG_DIR", "FREERIDE_MPS_PIPE_DIR", "FREERIDE_MPS_THREAD_PERCENTAGE",
    "FREERIDE_RESTART_BACKOFF_S", "FREERIDE_RETENTION", "FREERIDE_SHUTDOWN_GRACE_S", "FREERIDE_SOCKET",
    "FREERIDE_SOCKET_GROUP", "FREERIDE_SOCKET_MODE", "FREERIDE_STATE_DIR", "FREERIDE_TCP", "FREERIDE_TOKEN_FILE",
    "FREERIDE_WORKER_CPUS", "FREERIDE_WORKER_NICE", "FREERIDE_WORKER_SCHED",
]
DOCTOR_FLAGS = [
    "--disk-warn-percent", "--fake-gpu", "--gpu", "--headroom", "--memory-cap-restarts", "--mps", "--mps-control",
    "--mps-log-dir", "--mps-pipe-dir", "--mps-thread-percentage", "--socket", "--state-dir",
]
# Options of these commands that are no setting of the agent, so have no FREERIDE_* twin, and why.
NOT_SETTINGS = {
    "-h": "argparse's help", "--help": "argparse's help",
    "--json": "doctor's output format: how one command prints, not how the agent runs",
}


def _options(command: str) -> dict[str, argparse.Action]:
    sub = next(a for a in app.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {flag: action for action in sub.choices[command]._actions for flag in action.option_strings}


def test_the_flags_and_their_twins_are_the_frozen_lists() -> None:
    assert sorted(d.flag for d in declared()) == FLAGS
    assert sorted(d.env for d in declared()) == ENVS
    assert sorted(d.flag for d in declared() if d.setting.doctor) == DOCTOR_FLAGS
    assert len(declared()) == len(AgentConfig.__dataclass_fields__)  # every field is a setting


@pytest.mark.parametrize(("command", "flags"), [("agent", FLAGS), ("doctor", DOCTOR_FLAGS)])
def test_every_option_is_a_declared_setting_whose_help_names_its_twin_the_same_way(command: str,
                                                                                   flags: list[str]) -> None:
    options = _options(command)
    assert sorted(set(options) - set(NOT_SETTINGS)) == flags
    for d in declared():
        if d.flag in options:
            twin = f"{d.env}=1" if options[d.flag].nargs == 0 else d.env
            help_line = options[d.flag].help or ""
            assert help_line.endswith(f" [env {twin}]"), help_line
            assert help_line.count("FREERIDE_") == 1, f"{d.flag}: the twin is named once, at the end: {help_line}"


def _sample(kind: str, choices: tuple[str, ...]) -> tuple[str, object]:
    """A twin's text other than the default, and the value it must give."""
    if kind == "choice":
        return choices[-1], choices[-1]
    return {"switch": ("yes", True), "whole": ("7", 7), "number": ("2.5", 2.5), "size": ("3MiB", 3 << 20),
            "path": ("/x/y", Path("/x/y")), "text": ("some text", "some text")}[kind]


def test_each_twin_sets_its_own_field_and_a_flag_overrides_it(monkeypatch: pytest.MonkeyPatch) -> None:
    for d in declared():
        raw, value = _sample(d.kind, d.choices)
        assert env_defaults({d.env: raw}) == {d.name: value}, d.env
    monkeypatch.setenv("FREERIDE_MAX_WORKERS", "5")
    monkeypatch.setenv("FREERIDE_LOG_FORMAT", "json")
    ns = app.build_parser().parse_args(["agent", "--max-workers", "3"])
    config = agent_config(ns)
    assert (config.max_workers, config.log_format, config.margin_ms) == (3, "json", AgentConfig().margin_ms)


@pytest.mark.parametrize("path", ["docs/operations.md", "deploy/systemd/freeride.env"])
def test_the_operations_guide_and_the_env_file_name_every_twin(path: str) -> None:
    named = set(re.findall(r"\bFREERIDE_[A-Z0-9_]+", (REPO / path).read_text()))
    assert sorted(set(ENVS) - named) == [], f"{path} leaves these twins out"


def test_the_operations_guide_lists_each_flag_beside_its_twin() -> None:
    rows = [line for line in (REPO / "docs/operations.md").read_text().splitlines() if line.startswith("| `--")]
    pairs = {(m.group(1), m.group(2)) for line in rows
             if (m := re.match(r"\| `(--[a-z-]+)[^`]*` \| `(FREERIDE_[A-Z0-9_]+)", line))}
    assert {(d.flag, d.env) for d in declared()} <= pairs


@pytest.mark.parametrize(("env", "message"), [
    ("FREERIDE_MPS", "--mps must be off, start or use, got 'bogus'"),
    ("FREERIDE_BUBBLE_PATH", "--bubble-path must be auto or grpc, got 'bogus'"),
    ("FREERIDE_CGROUPS", "--cgroups must be auto or off, got 'bogus'"),
    ("FREERIDE_LOG_FORMAT", "--log-format must be text or json, got 'bogus'"),
    ("FREERIDE_WORKER_SCHED", "--worker-sched must be other or idle, got 'bogus'"),
])
def test_a_twin_outside_its_choices_is_refused_naming_the_flag_and_the_choices(env: str, message: str) -> None:
    with pytest.raises(ConfigError) as exc:
        AgentConfig(**env_defaults({env: "bogus"})).validate()  # type: ignore[arg-type]
    assert str(exc.value) == message
    assert {d.env for d in declared() if d.choices} == {"FREERIDE_MPS", "FREERIDE_BUBBLE_PATH", "FREERIDE_CGROUPS",
                                                        "FREERIDE_LOG_FORMAT", "FREERIDE_WORKER_SCHED"}


@pytest.mark.parametrize(("env", "raw", "message"), [
    ("FREERIDE_HANG_TIMEOUT_S", "-5", "FREERIDE_HANG_TIMEOUT_S must be >= 0, got -5.0"),
    ("FREERIDE_MPS", "bogus", "FREERIDE_MPS must be off, start or use, got 'bogus'"),
    # the one set in the environment is named so, the other as the flag it was given as
    ("FREERIDE_LOG_TOTAL_BYTES", "8000", "FREERIDE_LOG_TOTAL_BYTES must be at least twice --log-max-bytes"),
])
def test_a_value_from_the_environment_is_refused_naming_the_variable(monkeypatch: pytest.MonkeyPatch, env: str,
                                                                     raw: str, message: str) -> None:
    monkeypatch.setenv(env, raw)
    with pytest.raises(ConfigError) as exc:
        agent_config(app.build_parser().parse_args(["agent", "--log-max-bytes", "4KiB"]))
    assert str(exc.value).startswith(message), str(exc.value)
    monkeypatch.delenv(env)
    monkeypatch.setenv("FREERIDE_HANG_TIMEOUT_S", "5")  # a flag given wins and is named as the flag
    with pytest.raises(ConfigError, match=r"^--hang-timeout-s must be >= 0"):
        agent_config(app.build_parser().parse_args(["agent", "--hang-timeout-s", "-5"]))
