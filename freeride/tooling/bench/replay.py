"""The trainer side of `freeride bench overhead`: one pipeline stage's timeline replayed with real kernels.

Run in a process of its own (`python -m freeride.tooling.bench.replay PLAN_JSON`), so that it can join an MPS
daemon, or not, before it creates its CUDA context. Iterations alternate: even ones plain (no edges, the side
task idles), odd ones harvested (bubbles reported through freeride's WaitTracker). After them come a few *solo*
iterations: reported bubbles with the GPU idle (the compute stands still on the CPU), where the side task runs
alone: its step time there is its step time on an idle GPU, which turns busy harvest into useful harvest.

Each iteration is timed segment by segment (timing CUDA events at every boundary on CUDA; the host clock on a
CPU stage), and its gaps are placed on the host clock from the end of the iteration (the time its final
synchronise returned), so the parent can line the agent's stamped edges up with the GPU's real ones. A sampler
thread reads NVML (SM clock, power, clock-event reasons) every few ms, tagged with the iteration.
"""

from __future__ import annotations

import functools
import itertools
import json
import statistics
import sys
import threading
import time
from typing import Any

from freeride.tooling import trace as tr
from freeride.tooling.bench import neighbours
from freeride.trainer.edges import DEFAULT_EDGE_MODE


def replay(plan: dict[str, Any]) -> dict[str, Any]:
    """Build the stage, time F and B, replay its 1F1B timeline, then the solo iterations; rows of every one."""
    import torch

    from freeride.trainer.edges import clock_for
    from freeride.trainer.reporter import BubbleReporter
    from freeride.trainer.waits import FWD, WaitTracker

    dev = torch.device("cuda:0" if plan["device"] == "cuda" else "cpu")
    if dev.type == "cpu":
        torch.set_num_threads(1)  # one core for the stage, the other for the agent and the side task
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    h = plan["hidden"]
    block = torch.nn.Sequential(*[
        torch.nn.TransformerEncoderLayer(h, plan["heads"], 4 * h, dropout=0.0, batch_first=True, norm_first=True)
        for _ in range(plan["layers"])
    ]).to(dev, dtype)
    x = torch.randn(plan["micro_batch_size"], plan["seq"], h, device=dev, dtype=dtype)
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    inflight: list[Any] = []

    def forward() -> None:
        inflight.append(block(x.requires_grad_()))

    def backward() -> None:
        y = inflight.pop(0)
        y.backward(torch.ones_like(y))

    f_ms = _time_ms(forward, 3, sync)
    b_ms = _time_ms(backward, 3, sync, prepare=forward)
    iterations, solo = plan["iterations"], plan.get("solo_iterations", 0)
    stage_trace = tr.generate("1f1b", plan["p"], plan["m"], f_ms, b_ms, 0.0, iterations + solo)[plan["stage"]]
    neighbour = neighbours.make(plan.get("neighbour", "gpu"), dev, ctas=plan.get("spin_ctas", 1))
    reporter = BubbleReporter(plan["target"], rank=plan["stage"], stage=plan["stage"])
    if not reporter.wait_connected(10):
        raise RuntimeError("the reporter could not connect to the agent")
    tracker = WaitTracker(reporter, clock_for(dev, plan.get("edge_sync", DEFAULT_EDGE_MODE)), record=True,
                          min_report_ns=0)
    timer = SegmentTimer(torch, dev)
    sampler = ClockSampler(torch, dev, plan.get("nvml_ms", 10.0) / 1e3)
    rows: list[dict[str, Any]] = []
    try:
        sampler.start()
        for it, segments in enumerate(stage_trace[:iterations]):
            harvested = it % 2 == 1
            sampler.tag(it, harvested)
            tracker.enabled = harvested
            if harvested:
                tracker.iteration = it - 1  # the edges carry the replay's iteration numbers
                tracker.begin_step()  # numbers this iteration's waits; no between-steps gap in this replay
            else:
                tracker.skip_step()
            t0 = time.monotonic_ns()
            timer.begin(len(segments))
            for seg in segments:
                timer.mark()
                if not seg.bubble:
                    (forward if abs(seg.duration_s * 1e3 - f_ms) <= abs(seg.duration_s * 1e3 - b_ms) else backward)()
                elif harvested:
                    tracker.wait(FWD, functools.partial(neighbour.wait, seg.duration_s))
                else:
                    neighbour.wait(seg.duration_s)
            timer.mark()
            sync()
            end_ns = time.monotonic_ns()
            rows.append(_row(it, harvested, (end_ns - t0) / 1e6, timer.finish(end_ns), segments))
        for k, segments in enumerate(stage_trace[iterations:]):  # solo: the side task alone on an idle GPU
            it = iterations + k
            sampler.tag(it, True)
            tracker.enabled = True
            tracker.iteration = it - 1
            tracker.begin_step()
            t0 = time.monotonic_ns()
            for seg in segments:
                if seg.bubble:
                    tracker.wait(FWD, functools.partial(_sleep_s, seg.duration_s))
                else:
                    _sleep_s(seg.duration_s)  # the stage "computes" with its GPU idle
            sync()
            rows.append({"it": it, "solo": True, "harvested": True, "step_ms": (time.monotonic_ns() - t0) / 1e6})
    finally:
        sampler.stop()
        tracker.close()
        reporter.close()
    bubbles = [(b.iteration, b.slot, b.start_ns, b.end_ns) for b in tracker.bubbles]
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    first = stage_trace[0]
    return {"device_name": name, "F_ms": f_ms, "B_ms": b_ms, "rows": rows, "bubbles": bubbles,
            "seg_bubble": [seg.bubble for seg in first],
            "trace_bubble_s": [sum(seg.duration_s for seg in segments if seg.bubble) for segments in stage_trace],
            "edge_sync": tracker.edge_mode, "neighbour": neighbour.describe(), "nvml": sampler.columns()}


def _row(it: int, harvested: bool, step_ms: float, seg_ns: list[tuple[int, int]],
         segments: list[Any]) -> dict[str, Any]:
    """One iteration: its step time, each segment's GPU time, and its gaps' real start and end on the host clock."""
    return {"it": it, "solo": False, "harvested": harvested, "step_ms": step_ms,
            "seg_ms": [(e - s) / 1e6 for s, e in seg_ns],
            "gaps": [[s, e] for (s, e), seg in zip(seg_ns, segments, strict=True) if seg.bubble]}


class SegmentTimer:
    """Boundary stamps of one iteration's segments: timing CUDA events on the stage's stream (on a CPU stage, the
    host clock, its operations being synchronous). `finish(end_ns)` places them on the host clock, taking the last
    boundary as `end_ns` (when the final synchronise returned; later than the GPU by a wake-up)."""

    def __init__(self, torch: Any, dev: Any) -> None:
        self._cuda = dev.type == "cuda"
        self._torch = torch
        self._pool: list[Any] = []
        self._marks: list[Any] = []

    def begin(self, segments: int) -> None:
        if self._cuda and len(self._pool) < segments + 1:
            self._pool += [self._torch.cuda.Event(enable_timing=True) for _ in range(segments + 1 - len(self._pool))]
        self._marks = []

    def mark(self) -> None:
        if self._cuda:
            ev = self._pool[len(self._marks)]
            ev.record()
            self._marks.append(ev)
        else:
            self._marks.append(time.monotonic_ns())

    def finish(self, end_ns: int) -> list[tuple[int, int]]:
        """(start, end) of each segment, in host-clock ns."""
        if self._cuda:
            last = self._marks[-1]
            at = [end_ns - round(ev.elapsed_time(last) * 1e6) for ev in self._marks[:-1]] + [end_ns]
        else:
            at = list(self._marks)
        return list(itertools.pairwise(at))


class ClockSampler:
    """NVML every `interval_s` on a thread of its own: SM clock, power and clock-event reasons, each sample tagged
    with the iteration it fell in. A measurement loop in the tooling, not a control path. Off (and saying why) on
    a CPU stage, without pynvml, or with interval 0."""

    _KEYS = ("t_ns", "it", "harvested", "sm_mhz", "power_mw", "reasons")

    def __init__(self, torch: Any, dev: Any, interval_s: float) -> None:
        self.interval_s = interval_s
        self.reason = "" if dev.type == "cuda" else "no CUDA device"
        if interval_s <= 0:
            self.reason = "off (--nvml-ms 0)"
        self._uuid = ""
        if not self.reason:
            try:
                self._uuid = str(torch.cuda.get_device_properties(dev).uuid)
            except Exception:  # older torch: NVML's index 0 then, as CUDA_VISIBLE_DEVICES leaves it
                self._uuid = ""
        self._samples: list[tuple[int, int, bool, int, int, int]] = []
        self._tag: tuple[int, bool] = (-1, False)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nvml-sampler", daemon=True)

    def tag(self, it: int, harvested: bool) -> None:
        self._tag = (it, harvested)

    def start(self) -> None:
        if not self.reason:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)

    def _run(self) -> None:
        try:
            import pynvml as nv

            nv.nvmlInit()
        except Exception as exc:
            self.reason = f"NVML unavailable: {type(exc).__name__}: {exc}"
            return
        try:
            handle = self._handle(nv)
            reasons = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
                nv.nvmlDeviceGetCurrentClocksThrottleReasons
            while not self._stop.wait(self.interval_s):
                it, harvested = self._tag
                sm = nv.nvmlDeviceGetClockInfo(handle, nv.NVML_CLOCK_SM)
                self._samples.append((time.monotonic_ns(), it, harvested, sm, nv.nvmlDeviceGetPowerUsage(handle),
                                      int(reasons(handle))))
        except Exception as exc:  # noted; the replay goes on without more samples
            self.reason = f"NVML sampling stopped: {type(exc).__name__}: {exc}"
        finally:
            nv.nvmlShutdown()

    def _handle(self, nv: Any) -> Any:
        """The stage's GPU by its UUID (NVML counts all GPUs, CUDA the visible ones); else NVML's first."""
        if self._uuid:
            try:
                uuid = self._uuid if self._uuid.startswith("GPU-") else f"GPU-{self._uuid}"
                return nv.nvmlDeviceGetHandleByUUID(uuid)
            except nv.NVMLError:
                pass
        return nv.nvmlDeviceGetHandleByIndex(0)

    def columns(self) -> dict[str, Any]:
        cols: dict[str, Any] = {k: [s[i] for s in self._samples] for i, k in enumerate(self._KEYS)}
        return {"interval_ms": self.interval_s * 1e3, "reason": self.reason, **cols}


def _time_ms(fn: Any, n: int, sync: Any, prepare: Any = None) -> float:
    out = []
    for _ in range(n + 1):
        if prepare is not None:
            prepare()
            sync()
        t0 = time.perf_counter()
        fn()
        sync()
        out.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(out[1:])  # the first call pays for allocator and kernel selection


def _sleep_s(duration_s: float) -> None:
    if duration_s > 0:
        time.sleep(duration_s)


if __name__ == "__main__":
    print(json.dumps(replay(json.loads(sys.argv[1]))))
