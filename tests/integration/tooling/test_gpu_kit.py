"""The GPU kit's device side, rehearsed: tools/gpu-run installs a bundle (here: freeride's own wheel, built
from this checkout) into a fresh site, checks the API code against this interpreter's protobuf and grpcio,
writes env.txt and runs gpu-check from that site, as it will on a GPU host with no package index."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.paths import REPO

ROOT = REPO


def test_the_device_scripts_pass_shellcheck() -> None:
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck not installed (Debian package `shellcheck`; ./dev.sh test installs it as root)")
    res = subprocess.run([shellcheck, "-x", "tools/gpu-run", "dev.sh"], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr


def test_gpu_run_installs_the_bundle_and_runs_the_check_from_it(tmp_path: Path) -> None:
    kit = tmp_path / "kit"
    (kit / "tools").mkdir(parents=True)
    shutil.copy(ROOT / "tools" / "gpu-run", kit / "tools" / "gpu-run")
    wheels = kit / ".whl"
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                            "-w", str(wheels), str(ROOT)], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr
    out, site = tmp_path / "out", tmp_path / "site"
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable, "FREERIDE_SITE": str(site)}
    env.pop("PYTHONPATH", None)
    res = subprocess.run(["bash", "tools/gpu-run", "--fake-gpu", "--only", "environment,torch-hooks"], cwd=kit,
                         env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    env_txt = (out / "env.txt").read_text()
    assert "bundle: the image's protobuf and grpcio" in env_txt  # this venv's own pass: no fallback needed
    assert f"freeride: 0.1.0 ({site}/freeride/__init__.py)" in env_txt  # the check ran from the bundle
    report = json.loads((out / "gpu-check.json").read_text())
    assert [(c["name"], c["verdict"]) for c in report["checks"]] == [("environment", "passed"),
                                                                     ("torch-hooks", "passed")]
    assert (out / "gpu-check.log").read_text().strip()
    # a second run on the same machine starts from a fresh site, and a site it did not make is refused
    again = subprocess.run(["bash", "tools/gpu-run", "--fake-gpu", "--only", "environment"], cwd=kit, env=env,
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    refused = subprocess.run(["bash", "tools/gpu-run"], cwd=kit, env={**env, "FREERIDE_SITE": str(foreign)},
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2
    assert refused.stderr.strip() == f"gpu-run: {foreign} exists and was not made by tools/gpu-run: set FREERIDE_SITE"
