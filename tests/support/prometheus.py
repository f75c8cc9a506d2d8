"""A real Prometheus for the monitoring tests: Debian's `prometheus` package, skipped where it is not installed.

It runs on a free loopback port with its own data directory, scrapes and evaluates every second, and is
asked through its HTTP API only. Prometheus announces nothing, so a test that waits for a scrape or a rule
evaluation asks again until a deadline, with a growing back-off (the one interface it offers).
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

SKIP_REASON = ("prometheus/promtool are not installed (Debian: apt-get install --no-install-recommends prometheus; "
               "./dev.sh test installs it when run as root)")
T = TypeVar("T")


def need_prometheus() -> None:
    if shutil.which("prometheus") is None or shutil.which("promtool") is None:
        pytest.skip(SKIP_REASON)


def until(what: str, probe: Callable[[], T | None], timeout_s: float) -> T:
    """Ask `probe` again (back-off 20 ms .. 0.5 s) until it answers something or `timeout_s` passes."""
    deadline = time.monotonic() + timeout_s
    delay = 0.02
    while True:
        found = probe()
        if found is not None:
            return found
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout_s:g} s")
        time.sleep(delay)  # pacing between questions to Prometheus' HTTP API, which has no wake-up to wait on
        delay = min(0.5, delay * 2)


def finite(result: list[dict[str, Any]]) -> bool:
    """A query's answer holds data: at least one sample with a finite value."""
    return any(math.isfinite(float(r["value"][1])) for r in result)


class Prometheus:
    """`prometheus` on 127.0.0.1:`port` with `config`, its data under `root`."""

    def __init__(self, root: Path, config: Path, port: int) -> None:
        self.root = root
        self.config = config
        self.url = f"http://127.0.0.1:{port}"
        self.log = root / "prometheus.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 30.0) -> Prometheus:
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                ["prometheus", f"--config.file={self.config}", f"--storage.tsdb.path={self.root / 'data'}",
                 f"--web.listen-address={self.url.removeprefix('http://')}", "--log.level=warn"],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            )
        until("prometheus ready", self._ready, timeout_s)
        return self

    def _ready(self) -> bool | None:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"prometheus exited with {self.proc.returncode}: {self.log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=5) as reply:
                return True if reply.status == 200 else None
        except (urllib.error.URLError, ConnectionError):
            return None

    def api(self, path: str, **params: str) -> Any:
        url = f"{self.url}/api/v1/{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
        try:
            with urllib.request.urlopen(url, timeout=10) as reply:
                body = json.load(reply)
        except urllib.error.HTTPError as exc:  # a bad query: 400 with Prometheus' error in the body
            body = json.load(exc)
        assert body["status"] == "success", f"{path} {params}: {body.get('error')}"
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.api("query", query=expr)
        assert data["resultType"] == "vector", f"{expr}: {data['resultType']}"
        return list(data["result"])

    def firing(self, alert: str) -> list[dict[str, str]]:
        """The label sets of `alert`'s firing instances."""
        return [a["labels"] for a in self.api("alerts")["alerts"]
                if a["labels"]["alertname"] == alert and a["state"] == "firing"]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
