"""placeholder"""
import argparse
def add_args(p: argparse.ArgumentParser) -> None: ...
def run(ns: argparse.Namespace) -> dict: return {}
