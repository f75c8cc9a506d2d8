#!/usr/bin/env python3
"""The prepared GPU plan (issue 33): the probe, then `freeride bench overhead` configurations in order of
importance, each one's JSON kept as it finishes, the whole within a budget that fits one device call.

    device:     bash tools/gpu-run --plan            (carry [".whl"]; OUT is the device's $OUT)
    here:       python tools/gpu_plan.py --device cpu --out out/plan    (the rehearsal CI runs)

What comes back under --out (a device call returns at most 8 files, two folders down):
    probe.json      tools/gpu_probe.py's report
    summary.json    one row per configuration: the figures docs/gpu.md reads, or why it did not run
    plan.tar.gz     every configuration's full JSON (per-iteration rows, windows, NVML samples), rewritten
                    after each one, so a call cut short still brings back what finished
    plan.log        what ran, when, and each command's stderr tail

Every configuration alternates plain and harvested iterations inside one run, so each is its own baseline;
the one-factor comparisons (wall vs gpu neighbour, thread cap, chunk size, MPS or not) are between rows.
On a CPU (--device cpu) the configurations that only differ in GPU settings (MPS, the neighbour, the thread cap)
are skipped, each with its reason: what is left rehearses the plumbing with the same commands.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

# name, bench overhead arguments, whether it needs a GPU to mean anything beyond the plumbing.
# A: the product's defaults (MPS, side tasks capped at 50 % of the SMs, event edges) with a wall-clock neighbour and
# the matmul task; A0: uncapped (the first plan's A); B: the first run's cycle-counted neighbour; F: no MPS;
# tasks: FreeRide's table; H, H2: side tasks in a green context of half the H200's 132 SMs, without and with MPS
# (uncapped); D: short chunks; E, G: a resident (NCCL-like) neighbour, with and without MPS.
MATMUL = ["--mps", "start", "--edge-sync", "event"]
WALL = [*MATMUL, "--neighbour", "wall"]
PLAN: list[tuple[str, list[str], bool]] = [
    ("A-mps-wall-matmul", WALL, False),
    ("A0-mps-wall-matmul-uncapped", [*WALL, "--mps-thread-percentage", "0"], True),
    ("B-mps-gpu-matmul", [*MATMUL, "--neighbour", "gpu"], True),
    ("F-nomps-wall-matmul", ["--mps", "off", "--edge-sync", "event", "--neighbour", "wall"], True),
    ("T1-mps-wall-resnet", [*WALL, "--task", "sidetasks.cnn:DigitsResNet", "--side-arg", "epochs=1000"], False),
    ("T2-mps-wall-pagerank", [*WALL, "--task", "sidetasks.pagerank:PageRank", "--side-arg", "scale=18",
                              "--side-arg", "tol=1e-30", "--side-arg", "max_iter=100000"], False),
    ("T3-mps-wall-thumbnails", [*WALL, "--task", "sidetasks.images:Thumbnails", "--side-arg", "images=100000",
                                "--side-arg", "out_dir={work}/thumbnails"], False),
    ("T4-mps-wall-generate", [*WALL, "--task", "sidetasks.generate:Generate",
                              "--side-arg", "prompts={work}/prompts.jsonl", "--side-arg", "out={work}/generate.jsonl",
                              "--side-arg", "max_new_tokens=64"], False),
    ("H-nomps-wall-matmul-green66", ["--mps", "off", "--edge-sync", "event", "--neighbour", "wall",
                                     "--green-sms", "66"], True),
    ("H2-mps-wall-matmul-green66", [*WALL, "--mps-thread-percentage", "0", "--green-sms", "66"], True),
    ("D-mps-wall-matmul-chunk05", [*WALL, "--side-step-ms", "0.5"], True),
    ("E-mps-spin16-matmul", [*MATMUL, "--neighbour", "spin", "--spin-ctas", "16"], True),
    ("G-nomps-spin16-matmul", ["--mps", "off", "--edge-sync", "event", "--neighbour", "spin",
                               "--spin-ctas", "16"], True),
]

# The figures summary.json keeps of each configuration (the rest is in plan.tar.gz).
KEEP = ("verdict", "slowdown", "slowdown_interval", "null", "slowdown_first_harvested", "segment_delta_ms",
        "step_ms_plain", "step_ms_harvested", "F_ms", "B_ms", "efficiency_of_trace", "useful_harvest",
        "idle_step_ms", "bubble_step_ms", "side_steps", "solo_steps", "windows", "after_real_end_ms_p99",
        "after_real_end_ms_max", "start_stamp_late_us_p50", "start_stamp_late_us_p99", "end_stamp_late_us_p50",
        "end_stamp_late_us_p99", "until_vs_real_end_us_p50", "grant_us_p50", "grant_us_p99", "clock",
        "neighbour_info", "side_task_state", "side_task_progress")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out")))
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--budget-s", type=float, default=470.0, help="start no configuration after this")
    ap.add_argument("--min-left-s", type=float, default=30.0,
                    help="start none with less than this left of the budget (a configuration takes 40-70 s on an H200)")
    ap.add_argument("--config-timeout-s", type=float, default=180.0, help="one configuration's own limit")
    ap.add_argument("--iterations", type=int, default=0, help="per configuration (default: the bench's, 80 on cuda)")
    ap.add_argument("--only", default="", help="comma list of configuration name prefixes (e.g. A,T2)")
    ap.add_argument("--no-probe", action="store_true")
    ap.add_argument("--keep-going", action="store_true", help="go on when the first configuration fails (by "
                                                             "default the plan stops: the rest would fail alike)")
    ap.add_argument("--mps-control", default="", help="the MPS control program (default: found on PATH or under "
                                                      "/usr/local/nvidia/bin)")
    ns = ap.parse_args()
    t0 = time.monotonic()
    out = ns.out
    out.mkdir(parents=True, exist_ok=True)
    work = Path(os.environ.get("FREERIDE_PLAN_WORK", "/tmp/freeride-plan"))
    raw = work / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    _prompts(work / "prompts.jsonl")
    log = (out / "plan.log").open("a")
    say = _logger(log, t0)
    summary: dict[str, Any] = {"device": ns.device, "budget_s": ns.budget_s, "configs": {}}
    mpsc = ns.mps_control or _find_mps_control()

    wanted = [p.strip() for p in ns.only.split(",") if p.strip()]
    ran = 0
    for name, args, gpu_only in PLAN:
        row: dict[str, Any]
        if wanted and not any(name.startswith(w) for w in wanted):
            continue
        if ran == 1 and not ns.no_probe:  # after the first configuration: it has shown the bench runs at all
            say("probe")
            done = _run([sys.executable, str(ROOT / "tools" / "gpu_probe.py"), "--out", str(out / "probe.json")],
                        timeout=75, log=log)
            say(f"probe: exit {done}")
        left = ns.budget_s - (time.monotonic() - t0)
        if ns.device == "cpu" and gpu_only:
            row = {"skipped": "needs CUDA: on a CPU it would repeat another configuration's smoke test"}
        elif left < ns.min_left_s:
            row = {"skipped": f"the budget ran out ({ns.budget_s:.0f} s)"}
        else:
            cmd = [sys.executable, "-m", "freeride", "bench", "overhead", "--json", "--device", ns.device,
                   *[a.format(work=work) for a in args]]
            if ns.iterations:
                cmd += ["--iterations", str(ns.iterations)]
            if "--task" in args:  # the shipped tasks run on the CPU unless told
                cmd += ["--side-arg", f"device={ns.device}"]
            if ns.device == "cuda" and mpsc:
                cmd += ["--mps-control", mpsc]
            say(f"{name}: {' '.join(cmd[3:])}")
            started = time.monotonic()
            path = raw / f"{name}.json"
            log.flush()
            said_from = log.tell()  # where this bench's stderr starts in plan.log
            # The budget decides whether a configuration starts; once started it has its own limit (a budget
            # nearly spent must not kill one that would finish: the third call of 2026-11-28 lost F that way).
            code = _run(cmd, timeout=ns.config_timeout_s, log=log, stdout=path)
            row = _row(path, code, time.monotonic() - started, _last_line(out / "plan.log", said_from))
            ran += 1
            say(f"{name}: {row.get('verdict') or row.get('error')} ({row['elapsed_s']} s)")
        summary["configs"][name] = row
        summary["elapsed_s"] = round(time.monotonic() - t0, 1)
        (out / "summary.json").write_text(json.dumps(summary, indent=1))
        _pack(raw, out / "plan.tar.gz")
        if ran == 1 and "error" in row and not ns.keep_going:
            say(f"{name} failed: the plan stops here, so that a fix can be run in what is left of the lease")
            return 1
    say("done")
    return 0


def _row(path: Path, code: int, elapsed: float, said: str = "") -> dict[str, Any]:
    """A configuration's summary row; without the bench's JSON, an error with the last line the bench said."""
    row: dict[str, Any] = {"exit": code, "elapsed_s": round(elapsed, 1)}
    try:
        result = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        row["error"] = f"no JSON from the bench (exit {code}): {said or f'{type(exc).__name__}: {exc}'}"
        return row
    row.update({k: result[k] for k in KEEP if k in result})
    return row


def _last_line(log: Path, start: int) -> str:
    """The last non-blank line written to `log` after byte `start` (the bench's stderr: its one-line error)."""
    with log.open("rb") as f:
        f.seek(start)
        lines = [line.strip() for line in f.read().decode(errors="replace").splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _run(cmd: list[str], timeout: float, log: Any, stdout: Path | None = None) -> int:
    sink = stdout.open("w") if stdout is not None else log
    try:
        done = subprocess.run(cmd, stdout=sink, stderr=log, timeout=timeout, cwd=ROOT, check=False)
        return done.returncode
    except subprocess.TimeoutExpired:
        log.write(f"timed out after {timeout:.0f} s: {' '.join(cmd)}\n")
        return 124
    finally:
        if stdout is not None:
            sink.close()
        log.flush()


def _pack(raw: Path, dest: Path) -> None:
    tmp = dest.with_suffix(".tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        for f in sorted(raw.glob("*.json")):
            tar.add(f, arcname=f.name)
    tmp.replace(dest)


def _prompts(path: Path) -> None:
    """The generation task's prompts: 2,000 short ones, more than any run gets through."""
    words = ("def", "class", "import", "return", "while", "lambda", "yield", "with")
    path.write_text("".join(json.dumps({"id": f"p{i}", "prompt": " ".join(words[: i % 8 + 1])}) + "\n"
                            for i in range(2000)))


def _find_mps_control() -> str:
    for cand in (os.environ.get("FREERIDE_MPS_CONTROL", ""), "/usr/local/nvidia/bin/nvidia-cuda-mps-control"):
        if cand and Path(cand.split()[0]).exists():
            return cand
    from shutil import which

    return which("nvidia-cuda-mps-control") or ""


def _logger(log: Any, t0: float) -> Any:
    def say(msg: str) -> None:
        line = f"[{time.monotonic() - t0:6.1f}s] {msg}"
        print(line, flush=True)
        log.write(line + "\n")
        log.flush()
    return say


if __name__ == "__main__":
    sys.exit(main())
