"""The agent's flags, generated from AgentConfig's declarations: one argparse group per concern.

Every flag defaults to None, so that `agent_config` can tell a flag given from one left out: flags override the
FREERIDE_* twins, the twins override AgentConfig's defaults.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from freeride.agent.config import AgentConfig, ConfigError, declared, env_defaults
from freeride.agent.settings import GROUPS, Declared, Kind
from freeride.cli.common import number, whole
from freeride.core.units import parse_size

_TYPES: dict[Kind, Callable[[str], Any] | None] = {
    "whole": whole(), "number": number, "size": parse_size, "path": Path, "text": None, "choice": None,
}


def add_settings(p: argparse.ArgumentParser, doctor: bool = False) -> None:
    """The settings' flags, one group per concern in GROUPS' order; `doctor`: only those `freeride doctor` takes."""
    chosen = [d for d in declared() if d.setting.doctor or not doctor]
    for group, title in GROUPS.items():
        members = [d for d in chosen if d.setting.group == group]
        if members:
            g = p.add_argument_group(title)
            for d in members:
                _add(g, d)


def _add(g: argparse._ArgumentGroup, d: Declared) -> None:
    dest = d.name
    if d.kind == "switch":
        g.add_argument(d.flag, dest=dest, action="store_true", default=None, help=d.help)
        return
    options: dict[str, Any] = {"dest": dest, "help": d.help}
    if d.kind == "choice":
        options["choices"] = list(d.choices)
    elif (kind := _TYPES[d.kind]) is not None:
        options["type"] = kind
    if d.setting.metavar is not None:
        options["metavar"] = d.setting.metavar
    if d.setting.const is not None:
        options.update(nargs="?", const=d.setting.const)
    g.add_argument(d.flag, **options)


def agent_config(ns: argparse.Namespace) -> AgentConfig:
    """The validated config: each setting from its flag if given, else its FREERIDE_* twin, else the default."""
    values = env_defaults(os.environ)
    from_env = set(values)
    for d in declared():
        given = getattr(ns, d.name, None)
        if given is not None:
            values[d.name] = given
            from_env.discard(d.name)
    try:
        return AgentConfig(**values).validate()  # type: ignore[arg-type]
    except TypeError as exc:
        raise ConfigError(str(exc)) from None
    except ConfigError as exc:
        raise ConfigError(_as_given(str(exc), from_env)) from None


def _as_given(message: str, from_env: set[str]) -> str:
    """`message` (which names settings by their flags) with each setting that came from the environment named
    by its variable: whoever set FREERIDE_X=-5 in an env file looks for FREERIDE_X, not for a flag never given."""
    for d in declared():
        if d.name in from_env:
            message = re.sub(rf"(?<![\w-]){re.escape(d.flag)}(?![\w-])", d.env, message)
    return message
