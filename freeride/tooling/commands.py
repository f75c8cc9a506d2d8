"""The tooling's commands in the `freeride` CLI: bench, demo, gpu-check, profile, timeline."""

from __future__ import annotations

import argparse

from freeride.cli.app import add_agent_args, subcommands
from freeride.tooling import timeline
from freeride.tooling.bench import cli as bench_cli
from freeride.tooling.demo import plan as demo_plan
from freeride.tooling.gpucheck import cli as gpucheck_cli
from freeride.tooling.profile import cli as profile_cli


def add_commands(sub: argparse._SubParsersAction) -> None:
    profile_cli.add_parser(sub, add_agent_args)
    timeline.add_parser(sub, add_agent_args)
    b = sub.add_parser("bench", help="benchmarks (JSON on stdout)")
    bench_cli.add_parsers(subcommands(b, "bench"))
    d = sub.add_parser("demo", help="the main demo: a real pipeline training a transformer, side tasks in its bubbles")
    demo_plan.add_args(d)
    d.set_defaults(func=_cmd_demo)
    gpucheck_cli.add_parser(sub)


def _cmd_demo(ns: argparse.Namespace) -> int:
    """The demo, imported when it runs: every other command would pay ~30 ms (psutil, the harness) for it."""
    from freeride.tooling.demo.run import cmd_demo

    return cmd_demo(ns)
