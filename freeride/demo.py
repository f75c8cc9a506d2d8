"""`freeride demo`."""

from __future__ import annotations

import argparse


def add_args(p: argparse.ArgumentParser) -> None:
    pass


def cmd_demo(ns: argparse.Namespace) -> int:
    return 0
