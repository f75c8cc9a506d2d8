"""Shared by the deployment tests: where the shipped files are, and how to read a systemd unit.

(Not named conftest.py: tests/conftest.py is imported as `conftest` by other test modules.)
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"


class Unit:
    """A systemd unit file as systemd reads it: sections of (key, value) in order, keys may repeat."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sections: dict[str, list[tuple[str, str]]] = {}
        current: list[tuple[str, str]] | None = None
        pending = ""
        for raw in path.read_text().splitlines():
            line = pending + raw.strip()
            pending = ""
            if line.endswith("\\"):  # continuation line
                pending = line[:-1] + " "
                continue
            if not line or line.startswith(("#", ";")):
                continue
            if line.startswith("[") and line.endswith("]"):
                current = self.sections.setdefault(line[1:-1], [])
                continue
            assert current is not None, f"{path}: {line!r} is outside any section"
            key, sep, value = line.partition("=")
            assert sep, f"{path}: {line!r} is not KEY=VALUE"
            current.append((key.strip(), value.strip()))

    def all(self, section: str, key: str) -> list[str]:
        return [v for k, v in self.sections.get(section, []) if k == key]

    def get(self, section: str, key: str) -> str:
        values = self.all(section, key)
        assert values, f"{self.path.name}: [{section}] has no {key}="
        return values[-1]


def specifiers(text: str, values: Mapping[str, str]) -> str:
    """Replace systemd's %-specifiers (%i, %t, %S, ...) with `values`; %% is a literal %."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "%" and i + 1 < len(text):
            spec = text[i + 1]
            out.append("%" if spec == "%" else values[spec])
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def parse_environment(value: str) -> dict[str, str]:
    """One Environment= line: space-separated KEY=VALUE words, shell-like quoting."""
    return dict(word.split("=", 1) for word in shlex.split(value))


def read_env_file(path: Path) -> dict[str, str]:
    """An EnvironmentFile=: KEY=VALUE lines, '#' comments, optional quotes, no expansion."""
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        key, sep, value = line.partition("=")
        assert sep, f"{path}: {line!r} is not KEY=VALUE"
        out[key.strip()] = shlex.split(value)[0] if value.strip() else ""
    return out
