"""`doctor`: `freeride doctor --json` as an operator would run it, against the real NVML (the fake GPU with
--fake-gpu): once as the agent runs by default (--mps off), once with --mps start."""

from __future__ import annotations

import json
from typing import Any

from freeride.tooling.gpucheck import procs
from freeride.tooling.gpucheck.model import FAKE_GPU_SPEC, CheckContext, Outcome, failed, passed, skipped

_GPU_PRESENCE = {"nvml", "gpu"}  # the "is there a GPU at all" checks


def doctor(ctx: CheckContext) -> Outcome:
    where = ["--gpu", str(ctx.gpu), "--state-dir", str(ctx.work / "state"), "--socket", str(ctx.work / "a.sock")]
    fake = ["--fake-gpu", FAKE_GPU_SPEC] if ctx.fake else []
    program = ctx.mps_program()
    runs = {"mps-off": [*where, *fake, "--mps", "off"]}
    if program:
        mps = ctx.work / "mps"
        runs["mps-start"] = [*where, *fake, "--mps", "start", "--mps-control", program,
                             "--mps-pipe-dir", str(mps / "pipe"), "--mps-log-dir", str(mps / "log")]
    details: dict[str, Any] = {"fake_gpu": FAKE_GPU_SPEC if ctx.fake else None}
    reports: dict[str, dict[str, Any]] = {}
    for name, args in runs.items():
        res = procs.run(procs.freeride_argv("doctor", "--json", *args), ctx.left_s(margin_s=2) / 2)
        try:
            reports[name] = json.loads(res["stdout"])
        except ValueError:
            details[name] = {"rc": res["rc"], "stdout": procs.tail(res["stdout"]), "stderr": procs.tail(res["stderr"])}
            return failed(f"freeride doctor {name} printed no JSON (exit code {res['rc']}): "
                          f"{procs.last_line(res['stderr']) or procs.last_line(res['stdout'])}", **details)
        details[name] = {"rc": res["rc"], **reports[name]}
    if not program:
        details["mps-start"] = "not run: nvidia-cuda-mps-control is not on PATH"
    fails = {name: [c for c in rep["checks"] if c["status"] == "fail"] for name, rep in reports.items()}
    # No GPU: the device checks fail, or (no driver) nvml reports CPU mode as info.
    presence = [c for c in reports["mps-off"]["checks"]
                if c["name"] in _GPU_PRESENCE and c["status"] in ("fail", "info")]
    if presence and not ctx.fake:
        details["not_a_gpu_run"] = True
        if all(c["name"] in _GPU_PRESENCE for c in fails["mps-off"]):
            return skipped(f"not a GPU run: doctor finds no GPU ({presence[0]['detail']})", **details)
    wrong = [f"{name}: {c['name']}: {c['detail']}" for name, cs in fails.items() for c in cs]
    counts = {name: _counts(rep) for name, rep in reports.items()}
    summary = "; ".join(f"{name} {c}" for name, c in counts.items())
    if wrong:
        return failed(f"doctor failed {len(wrong)} check(s): {wrong[0]}", f"{summary}; {wrong[0]}", **details)
    gpu = next((c["detail"] for c in reports["mps-off"]["checks"] if c["name"] == "gpu"), "")
    return passed(f"{summary}; {gpu}" if gpu else summary, **details)


def _counts(report: dict[str, Any]) -> str:
    statuses = [c["status"] for c in report["checks"]]
    return ", ".join(f"{statuses.count(s)} {s}" for s in ("ok", "warn", "fail", "info") if statuses.count(s))
