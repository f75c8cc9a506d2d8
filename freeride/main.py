"""The `freeride` command: the product's commands (freeride.cli) and the tooling's (bench, demo, timeline)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from freeride.cli import app


def add_commands(sub: argparse._SubParsersAction) -> None:
    """The tooling's commands, imported only when the command line needs them (a tooling command, --help, a
    typo): the profile's and the benches' modules cost the agent and every product command ~60 ms at start."""
    from freeride.tooling.commands import add_commands as add

    add(sub)


def main(argv: Sequence[str] | None = None) -> int:
    return app.main(argv, more=add_commands)


if __name__ == "__main__":
    sys.exit(main())
