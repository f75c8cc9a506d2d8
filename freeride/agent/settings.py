"""How a setting is declared: its flag, its FREERIDE_* twin, its help and unit, on its config field.

`setting(...)` gives a dataclass field its default and its `Setting` (as metadata); `declarations(cls)` resolves
them (names, how the text of a flag or twin becomes the value, the choices of a `Literal`), `read_env` reads the
twins. freeride.agent.config declares AgentConfig with them; freeride.cli.settings builds its flags from them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin, get_type_hints

from freeride.core.units import format_size, parse_size
from freeride.errors import FreerideError, InvalidSpecError

_T = TypeVar("_T")


class ConfigError(FreerideError):
    """A configuration value is invalid; the message says which and what to use."""


Group = Literal["access", "workers", "cpu", "gpu", "state"]
GROUPS: dict[Group, str] = {
    "access": "access: sockets, TCP, token, metrics, the trainers' bubble path (docs/operations.md)",
    "workers": "side-task workers: how many, their timing, restarts, checkpoints, containment (docs/operations.md)",
    "cpu": "the agent and its side-task workers on the CPU (docs/operations.md)",
    "gpu": "GPU (docs/gpu.md)",
    "state": "state: the state directory, its retention, the logs (docs/operations.md)",
}
"""The concerns settings are grouped by: one argparse group each, in this order, under `freeride agent --help`."""


@dataclass(frozen=True)
class Setting:
    """One setting's command-line and environment side, declared once beside its AgentConfig field.

    `help` may name `{default}` (the field's default as the flag takes it: a size as 1GiB); every help line then
    ends the same way, naming the twin: `[env FREERIDE_X]`.
    """

    group: Group
    help: str
    flag: str = ""  # default: --field-name
    env: str = ""  # default: FREERIDE_FIELD_NAME
    metavar: str | None = None  # the unit the value is given in (SIZE, PCT, LIST, ...); default: argparse's
    const: str | None = None  # what a bare flag (no value) means; None: it needs one
    doctor: bool = False  # `freeride doctor` takes it too, to check what the agent would use


def setting(default: _T, group: Group, help: str, **more: Any) -> _T:
    """A field's default with its Setting as metadata (typed as the default, for the dataclass)."""
    return field(default=default, metadata={"setting": Setting(group, help, **more)})


Kind = Literal["switch", "whole", "number", "size", "path", "text", "choice"]


@dataclass(frozen=True)
class Declared:
    """A setting as the CLI and the environment see it: the field's Setting with its names resolved."""

    name: str  # the AgentConfig field
    flag: str
    env: str
    kind: Kind  # how a flag's or twin's text becomes the field's value
    default: object
    setting: Setting
    choices: tuple[str, ...] = ()  # a Literal field's values, in declaration order

    @property
    def help(self) -> str:
        """The help line: the declared text, its default filled in, then the twin, the same way for all."""
        shown = _show(self.kind, self.default)
        twin = f"{self.env}=1" if self.kind == "switch" else self.env
        return f"{self.setting.help.format(default=shown)} [env {twin}]"


def declarations(cls: type) -> tuple[Declared, ...]:
    """Every field of dataclass `cls` with its Setting resolved, in field order."""
    hints = get_type_hints(cls)
    out = []
    for f in fields(cls):
        s: Setting = f.metadata["setting"]
        hint = hints[f.name]
        choices = tuple(get_args(hint)) if get_origin(hint) is Literal else ()
        out.append(Declared(f.name, s.flag or f"--{f.name.replace('_', '-')}", s.env or f"FREERIDE_{f.name.upper()}",
                            _kind(f.name, hint, choices), f.default, s, choices))
    return tuple(out)


def _kind(name: str, hint: object, choices: tuple[str, ...]) -> Kind:
    if choices:
        return "choice"
    if hint is bool:
        return "switch"
    if hint is int:
        return "size" if name.endswith("_bytes") else "whole"
    if hint is float:
        return "number"
    if hint is str:
        return "text"
    return "path"  # Path, Path | None


def _show(kind: Kind, default: object) -> str:
    if kind == "size" and isinstance(default, int):
        return format_size(default)
    if kind == "number" and isinstance(default, float):
        return f"{default:g}"
    return str(default)


def read_env(settings: tuple[Declared, ...], env: Mapping[str, str]) -> dict[str, object]:
    """The values of the twins set (and not empty) in `env`, by field name; ConfigError for one that does not parse."""
    out: dict[str, object] = {}
    for d in settings:
        raw = env.get(d.env)
        if raw is None or raw == "":
            continue
        try:
            out[d.name] = _ENV_PARSE[d.kind](raw)
        except (ValueError, InvalidSpecError):
            raise ConfigError(f"{d.env}={raw!r} is not a valid {_ENV_WHAT[d.kind]}") from None
    return out


def _finite(raw: str) -> float:
    """A float env value; ValueError for nan and the infinities (as the float flags refuse them)."""
    value = float(raw)
    if not math.isfinite(value):
        raise ValueError(raw)
    return value


def _flag(raw: str) -> bool:
    """A boolean env value, as systemd and Kubernetes write them; ValueError for anything else."""
    word = raw.strip().lower()
    if word in ("1", "true", "yes", "on"):
        return True
    if word in ("0", "false", "no", "off"):
        return False
    raise ValueError(raw)


# A choice's twin is taken as written: validate() refuses a value outside the choices with the flag's message.
_ENV_PARSE: dict[Kind, Callable[[str], object]] = {
    "switch": _flag, "whole": int, "number": _finite, "size": parse_size, "path": Path, "text": str, "choice": str,
}
_ENV_WHAT: dict[Kind, str] = {
    "switch": "switch: 1, true, yes or 0, false, no", "whole": "int", "number": "finite number",
    "size": "size like 64KiB or 1GiB", "path": "path", "text": "str", "choice": "str",
}
