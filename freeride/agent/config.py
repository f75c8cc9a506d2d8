"""The agent's one frozen, validated configuration; every field has a FREERIDE_* twin."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path

from freeride.errors import FreerideError


class ConfigError(FreerideError):
    """A configuration value is invalid; the message says which and what to use."""


def default_runtime_dir() -> Path:
    """Where sockets live: $FREERIDE_SOCKET_DIR, $XDG_RUNTIME_DIR/freeride, else /tmp/freeride-<uid>."""
    explicit = os.environ.get("FREERIDE_SOCKET_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_RUNTIME_DIR")
    return Path(base) / "freeride" if base else Path(f"/tmp/freeride-{os.getuid()}")


def default_socket(gpu: int) -> Path:
    return default_runtime_dir() / f"agent-gpu{gpu}.sock"


@dataclass(frozen=True)
class AgentConfig:
    gpu: int = 0
    state_dir: Path = Path("freeride-state")
    socket: Path | None = None  # default: default_socket(gpu)
    tcp: str = ""  # host:port; empty means unix socket only
    margin_ms: float = 0.2
    max_restarts: int = 3
    restart_backoff_s: float = 1.0
    checkpoint_interval_s: float = 60.0
    hang_timeout_s: float = 5.0
    shutdown_grace_s: float = 10.0
    memory_check_s: float = 0.25  # how often worker memory is checked against its cap
    log_format: str = "text"

    @property
    def socket_path(self) -> Path:
        return self.socket if self.socket is not None else default_socket(self.gpu)

    @property
    def worker_target(self) -> str:
        return f"unix:{self.socket_path}"

    def validate(self) -> AgentConfig:
        if self.gpu < 0:
            raise ConfigError(f"--gpu must be >= 0, got {self.gpu}")
        if self.margin_ms < 0:
            raise ConfigError(f"--margin-ms must be >= 0, got {self.margin_ms}")
        if self.max_restarts < 0:
            raise ConfigError(f"--max-restarts must be >= 0, got {self.max_restarts}")
        if self.memory_check_s <= 0:
            raise ConfigError(f"--memory-check-s must be > 0, got {self.memory_check_s}")
        for name in ("restart_backoff_s", "checkpoint_interval_s", "hang_timeout_s", "shutdown_grace_s"):
            if getattr(self, name) < 0:
                raise ConfigError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(self, name)}")
        if self.log_format not in ("text", "json"):
            raise ConfigError(f"--log-format must be 'text' or 'json', got {self.log_format!r}")
        if self.tcp:
            host, sep, port = self.tcp.rpartition(":")
            if not sep or not host or not port.isdigit():
                raise ConfigError(f"--tcp must be HOST:PORT, got {self.tcp!r}")
        if len(str(self.socket_path)) > 100:
            raise ConfigError(f"socket path {self.socket_path} is too long for a unix socket; pick a shorter --socket")
        return self


def env_defaults(env: Mapping[str, str]) -> dict[str, object]:
    """Values from FREERIDE_<FIELD> variables, converted to each field's type."""
    out: dict[str, object] = {}
    for f in fields(AgentConfig):
        raw = env.get(f"FREERIDE_{f.name.upper()}")
        if raw is None or raw == "":
            continue
        kind = {"int": int, "float": float, "str": str}.get(str(f.type))
        try:
            if f.name in ("state_dir", "socket"):
                out[f.name] = Path(raw)
            elif kind is not None:
                out[f.name] = kind(raw)
            else:
                out[f.name] = raw
        except ValueError:
            raise ConfigError(f"FREERIDE_{f.name.upper()}={raw!r} is not a valid {f.type}") from None
    return out
