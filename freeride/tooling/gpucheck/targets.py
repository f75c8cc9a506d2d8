"""The benchmarks' targets (docs/benchmarks.md, docs/gpu.md) against what a run measured.

A benchmark's JSON may hold one run or several (`--path both`: {"runs": {"grpc": {...}, "shm": {...}}};
`bench overhead`: a "runs" list, one per MPS and edge mode, summarised at the top and in `with_mps`;
gpu-check's own {"edge_sync": {mode: ...}} around one overhead run per mode). `measure()` walks the
whole object: every dict that holds a target's key is a run, named by its path in the JSON ("." for the
top) and by what configured it, when it says (path, mps, edge_sync).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

_CONFIG_KEYS = ("path", "mps", "edge_sync")
_OPS: dict[str, Callable[[float, float], bool]] = {"<=": operator.le, ">=": operator.ge}


def _key(name: str) -> Callable[[dict[str, Any]], float | None]:
    def get(run: dict[str, Any]) -> float | None:
        value = run.get(name)
        return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None

    return get


def _field(name: str, part: str, absolute: bool = False) -> Callable[[dict[str, Any]], float | None]:
    """A number inside a run's member (`slowdown_interval`'s "high"), or its absolute value."""
    def get(run: dict[str, Any]) -> float | None:
        inner = run.get(name)
        value = _key(part)(inner) if isinstance(inner, dict) else None
        return abs(value) if absolute and value is not None else value

    return get


def _trainer_cpu(run: dict[str, Any]) -> float | None:
    """What reporting adds to the training thread's CPU per edge: the hooks' loop less the same loop's no-op."""
    hooks, floor = _key("hook_thread_cpu_us_per_edge")(run), _key("floor_thread_cpu_us_per_edge")(run)
    return None if hooks is None or floor is None else round(hooks - floor, 2)


@dataclass(frozen=True)
class Target:
    name: str  # as the docs word it
    key: str  # the JSON key (or keys; "a.b": b inside a) it is read from
    op: str  # "<=" or ">="
    limit: float
    read: Callable[[dict[str, Any]], float | None]


def _t(name: str, key: str, op: str, limit: float) -> Target:
    return Target(name, key, op, limit, _key(key))


TARGETS: dict[str, tuple[Target, ...]] = {
    # The second GPU run's targets (docs/gpu.md): the paired median, its 95 % interval's upper end, and the same
    # run's A/A null near 0 (else the run resolves nothing); harvest as work done (side steps at their time alone),
    # of the gaps the replay made, not the side task's busy time nor what the edge mode found (`off`: next to none).
    "overhead": (
        _t("slowdown", "slowdown", "<=", 0.005),
        Target("slowdown 95 % interval, upper end", "slowdown_interval.high", "<=", 0.01,
               _field("slowdown_interval", "high")),
        Target("A/A null |median|", "null.median", "<=", 0.003, _field("null", "median", absolute=True)),
        _t("useful harvest", "useful_harvest", ">=", 0.7),
        _t("stop after END p99 (ms)", "stop_after_end_ms_p99", "<=", 2.0),
    ),
    "control": (
        _t("hook p99 (µs)", "hook_us_p99", "<=", 5.0),
        _t("event delay p50 (µs)", "event_delay_us_p50", "<=", 30.0),
        _t("event delay p99 (µs)", "event_delay_us_p99", "<=", 150.0),
        _t("grant p50 (µs)", "grant_us_p50", "<=", 100.0),
        _t("grant p99 (µs)", "grant_us_p99", "<=", 400.0),
        Target("trainer CPU per edge (µs)", "hook_thread_cpu_us_per_edge - floor_thread_cpu_us_per_edge", "<=",
               10.0, _trainer_cpu),
    ),
    "harvest": (
        _t("grant p50 (µs)", "grant_us_p50", "<=", 150.0),
        _t("grant p99 (µs)", "grant_us_p99", "<=", 500.0),
    ),
}


def runs(obj: Any, keys: set[str], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """(path, run) for every dict in `obj` that holds one of `keys`, outermost first. A dict with a "runs"
    member that holds runs is a summary of them (bench overhead copies its first run to the top and its MPS
    run to `with_mps`): only its "runs" are walked, so each measurement counts once."""
    if isinstance(obj, dict):
        inner = obj.get("runs")
        inner_path = f"{path}.runs" if path else "runs"
        if isinstance(inner, dict | list) and next(runs(inner, keys, inner_path), None) is not None:
            yield from runs(inner, keys, inner_path)
            return
        if keys & obj.keys():
            yield path or ".", obj
        for k, v in obj.items():
            yield from runs(v, keys, f"{path}.{k}" if path else str(k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from runs(v, keys, f"{path}[{i}]")


def _label(path: str, run: dict[str, Any]) -> str:
    """A run's path, with what configured it when it says so (bench overhead's runs name their MPS and edge modes)."""
    said = ", ".join(f"{k} {run[k]}" for k in _CONFIG_KEYS if isinstance(run.get(k), str))
    if not said:
        return path
    return said if path == "." else f"{path} ({said})"


def measure(bench: str, result: Any) -> list[dict[str, Any]]:
    """Every target of `bench` in every run of its JSON: measured value, limit, met. A run that lacks a
    target's key, or a JSON with no run at all, gives value and met None: "not measured", never dropped."""
    wanted = TARGETS.get(bench, ())
    keys = {k.split(".")[0] for t in wanted for k in t.key.split(" - ")}
    found = [(_label(p, run), run) for p, run in runs(result, keys)] or [("-", {})]
    rows = []
    for target in wanted:
        for run_name, run in found:
            value = target.read(run)
            rows.append({
                "check": bench, "run": run_name, "target": target.name, "key": target.key, "op": target.op,
                "limit": target.limit, "value": value,
                "met": None if value is None else _OPS[target.op](value, target.limit),
            })
    return rows
