"""The report: DIR/gpu-check.json (everything), DIR/gpu-check.md (a short summary for a person) and the
one line per check the command prints."""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path
from typing import Any

from freeride.core.version import __version__
from freeride.tooling.gpucheck.model import FAILED, PASSED, SKIPPED, CheckResult

JSON_NAME, MD_NAME, LOG_NAME = "gpu-check.json", "gpu-check.md", "gpu-check.log"
_TAG = {PASSED: "PASS", FAILED: "FAIL", SKIPPED: "SKIP"}
_EVIDENCE_CHARS = 220
_GiB = 2**30


def line(r: CheckResult, width: int = 150) -> str:
    """`[PASS] environment      1.2 s  Python 3.12.3, torch …` (one line, cut to `width`)."""
    text = f"[{_TAG.get(r.verdict, r.verdict)}] {r.name:<14} {r.duration_s:6.1f} s  {r.summary}"
    text = text.replace("\n", " ")
    return text if len(text) <= width else text[: width - 1] + "…"


def host(results: list[CheckResult]) -> dict[str, Any]:
    """GPU, driver, torch and Python, from the environment check (what this process knows, if it did not run)."""
    env = next((r.details for r in results if r.name == "environment" and r.details), None)
    if env is None:
        return {"python": platform.python_version(), "gpu": None, "driver": None, "torch": None,
                "note": "the environment check did not run"}
    nvml, torch = env.get("nvml", {}), env.get("torch", {})
    gpu = nvml.get("gpu") or next(iter(torch.get("devices") or []), None)
    return {
        "python": env.get("python", {}).get("version"),
        "gpu": gpu.get("name") if gpu else None,
        "gpu_memory_bytes": gpu.get("total_bytes") if gpu else None,
        "driver": nvml.get("driver_version"),
        "torch": torch.get("version"),
        "torch_cuda": torch.get("cuda_build"),
        "cpus": env.get("cpus", {}).get("usable"),
        "hostname": env.get("platform", {}).get("hostname"),
        "kernel": env.get("platform", {}).get("kernel"),
    }


def build(results: list[CheckResult], *, mode: str, mode_note: str, args: dict[str, Any], started_unix_s: float,
          duration_s: float) -> dict[str, Any]:
    counts = {v: sum(r.verdict == v for r in results) for v in (PASSED, FAILED, SKIPPED)}
    targets = [row for r in results for row in r.details.get("targets", [])]
    return {
        "tool": "freeride gpu-check", "freeride": __version__,
        "started_unix_s": round(started_unix_s, 3), "duration_s": round(duration_s, 1),
        "mode": mode, "mode_note": mode_note, "args": args,
        "host": host(results),
        "ok": counts[FAILED] == 0, "counts": counts,
        "checks": [r.as_json() for r in results],
        "targets": targets,
    }


def write(out_dir: Path, report: dict[str, Any]) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    js, md = out_dir / JSON_NAME, out_dir / MD_NAME
    js.write_text(json.dumps(report, indent=2, default=str) + "\n")
    md.write_text(markdown(report))
    return js, md


def _cell(text: object) -> str:
    s = " ".join(str(text).split()).replace("|", "\\|")
    return s if len(s) <= _EVIDENCE_CHARS else s[: _EVIDENCE_CHARS - 1] + "…"


def _host_line(h: dict[str, Any]) -> str:
    gpu = h.get("gpu") or "no GPU"
    if h.get("gpu_memory_bytes"):
        gpu += f" ({h['gpu_memory_bytes'] / _GiB:.0f} GiB)"
    driver = f"driver {h['driver']}" if h.get("driver") else "no driver"
    torch = f"torch {h['torch']}" + (f" (CUDA {h['torch_cuda']})" if h.get("torch_cuda") else "") if h.get("torch") \
        else "no torch"
    cpus = f" · {h['cpus']} CPUs" if h.get("cpus") else ""
    return f"{gpu}, {driver} · {torch} · Python {h.get('python')}{cpus}"


def markdown(report: dict[str, Any]) -> str:
    c = report["counts"]
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(report["started_unix_s"]))
    lines = [
        "# freeride gpu-check", "",
        f"**Host:** {_host_line(report['host'])}  ",
        f"**Run:** {report['mode_note']}; {started}, {report['duration_s']:.0f} s of a "
        f"{report['args'].get('budget_s', 0):g} s budget: {c[PASSED]} passed, {c[FAILED]} failed, {c[SKIPPED]} skipped",
        "", "| check | verdict | duration | evidence |", "|---|---|---|---|",
    ]
    for r in report["checks"]:
        evidence = r["reason"] if r["verdict"] != PASSED and r["reason"] else r["summary"]
        lines.append(f"| {r['name']} | {r['verdict']} | {r['duration_s']:.1f} s | {_cell(evidence)} |")
    lines += ["", "## Targets", ""]
    if report["targets"]:
        lines += ["| check | run | target | measured | limit | met |", "|---|---|---|---|---|---|"]
        for t in report["targets"]:
            value = "—" if t["value"] is None else f"{t['value']:g}"
            met = "—" if t["met"] is None else ("yes" if t["met"] else "**no**")
            lines.append(f"| {t['check']} | {t['run']} | {t['target']} | {value} | {t['op']} {t['limit']:g} | {met} |")
    else:
        lines.append("No benchmark ran, so no target was measured.")
    lines += ["", f"Everything else (each check's details, raw outputs) is in {JSON_NAME}; each check's output in "
              f"{LOG_NAME}.", ""]
    return "\n".join(lines)
