"""What stands for a pipeline neighbour's send in the overhead bench: a wait of `gap_s` on the stage's stream.

- `cpu`: the CPU waits for the stage's GPU to drain, then sleeps the gap (hides what the CPU would queue).
- `gpu`: `torch.cuda._sleep`, a one-thread kernel spinning a calibrated number of SM cycles. When a side
  task's GEMMs lower the clock, the wait stretches in wall time: an artifact of the stand-in.
- `wall`: a host function (libc `usleep`) queued with `cuLaunchHostFunc`: the stream stalls for wall time
  with no kernel resident. No Python runs in the driver's callback thread, so no GIL is taken there.
- `spin`: a resident kernel (like an NCCL receive, which holds SMs while it waits) spinning on
  `%globaltimer` (wall ns), on `ctas` thread blocks, built with torch's jiterator.

`make` self-tests `wall` and `spin` (a 5 ms stall timed with CUDA events) and falls back, saying why:
spin -> wall -> gpu; on a CPU device every kind falls back to `cpu`.
"""

from __future__ import annotations

import ctypes
import statistics
import time
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

KINDS = ("gpu", "cpu", "wall", "spin")
SELF_TEST_S = 0.005
SELF_TEST_MS_OK = (4.5, 8.0)
MAX_USLEEP_US = 2**31 - 1
CUDA_ERROR_INVALID_CONTEXT = 201
# Spin markers sit this many elements apart: at least one jiterator block's work (128 threads x 4, or 8, elements
# a thread in torch 2.x), so each marker lands in a block of its own whatever the vector width (see _Spin).
SPIN_STRIDE = 4096
SPIN_CODE = (
    "template <typename T> T freeride_spin(T x, long long ns) {\n"
    "  if (x != T(0)) {\n"
    "    unsigned long long t0, t;\n"
    '    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));\n'
    '    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < (unsigned long long)ns);\n'
    "  }\n"
    "  return x;\n"
    "}\n"
)


class Neighbour(Protocol):
    kind: str  # what runs: "gpu" | "cpu" | "wall" | "spin"
    asked: str  # what was asked for
    fallback: str  # "" or why `kind` differs from `asked`

    def wait(self, gap_s: float) -> None:
        """Stand for the neighbour's send of gap_s (on the current stream of the device)."""
        ...

    def describe(self) -> dict[str, Any]:
        """kind, asked, fallback and what was calibrated."""
        ...


class Unusable(RuntimeError):
    """A kind cannot run here (missing symbol, failed call, self-test out of range)."""


class _Base:
    kind = ""

    def __init__(self, asked: str, fallback: str = "") -> None:
        self.asked = asked
        self.fallback = fallback

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "asked": self.asked, "fallback": self.fallback, **self._facts()}

    def _facts(self) -> dict[str, Any]:
        return {}


class _Cpu(_Base):
    kind = "cpu"

    def __init__(self, asked: str, dev: torch.device, fallback: str = "") -> None:
        super().__init__(asked, fallback)
        self._dev = dev
        self._drained: Any = None
        if dev.type == "cuda":
            import torch

            self._drained = torch.cuda.Event(blocking=True)  # the CPU sleeps in the driver, not spinning

    def wait(self, gap_s: float) -> None:
        if self._drained is not None:
            import torch

            self._drained.record(torch.cuda.current_stream(self._dev))
            self._drained.synchronize()
        if gap_s > 0:
            time.sleep(gap_s)


class _Gpu(_Base):
    kind = "gpu"

    def __init__(self, asked: str, dev: torch.device, fallback: str = "") -> None:
        super().__init__(asked, fallback)
        import torch

        with torch.cuda.device(dev):
            self.cycles_per_s = sleep_rate()

    def wait(self, gap_s: float) -> None:
        import torch

        torch.cuda._sleep(max(1, round(gap_s * self.cycles_per_s)))

    def _facts(self) -> dict[str, Any]:
        return {"sleep_ghz": round(self.cycles_per_s / 1e9, 3)}


class _Wall(_Base):
    kind = "wall"

    def __init__(self, asked: str, dev: torch.device, fallback: str = "") -> None:
        super().__init__(asked, fallback)
        self._dev = dev
        try:
            cuda = ctypes.CDLL("libcuda.so.1")
            self._launch = cuda.cuLaunchHostFunc
            self._error_name = cuda.cuGetErrorName
            self._ctx_get, self._ctx_set = cuda.cuCtxGetCurrent, cuda.cuCtxSetCurrent
            libc = ctypes.CDLL(None)
            usleep = ctypes.cast(libc.usleep, ctypes.c_void_p).value
        except (OSError, AttributeError) as exc:
            raise Unusable(f"cuLaunchHostFunc or usleep is missing: {exc}") from exc
        if not usleep:
            raise Unusable("libc's usleep has no address")
        self._usleep = ctypes.c_void_p(usleep)
        # CUresult cuLaunchHostFunc(CUstream hStream, CUhostFn fn, void* userData)
        self._launch.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        self._launch.restype = ctypes.c_int
        self._error_name.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        self._error_name.restype = ctypes.c_int
        self._ctx_get.argtypes, self._ctx_get.restype = [ctypes.POINTER(ctypes.c_void_p)], ctypes.c_int
        self._ctx_set.argtypes, self._ctx_set.restype = [ctypes.c_void_p], ctypes.c_int
        self._ctx = ctypes.c_void_p()  # torch's primary context, current on this thread (make synchronised)
        if self._ctx_get(ctypes.byref(self._ctx)) != 0 or not self._ctx.value:
            raise Unusable("no current CUDA context on the thread that made the neighbour")
        try:
            self.wait(1e-6)  # the driver starts its callback thread on the first host function
            self.self_test_ms = _self_test(dev, self.wait)
        except RuntimeError as exc:
            raise Unusable(f"a host-function stall failed: {exc}") from exc
        _check_self_test("host-function (usleep)", self.self_test_ms)

    def wait(self, gap_s: float) -> None:
        import torch

        us = min(MAX_USLEEP_US, max(1, round(gap_s * 1e6)))
        stream = torch.cuda.current_stream(self._dev).cuda_stream
        rc = self._launch(ctypes.c_void_p(stream), self._usleep, ctypes.c_void_p(us))
        if rc == CUDA_ERROR_INVALID_CONTEXT and self._ctx_set(self._ctx) == 0:  # a thread the runtime never bound
            rc = self._launch(ctypes.c_void_p(stream), self._usleep, ctypes.c_void_p(us))
        if rc != 0:
            raise RuntimeError(f"cuLaunchHostFunc returned {rc} ({self._name(rc)})")

    def _name(self, rc: int) -> str:
        name = ctypes.c_char_p()
        if self._error_name(rc, ctypes.byref(name)) != 0 or name.value is None:
            return "unknown CUresult"
        return name.value.decode()

    def _facts(self) -> dict[str, Any]:
        return {"self_test_ms": round(self.self_test_ms, 3)}


class _Spin(_Base):
    """A kernel whose marked elements spin on %globaltimer. The input holds `ctas` ones SPIN_STRIDE elements
    apart (zeros elsewhere return at once), so `ctas` blocks each hold one spinning thread; the other blocks of
    the launch exit at once. Were a block's work ever wider than SPIN_STRIDE, one thread would spin twice in a
    row and the self-test would see 2x the stall (and fall back)."""

    kind = "spin"

    def __init__(self, asked: str, dev: torch.device, ctas: int, fallback: str = "") -> None:
        super().__init__(asked, fallback)
        if ctas < 1:
            raise ValueError(f"ctas must be at least 1, not {ctas}")
        import torch

        self.ctas = ctas
        self._dev = dev
        try:
            from torch.cuda import jiterator

            self._fn = jiterator._create_jit_fn(SPIN_CODE, ns=0)
            self._input = torch.zeros((ctas - 1) * SPIN_STRIDE + 1, dtype=torch.float32, device=dev)
            self._input[::SPIN_STRIDE] = 1.0
            with torch.cuda.device(dev):
                self.wait(1e-6)  # compiles (NVRTC) and loads the kernel
                torch.cuda.synchronize(dev)
                self.self_test_ms = _self_test(dev, self.wait)
        except Exception as exc:  # jiterator raises whatever NVRTC and the driver give it
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise Unusable(f"the jiterator %globaltimer spin failed: {type(exc).__name__}: {first}") from exc
        _check_self_test(f"{ctas}-CTA %globaltimer spin", self.self_test_ms)

    def wait(self, gap_s: float) -> None:
        # The output (one float an element) comes from torch's caching allocator: no cudaMalloc once warm.
        self._fn(self._input, ns=max(1, round(gap_s * 1e9)))

    def _facts(self) -> dict[str, Any]:
        return {"spin_ctas": self.ctas, "self_test_ms": round(self.self_test_ms, 3)}


def make(asked: str, dev: torch.device, *, ctas: int = 1) -> Neighbour:
    """The neighbour `asked` for, or the nearest that works here (its `fallback` says why)."""
    if asked not in KINDS:
        raise ValueError(f"unknown neighbour {asked!r}: choose one of {', '.join(KINDS)}")
    if dev.type != "cuda":
        why = "" if asked == "cpu" else f"no CUDA device: {dev} cannot run a {asked} neighbour, the CPU sleeps the gaps"
        return _Cpu(asked, dev, why)
    import torch

    with torch.cuda.device(dev):
        torch.cuda.synchronize(dev)  # creates the primary context and makes it current on this thread
    if asked == "cpu":
        return _Cpu(asked, dev)
    if asked == "gpu":
        return _Gpu(asked, dev)
    reasons = []
    if asked == "spin":
        try:
            return _Spin(asked, dev, ctas)
        except Unusable as exc:
            reasons.append(f"spin: {exc}")
    try:
        why = "; ".join(reasons) + "; the stream stalls in a host function instead" if reasons else ""
        return _Wall(asked, dev, why)
    except Unusable as exc:
        reasons.append(f"wall: {exc}")
    return _Gpu(asked, dev, "; ".join(reasons) + "; the stream sleeps calibrated SM cycles instead")


def sleep_rate() -> float:
    """GPU clock cycles a second of `torch.cuda._sleep` (which spins for a number of cycles): median of 5,
    timed with CUDA events after a warm-up, on the current device."""
    import torch

    torch.cuda._sleep(1_000_000)
    torch.cuda.synchronize()
    rates = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(10_000_000)
        end.record()
        end.synchronize()
        rates.append(10_000_000 / (start.elapsed_time(end) / 1e3))
    return statistics.median(rates)


def _self_test(dev: torch.device, wait: Any) -> float:
    """Milliseconds a SELF_TEST_S wait holds the device's current stream, timed with CUDA events."""
    import torch

    stream = torch.cuda.current_stream(dev)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record(stream)
    wait(SELF_TEST_S)
    end.record(stream)
    end.synchronize()
    return float(start.elapsed_time(end))


def _check_self_test(what: str, ms: float) -> None:
    low, high = SELF_TEST_MS_OK
    if not low <= ms <= high:
        raise Unusable(f"a {SELF_TEST_S * 1e3:g} ms {what} stall measured {ms:.2f} ms (want {low:g}-{high:g} ms)")
