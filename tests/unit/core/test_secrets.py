"""Passwords in URLs are masked before anything prints them."""

from __future__ import annotations

import io
import json
import sys

import pytest

from freeride.core.secrets import mask
from freeride.worker.check import main


@pytest.mark.parametrize(("text", "shown"), [
    ("redis://:pw@h:6379/0/x", "redis://:***@h:6379/0/x"),
    ("rediss://user:pw@h/x?password=pw&ssl_cert_reqs=none", "rediss://user:***@h/x?password=***&ssl_cert_reqs=none"),
    ("unix://:pw@/run/redis.sock/x", "unix://:***@/run/redis.sock/x"),
    ("redis://token@h/x", "redis://***@h/x"),
    ("pool=redis://h:6379/0/x out_dir=/data", "pool=redis://h:6379/0/x out_dir=/data"),
    ("a=redis://:one@h/x b=redis://:two@h/y", "a=redis://:***@h/x b=redis://:***@h/y"),
])
def test_mask(text: str, shown: str) -> None:
    assert mask(text) == shown


def test_the_reference_check_reads_its_arguments_from_stdin(tmp_path, monkeypatch, capsys) -> None:
    task_file = tmp_path / "t.py"
    task_file.write_text("from freeride import IterativeTask\n"
                         "class T(IterativeTask):\n"
                         "    def __init__(self, url: str) -> None:\n"
                         "        self.url = url\n")
    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps({"url": "redis://:pw@h/x"})))
    assert main([f"{task_file}:T", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True
