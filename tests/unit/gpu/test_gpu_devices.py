"""Specification of the device layer: the shipped fake, the NVML implementation over a stand-in pynvml,
and the per-worker memory probes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from freeride.errors import InvalidSpecError
from freeride.gpu import DeviceProbe, GpuError, HostProbe, NoGpuError, open_device
from freeride.gpu.fake import FakeDevice
from freeride.gpu.nvml import NvmlDevice

GiB = 2**30
MiB = 2**20


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    """A process holding ~64 MiB of touched memory, with a child of its own."""
    code = "import subprocess,sys,time; x=bytearray(b'x'*(64<<20)); " \
           "subprocess.Popen([sys.executable,'-c','import time; time.sleep(60)']); sys.stdout.write('ok\\n'); " \
           "sys.stdout.flush(); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True)
    assert proc.stdout is not None and proc.stdout.readline() == b"ok\n"
    yield proc
    os.killpg(proc.pid, 9)
    proc.wait()


def test_the_fake_takes_its_identity_and_memory_from_the_spec() -> None:
    d = FakeDevice.from_spec(2, "name=Fake H100,total=80GiB,used=60GiB,uuid=GPU-abc,mode=exclusive_process")
    assert (d.info.index, d.info.name, d.info.uuid, d.info.total_bytes) == (2, "Fake H100", "GPU-abc", 80 * GiB)
    m = d.memory()
    assert (m.total_bytes, m.used_bytes, m.free_bytes) == (80 * GiB, 60 * GiB, 20 * GiB)
    assert d.compute_mode() == "EXCLUSIVE_PROCESS"
    assert open_device(0, "default").info.total_bytes == 16 * GiB


@pytest.mark.parametrize("spec", ["total", "color=red", "total=1GiB,used=2GiB", "mode=SHARED", "total=lots"])
def test_a_bad_fake_spec_says_what_is_wrong(spec: str) -> None:
    with pytest.raises(InvalidSpecError, match=r"fake-gpu|memory size"):
        FakeDevice.from_spec(0, spec)


def test_the_fake_rereads_other_processes_usage_from_its_state_file(tmp_path: Path) -> None:
    state = tmp_path / "gpu.json"
    d = FakeDevice.from_spec(0, f"total=8GiB,used=1GiB,file={state}")
    assert d.memory().used_bytes == GiB  # no file yet: the spec's figure
    state.write_text(json.dumps({"used_bytes": 5 * GiB}))
    assert d.memory().free_bytes == 3 * GiB
    state.write_text("{not json")
    with pytest.raises(GpuError, match="unreadable"):
        d.memory()


def test_the_fake_attributes_a_clients_resident_memory_as_gpu_memory(child: subprocess.Popen[bytes]) -> None:
    d = FakeDevice.from_spec(0, "total=8GiB")
    assert d.process_memory() == {}  # only processes started as clients count
    d.add_client(child.pid)
    used = d.process_memory()[child.pid]
    assert used > 64 * MiB
    assert d.memory().used_bytes == pytest.approx(used, rel=0.2)  # its child may still be starting
    assert DeviceProbe(d).usage([child.pid]) == {child.pid: pytest.approx(used, rel=0.2)}


def test_the_host_probe_counts_a_worker_with_its_children_and_zero_once_gone(child: subprocess.Popen[bytes]) -> None:
    usage = HostProbe().usage([child.pid, 999_999_999])
    assert usage[child.pid] > 64 * MiB
    assert usage[999_999_999] == 0


# -- NVML, over a stand-in pynvml module ---------------------------------------------------------------
class _NVMLError(Exception):
    def __init__(self, value: int) -> None:
        self.value = value

    def __str__(self) -> str:
        return {12: "NVML Shared Library Not Found", 3: "Not Supported", 15: "GPU is lost"}.get(self.value, "?")


def _stand_in_pynvml(count: int = 1, mps_supported: bool = True, init_error: int = 0) -> Any:
    nv = types.SimpleNamespace()
    nv.NVMLError = _NVMLError
    nv.NVMLError_NotSupported = type("NVMLError_NotSupported", (_NVMLError,), {})
    nv.NVMLError_FunctionNotFound = type("NVMLError_FunctionNotFound", (_NVMLError,), {})
    nv.calls = []

    def init() -> None:
        if init_error:
            raise _NVMLError(init_error)
        nv.calls.append("init")

    nv.nvmlInit = init
    nv.nvmlShutdown = lambda: nv.calls.append("shutdown")
    nv.nvmlDeviceGetCount = lambda: count
    nv.nvmlDeviceGetHandleByIndex = lambda i: f"h{i}"
    nv.nvmlDeviceGetUUID = lambda h: "GPU-1234"
    nv.nvmlDeviceGetName = lambda h: "NVIDIA H100 80GB HBM3"
    nv.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=80 * GiB, free=30 * GiB, used=50 * GiB)
    nv.nvmlDeviceGetComputeMode = lambda h: 3
    proc = types.SimpleNamespace
    nv.nvmlDeviceGetComputeRunningProcesses = lambda h: [proc(pid=10, usedGpuMemory=40 * GiB),
                                                         proc(pid=11, usedGpuMemory=None)]

    def mps(h: str) -> list[Any]:
        if not mps_supported:
            raise nv.NVMLError_NotSupported(3)
        return [proc(pid=20, usedGpuMemory=2 * GiB)]

    nv.nvmlDeviceGetMPSComputeRunningProcesses = mps
    return nv


def _use(monkeypatch: pytest.MonkeyPatch, nv: Any) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", nv)


def test_nvml_reads_identity_memory_mode_and_per_process_memory_with_mps_clients(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    nv = _stand_in_pynvml()
    _use(monkeypatch, nv)
    d = NvmlDevice.open(0)
    assert (d.info.uuid, d.info.name, d.info.total_bytes) == ("GPU-1234", "NVIDIA H100 80GB HBM3", 80 * GiB)
    assert d.memory().free_bytes == 30 * GiB
    assert d.compute_mode() == "EXCLUSIVE_PROCESS"
    assert d.process_memory() == {10: 40 * GiB, 20: 2 * GiB}  # no figure for 11: left out, not counted as 0
    d.close()
    assert nv.calls == ["init", "shutdown"]


def test_nvml_without_the_mps_list_falls_back_to_compute_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    _use(monkeypatch, _stand_in_pynvml(mps_supported=False))
    d = NvmlDevice.open(0)
    assert d.process_memory() == {10: 40 * GiB}
    assert d.process_memory() == {10: 40 * GiB}  # asked once, remembered


def test_no_library_or_no_such_gpu_means_no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    _use(monkeypatch, _stand_in_pynvml(init_error=12))
    with pytest.raises(NoGpuError, match="NVML unavailable: NVML Shared Library Not Found"):
        NvmlDevice.open(0)
    nv = _stand_in_pynvml(count=1)
    _use(monkeypatch, nv)
    with pytest.raises(NoGpuError, match="GPU 3 does not exist: NVML sees 1 device"):
        NvmlDevice.open(3)
    assert nv.calls == ["init", "shutdown"]


def test_a_failing_query_becomes_a_gpu_error(monkeypatch: pytest.MonkeyPatch) -> None:
    nv = _stand_in_pynvml()
    _use(monkeypatch, nv)
    d = NvmlDevice.open(0)

    def lost(h: str) -> None:
        raise _NVMLError(15)

    nv.nvmlDeviceGetMemoryInfo = lost
    with pytest.raises(GpuError, match="NVML memory info on GPU 0 failed: GPU is lost"):
        d.memory()

