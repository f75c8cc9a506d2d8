"""`freeride logs ID [-f] [--tail N]`: a task's output and traceback, from the agent that runs it."""

from __future__ import annotations

import argparse
import sys

from freeride.cli import _agents
from freeride.cli.common import UsageError, print_json, whole


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("task_id")
    p.add_argument("-f", "--follow", action="store_true",
                   help="then print new output as it is written, until the task is over (or Ctrl-C)")
    p.add_argument("--tail", type=whole(0), default=0, metavar="N",
                   help="only the last N lines of what is stored (default: all of it)")


def cmd_logs(ns: argparse.Namespace) -> int:
    if ns.json and ns.follow:
        raise UsageError("--json prints the stored log once; leave out -f, or --json")
    with _agents.owner(ns, ns.task_id) as c:
        stream = c.logs(ns.task_id, follow=ns.follow, tail_lines=ns.tail)
        if ns.json:
            chunks = list(stream)
            print_json({"task": ns.task_id, "path": chunks[0].path if chunks else "",
                        "log": b"".join(ch.data for ch in chunks).decode(errors="replace")})
            return 0
        out = sys.stdout.buffer
        written, path = 0, ""
        try:
            for chunk in stream:
                path = chunk.path or path
                if chunk.data:
                    out.write(chunk.data)
                    out.flush()
                    written += len(chunk.data)
        except KeyboardInterrupt:  # the way to stop following
            stream.cancel()
            return 130
    if not written:  # an empty answer reads as a broken command: say there is nothing (yet)
        where = f" (its log: {path})" if path else ""
        print(f"task {ns.task_id} has written no output{' yet' if not ns.follow else ''}{where}", file=sys.stderr)
    return 0
