"""What one GPU host can do for freeride's neighbour stand-ins and edges (about 20 s on a GPU).

    python tools/gpu_probe.py --out probe.json

Writes one JSON object, rewritten after each section (a timeout leaves what finished). A section that fails
records {"error": ...} and the rest still run; one that needs CUDA records {"skipped": "no CUDA device"} on CPU.

- env: versions (torch, CUDA, driver), device, python.
- sleep_stretch: how much longer `torch.cuda._sleep` (SM cycles) takes in wall time idle, beside GEMMs, and
  right after them, with NVML's SM clock, power and clock-event reasons sampled every 5 ms.
- gemm_beside_spinner: what a resident %globaltimer spin (1 and 16 CTAs) or a `_sleep` kernel costs GEMMs.
- capabilities: stream priorities, green contexts, MPS static partitioning, stream memory ops, the jiterator
  spin, nsys/ncu, cuda.bindings.
- gpu_written_edges: how much earlier a CPU poller sees a word the GPU wrote (cuStreamWriteValue) than a
  blocking-sync event wakes its waiter.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import inspect
import json
import math
import mmap
import os
import platform
import shutil
import statistics
import subprocess
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from freeride.tooling.bench import neighbours  # noqa: E402 - needs the repo root on sys.path

NO_CUDA = {"skipped": "no CUDA device"}
SLEEP_CYCLES = 10_000_000
N = 4096
CU_MEMHOSTREGISTER_PORTABLE = 0x01
CU_MEMHOSTREGISTER_DEVICEMAP = 0x02
CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS = 92  # _V1 in CUDA 12's cuda.h
CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS = 93
PAGE = mmap.PAGESIZE


class Driver:
    """libcuda through ctypes, with argtypes set; a nonzero CUresult raises with its name."""

    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libcuda.so.1")
        self._sig("cuGetErrorName", [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)])
        self._sig("cuInit", [ctypes.c_uint])
        self._sig("cuDeviceGet", [ctypes.POINTER(ctypes.c_int), ctypes.c_int])
        self._sig("cuDeviceGetAttribute", [ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_int])
        self.call("cuInit", 0)

    def _sig(self, name: str, argtypes: list[Any]) -> Any:
        fn = getattr(self.lib, name)
        fn.argtypes = argtypes
        fn.restype = ctypes.c_int
        return fn

    def first(self, names: list[str], argtypes: list[Any]) -> str:
        """The first of `names` libcuda exports, its signature set."""
        for name in names:
            if hasattr(self.lib, name):
                self._sig(name, argtypes)
                return name
        raise RuntimeError(f"libcuda exports none of {names}")

    def call(self, name: str, *args: Any) -> None:
        rc = getattr(self.lib, name)(*args)
        if rc != 0:
            raise RuntimeError(f"{name} returned {rc} ({self.error_name(rc)})")

    def error_name(self, rc: int) -> str:
        out = ctypes.c_char_p()
        if self.lib.cuGetErrorName(rc, ctypes.byref(out)) != 0 or out.value is None:
            return "unknown CUresult"
        return out.value.decode()

    def attribute(self, attr: int, ordinal: int) -> int:
        dev, value = ctypes.c_int(), ctypes.c_int()
        self.call("cuDeviceGet", ctypes.byref(dev), ordinal)
        self.call("cuDeviceGetAttribute", ctypes.byref(value), attr, dev.value)
        return value.value


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("gpu_probe.json"))
    args = ap.parse_args()
    import torch

    cuda = torch.cuda.is_available()
    dev = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    result: dict[str, Any] = {}
    sections: list[tuple[str, Callable[[Any], dict[str, Any]], bool]] = [
        ("env", env, False),
        ("sleep_stretch", sleep_stretch, True),
        ("gemm_beside_spinner", gemm_beside_spinner, True),
        ("gpu_written_edges", gpu_written_edges, True),
        ("capabilities", capabilities, False),  # last: it creates a green context
    ]
    for name, fn, needs_cuda in sections:
        t0 = time.monotonic()
        if needs_cuda and not cuda:
            out: dict[str, Any] = dict(NO_CUDA)
        else:
            try:
                out = fn(dev)
            except Exception as exc:  # a section's failure is its record; the others still run
                out = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc(limit=4)}
        out["elapsed_s"] = round(time.monotonic() - t0, 3)
        result[name] = out
        _write(args.out, result)
        print(f"{name}: {'error' if 'error' in out else out.get('skipped', 'done')} ({out['elapsed_s']} s)",
              file=sys.stderr)
    return 0


def _write(path: Path, result: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=2, default=str))
    os.replace(tmp, path)


def env(dev: Any) -> dict[str, Any]:
    import torch

    out: dict[str, Any] = {"torch": torch.__version__, "torch_cuda": torch.version.cuda, "python": sys.version,
                           "platform": platform.platform()}
    out["device"] = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu (no CUDA device)"
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            out["driver"] = _text(pynvml.nvmlSystemGetDriverVersion())
            out["nvml_cuda_driver_version"] = pynvml.nvmlSystemGetCudaDriverVersion()
        finally:
            pynvml.nvmlShutdown()
    except Exception as exc:  # no NVML on a CPU host
        out["driver"] = f"unavailable: {type(exc).__name__}: {exc}"
    return out


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


# --- sleep_stretch ---------------------------------------------------------------------------------------------


class NvmlSampler:
    """SM clock (MHz), power (mW) and clock-event reasons every 5 ms, on a thread."""

    def __init__(self, dev: Any) -> None:
        import pynvml

        self.nvml = pynvml
        pynvml.nvmlInit()
        self.handle = _nvml_handle(pynvml, dev)
        self.reasons_fn = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
        self.bits = _reason_bits(pynvml)
        self.samples: list[tuple[int, int, int, int]] = []  # (monotonic ns, SM MHz, mW, reason bits)
        self.errors: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> NvmlSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(2)
        self.nvml.nvmlShutdown()

    def _run(self) -> None:
        nv = self.nvml
        while not self._stop.wait(0.005):
            try:
                sm = nv.nvmlDeviceGetClockInfo(self.handle, nv.NVML_CLOCK_SM)
                mw = nv.nvmlDeviceGetPowerUsage(self.handle)
                reasons = self.reasons_fn(self.handle)
                self.samples.append((time.monotonic_ns(), int(sm), int(mw), int(reasons)))
            except Exception as exc:  # keep sampling; say what failed once
                self.errors.add(f"{type(exc).__name__}: {exc}")

    def summary(self, t0: int, t1: int) -> dict[str, Any]:
        rows = [s for s in self.samples if t0 <= s[0] <= t1]
        if not rows:
            return {"nvml_samples": 0}
        seen = 0
        for row in rows:
            seen |= row[3]
        return {"nvml_samples": len(rows), "sm_mhz_mean": round(statistics.fmean(r[1] for r in rows)),
                "sm_mhz_min": min(r[1] for r in rows),
                "power_w_mean": round(statistics.fmean(r[2] for r in rows) / 1e3, 1),
                "reasons_seen": self.decode(seen)}

    def decode(self, bits: int) -> list[str]:
        names = [name for bit, name in self.bits.items() if bits & bit]
        rest = bits & ~sum(self.bits)
        return names + ([hex(rest)] if rest else [])


def _nvml_handle(nv: Any, dev: Any) -> Any:
    """The NVML handle of torch's device: by UUID (NVML numbers devices ignoring CUDA_VISIBLE_DEVICES), else index."""
    import torch

    try:
        uuid = str(torch.cuda.get_device_properties(dev).uuid)
        return nv.nvmlDeviceGetHandleByUUID((uuid if uuid.startswith("GPU-") else f"GPU-{uuid}").encode())
    except Exception:
        return nv.nvmlDeviceGetHandleByIndex(dev.index)


def _reason_bits(nv: Any) -> dict[int, str]:
    """pynvml's single-bit clock-event (or older throttle) reason constants, bit -> short name."""
    bits: dict[int, str] = {}
    for prefix in ("nvmlClocksThrottleReason", "nvmlClocksEventReason"):  # the newer names win
        for name in dir(nv):
            value = getattr(nv, name)
            if name.startswith(prefix) and isinstance(value, int) and value > 0 and value & (value - 1) == 0:
                bits[value] = name[len(prefix):]
    return bits


def sleep_stretch(dev: Any) -> dict[str, Any]:
    import torch

    torch.cuda.set_device(dev)
    a = torch.randn(N, N, device=dev, dtype=torch.bfloat16)
    b = torch.randn(N, N, device=dev, dtype=torch.bfloat16)
    side = torch.cuda.Stream(dev)
    out: dict[str, Any] = {"sleep_cycles": SLEEP_CYCLES}
    try:
        sampler: Any = NvmlSampler(dev)
    except Exception as exc:
        out["nvml"] = f"unavailable: {type(exc).__name__}: {exc}"
        sampler = None
    gemm_ms = _gemm_ms(a, b, 20)
    out["gemm_ms"] = round(gemm_ms, 4)
    total = max(20, math.ceil(1000 / gemm_ms))  # about 1 s of GEMMs
    chunks = 20
    with sampler if sampler is not None else _Null():
        phases: dict[str, Any] = {}
        t0 = time.monotonic_ns()
        idle = [_sleep_ms() for _ in range(5)]
        phases["idle"] = (idle, t0, time.monotonic_ns())
        torch.cuda.synchronize(dev)
        t0 = time.monotonic_ns()
        busy = []
        pending = []
        done_before: Any = None
        for _ in range(chunks):  # chunk k of GEMMs on the side stream; sleep k waits for chunk k-1, runs beside k
            with torch.cuda.stream(side):
                for _ in range(total // chunks):
                    torch.matmul(a, b)
            if done_before is not None:
                torch.cuda.current_stream(dev).wait_event(done_before)
            pending.append(_queue_sleep())
            with torch.cuda.stream(side):
                done_before = torch.cuda.Event()
                done_before.record(side)
        for start, end in pending:
            end.synchronize()
            busy.append(start.elapsed_time(end))
        torch.cuda.synchronize(dev)
        phases["beside_gemms"] = (busy, t0, time.monotonic_ns())
        t0 = time.monotonic_ns()
        after = [_sleep_ms() for _ in range(5)]
        phases["after_gemms"] = (after, t0, time.monotonic_ns())
        idle_ms = statistics.median(idle)
        for name, (ms, p0, p1) in phases.items():
            med = statistics.median(ms)
            row: dict[str, Any] = {"sleep_ms": [round(x, 3) for x in ms], "sleep_ms_median": round(med, 3),
                                   "stretch_pct": round((med / idle_ms - 1) * 100, 1),
                                   "wall_s": round((p1 - p0) / 1e9, 3)}
            if sampler is not None:
                row.update(sampler.summary(p0, p1))
            out[name] = row
    if sampler is not None and sampler.errors:
        out["nvml_errors"] = sorted(sampler.errors)
    out["note"] = ("beside_gemms is event-timed: it includes any wait of the 1-thread sleep kernel for an SM slot "
                   "among the GEMMs' blocks, as well as the lower clock")
    return out


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _queue_sleep() -> tuple[Any, Any]:
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(SLEEP_CYCLES)
    end.record()
    return start, end


def _sleep_ms() -> float:
    start, end = _queue_sleep()
    end.synchronize()
    return float(start.elapsed_time(end))


def _gemm_ms(a: Any, b: Any, n: int) -> float:
    """Milliseconds a GEMM, n back to back on the current stream, after a warm-up."""
    import torch

    torch.matmul(a, b)
    torch.cuda.synchronize()
    return _gemm_ms_nowarm(a, b, n)


# --- gemm_beside_spinner ---------------------------------------------------------------------------------------


def gemm_beside_spinner(dev: Any) -> dict[str, Any]:
    import torch

    torch.cuda.set_device(dev)
    a = torch.randn(N, N, device=dev, dtype=torch.bfloat16)
    b = torch.randn(N, N, device=dev, dtype=torch.bfloat16)
    side = torch.cuda.Stream(dev)
    alone = statistics.median(_gemm_ms(a, b, 20) for _ in range(3))
    out: dict[str, Any] = {"gemms": 20, "alone_ms_per_gemm": round(alone, 4)}
    hold_s = (alone * 20 * 1.5 + 5) / 1e3  # the neighbour outlasts the GEMMs
    rivals: list[tuple[str, str, int]] = [("spin_1cta", "spin", 1), ("spin_16cta", "spin", 16), ("gpu_sleep", "gpu", 1)]
    for label, kind, ctas in rivals:
        try:
            with torch.cuda.stream(side):
                nb = neighbours.make(kind, dev, ctas=ctas)
            if nb.kind != kind:
                out[label] = {"skipped": f"{kind} fell back to {nb.kind}: {nb.fallback}", **nb.describe()}
                continue
            torch.cuda.synchronize(dev)
            with torch.cuda.stream(side):
                nb.wait(hold_s)
            time.sleep(0.001)  # let the neighbour's kernel take its SMs first, as a queued receive would
            ms = _gemm_ms_nowarm(a, b, 20)
            torch.cuda.synchronize(dev)
            out[label] = {"ms_per_gemm": round(ms, 4), "ratio_vs_alone": round(ms / alone, 4), **nb.describe()}
        except Exception as exc:
            out[label] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


def _gemm_ms_nowarm(a: Any, b: Any, n: int) -> float:
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        torch.matmul(a, b)
    end.record()
    end.synchronize()
    return float(start.elapsed_time(end)) / n


# --- capabilities ----------------------------------------------------------------------------------------------


def _try(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}


def capabilities(dev: Any) -> dict[str, Any]:
    cuda = dev.type == "cuda"
    skip = dict(NO_CUDA)
    out: dict[str, Any] = {}
    out["stream_priority_range"] = _try(lambda: _priority_range(dev)) if cuda else skip
    out["green_contexts"] = _green_contexts(dev)
    out["mps_static_partitioning"] = _mps_static()
    if cuda:
        out["stream_mem_ops"] = _try(lambda: _mem_ops_attributes(dev.index))
        nb = _try(lambda: neighbours.make("spin", dev).describe())
        out["jiterator_globaltimer_spin"] = nb if "error" in nb else {"works": nb.get("fallback") == "", **nb}
    else:
        out["stream_mem_ops"] = skip
        out["jiterator_globaltimer_spin"] = skip
    out["tools"] = {name: shutil.which(name) for name in ("nsys", "ncu", "nvidia-smi", "nvidia-cuda-mps-control")}

    def bindings() -> dict[str, Any]:
        import cuda.bindings

        return {"works": True, "version": getattr(cuda.bindings, "__version__", "?")}

    out["cuda_bindings"] = _try(bindings)
    return out


def _priority_range(dev: Any) -> list[int]:
    """(least, greatest) priority; greatest is the most negative number. A static method in torch's C type."""
    import torch

    stream_type: Any = torch.cuda.Stream
    try:
        return list(stream_type.priority_range())
    except TypeError:
        return list(torch.cuda.current_stream(dev).priority_range())


def _green_contexts(dev: Any) -> dict[str, Any]:
    import torch

    out: dict[str, Any] = {"module": hasattr(torch.cuda, "green_contexts")}
    try:
        from torch.cuda import green_contexts as gc
    except Exception as exc:
        out["import"] = f"{type(exc).__name__}: {exc}"
        return out
    out["dir"] = [n for n in dir(gc) if not n.startswith("__")]
    out["supported"] = getattr(gc, "SUPPORTED", None)
    cls = getattr(gc, "GreenContext", None)
    if cls is None:
        return out
    out["GreenContext_dir"] = [n for n in dir(cls) if not n.startswith("__")]
    out["create_signature"] = _try(lambda: str(inspect.signature(cls.create)))
    if dev.type != "cuda":
        out["create_num_sms_16"] = dict(NO_CUDA)
        return out

    def create() -> dict[str, Any]:
        ctx = cls.create(num_sms=16, device_id=dev.index)
        row: dict[str, Any] = {"works": True, "type": type(ctx).__name__}
        stream = ctx.Stream() if hasattr(ctx, "Stream") else None
        row["stream"] = repr(stream)
        return row

    out["create_num_sms_16"] = _try(create)
    return out


def _mps_static() -> dict[str, Any]:
    """Whether nvidia-cuda-mps-control's help mentions static SM partitioning (it reads commands from stdin
    without --help: stdin is closed and the call times out after 5 s)."""
    found: dict[str, Any] = {}
    candidates = [shutil.which("nvidia-cuda-mps-control"), "/usr/local/nvidia/bin/nvidia-cuda-mps-control"]
    for path in dict.fromkeys(candidates):
        if not path or not os.path.exists(path):
            continue
        try:
            res = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=5, stdin=subprocess.DEVNULL)
            text = res.stdout + res.stderr
            found[path] = {"rc": res.returncode, "static_lines": [ln.strip() for ln in text.splitlines()
                                                                  if "static" in ln.lower()]}
        except Exception as exc:
            found[path] = {"error": f"{type(exc).__name__}: {exc}"}
    return found or {"skipped": "nvidia-cuda-mps-control not found"}


def _mem_ops_attributes(ordinal: int) -> dict[str, Any]:
    drv = Driver()
    return {"can_use_stream_mem_ops": drv.attribute(CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS, ordinal),
            "can_use_64_bit_stream_mem_ops": drv.attribute(CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, ordinal),
            "attributes": "92/93 (the _V1 names in CUDA 12+, where the v2 entry points need no module flag)"}


# --- gpu_written_edges -----------------------------------------------------------------------------------------


def gpu_written_edges(dev: Any, trials: int = 200) -> dict[str, Any]:
    import torch

    torch.cuda.set_device(dev)
    torch.zeros(1, device=dev)  # the primary context is current on this thread
    drv = Driver()
    out: dict[str, Any] = {"trials": trials}
    write64 = True
    try:
        write = drv.first(["cuStreamWriteValue64_v2", "cuStreamWriteValue64"],
                          [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint])
    except RuntimeError:
        write64 = False
        write = drv.first(["cuStreamWriteValue32_v2", "cuStreamWriteValue32"],
                          [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint])
    out["write_symbol"] = write
    register = drv.first(["cuMemHostRegister_v2", "cuMemHostRegister"],
                         [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint])
    device_ptr = drv.first(["cuMemHostGetDevicePointer_v2", "cuMemHostGetDevicePointer"],
                           [ctypes.POINTER(ctypes.c_uint64), ctypes.c_void_p, ctypes.c_uint])
    unregister = drv.first(["cuMemHostUnregister"], [ctypes.c_void_p])
    out["attributes"] = _try(lambda: _mem_ops_attributes(dev.index))

    # Page 0: the word the GPU writes. Page 1: [0] the poller's "ready", [k] when it saw value k (monotonic ns).
    shm = mmap.mmap(-1, 2 * PAGE)  # anonymous and MAP_SHARED: the child sees the same pages
    words = memoryview(shm).cast("Q")
    stamps_at = PAGE // 8
    # Fork before registering: the driver marks registered memory MADV_DONTFORK, which would unmap it in the child.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads: the child only polls memory
        pid = os.fork()
    if pid == 0:
        _poll(words, stamps_at, trials)
    deadline = time.monotonic() + 10
    while words[stamps_at] == 0 and time.monotonic() < deadline:
        time.sleep(0.001)
    buf = ctypes.c_char.from_buffer(shm)
    host = ctypes.c_void_p(ctypes.addressof(buf))
    dptr = ctypes.c_uint64()
    registered = False
    queued, woke = [], []
    try:
        drv.call(register, host, PAGE, CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_PORTABLE)
        registered = True
        drv.call(device_ptr, ctypes.byref(dptr), host, 0)
        stream = torch.cuda.Stream(dev)
        handle = ctypes.c_void_p(stream.cuda_stream)
        event = torch.cuda.Event(blocking=True)
        with torch.cuda.stream(stream):
            for k in range(1, trials + 1):
                torch.cuda._sleep(50_000)
                value = ctypes.c_uint64(k) if write64 else ctypes.c_uint32(k)
                drv.call(write, handle, dptr.value, value, 0)
                queued.append(time.monotonic_ns())
                event.record(stream)
                event.synchronize()
                woke.append(time.monotonic_ns())
    except Exception as exc:  # e.g. stream memory ops unsupported: say why, keep what was learnt
        out["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        if len(woke) < trials:
            words[0] = trials  # the poller's last value: it exits
        _reap(pid)
        if registered:
            drv.call(unregister, host)
        del buf, host
    seen = [words[stamps_at + k] for k in range(1, trials + 1)]
    words.release()
    with contextlib.suppress(BufferError):  # a view still holds it; the process ends soon
        shm.close()
    pairs = [(q, w, s) for q, w, s in zip(queued, woke, seen, strict=False) if s]
    out["seen_by_poller"] = len(pairs)
    if not pairs:
        out.setdefault("error", "the poller saw none of the GPU's writes")
        return out
    lead = [(w - s) / 1e3 for q, w, s in pairs]
    after_queue = [(s - q) / 1e3 for q, w, s in pairs]
    event_after_queue = [(w - q) / 1e3 for q, w, s in pairs]
    out["poller_lead_us"] = _pcts(lead)  # positive: the GPU-written word was seen before the event woke its waiter
    out["poller_after_queue_us"] = _pcts(after_queue)
    out["event_after_queue_us"] = _pcts(event_after_queue)
    return out


def _poll(words: memoryview, stamps_at: int, trials: int) -> None:
    """The forked child: busy-poll the GPU-written word and stamp when each new value appears. Never returns."""
    try:
        words[stamps_at] = 1
        last, idle_since, spins = 0, time.monotonic_ns(), 0
        while last < trials:
            v = words[0]
            if v != last:
                now = time.monotonic_ns()
                if 0 < v <= trials:
                    words[stamps_at + v] = now
                last, idle_since = v, now
                continue
            spins += 1
            if spins & 0xFFFFF == 0 and time.monotonic_ns() - idle_since > 10_000_000_000:
                break  # the parent is gone or stuck
    finally:
        os._exit(0)


def _reap(pid: int) -> None:
    deadline = time.monotonic() + 12
    while time.monotonic() < deadline:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            return
        time.sleep(0.01)
    os.kill(pid, 9)
    os.waitpid(pid, 0)


def _pcts(xs: list[float]) -> dict[str, float]:
    s = sorted(xs)
    return {"p50": round(s[len(s) // 2], 1), "p99": round(s[min(len(s) - 1, int(0.99 * len(s)))], 1),
            "min": round(s[0], 1), "max": round(s[-1], 1)}


if __name__ == "__main__":
    sys.exit(main())
