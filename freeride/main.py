"""The `freeride` command: the product's commands (freeride.cli) and the tooling's (bench, demo, timeline)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from freeride.cli import app
from freeride.tooling.commands import add_commands


def main(argv: Sequence[str] | None = None) -> int:
    return app.main(argv, more=add_commands)


if __name__ == "__main__":
    sys.exit(main())
