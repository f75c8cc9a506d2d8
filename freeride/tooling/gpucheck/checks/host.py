"""`environment` (what this host is: information, always passed) and `torch-hooks` (where the installed torch
keeps the functions freeride's pipelining hook wraps)."""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import pkgutil
import platform
import shutil
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import freeride
from freeride.tooling.gpucheck.model import FAKE_GPU_SPEC, MPS_CONTROL, CheckContext, Outcome, failed, passed

# freeride's parts that must import on this host (the agent needs grpcio-health-checking, pools need redis, ...)
MODULES = ("freeride.agent.server", "freeride.cli.app", "freeride.client", "freeride.trainer.reporter",
           "freeride.worker.process", "freeride.gpu.nvml", "freeride.tooling.harness")
PACKAGES = ("torch", "numpy", "grpcio", "grpcio-health-checking", "protobuf", "nvidia-ml-py", "psutil", "redis",
            "scikit-learn", "scikit-image")
HOOKED = ("_wait_batch_p2p", "_batch_p2p")  # what freeride.trainer.torch_pipelining wraps
_GiB = 2**30


def environment(ctx: CheckContext) -> Outcome:
    torch = _torch()
    nvml = _nvml(ctx.gpu)
    cgroup = _cgroup()
    mps = shutil.which(MPS_CONTROL)
    details: dict[str, Any] = {
        "python": {"version": platform.python_version(), "executable": sys.executable},
        "platform": {"kernel": platform.release(), "machine": platform.machine(), "hostname": platform.node()},
        "freeride": {"version": freeride.__version__, "path": str(Path(freeride.__file__).parent)},
        "torch": torch,
        "nvml": nvml,
        "packages": {name: _version(name) for name in PACKAGES},
        "imports": {name: _imports(name) for name in MODULES},
        "mps_control": {"name": MPS_CONTROL, "path": mps},
        "cgroup": cgroup,
        "cpus": {"nproc": os.cpu_count(), "usable": len(os.sched_getaffinity(0))},
        "fake_gpu": FAKE_GPU_SPEC if ctx.fake else None,
    }
    gpu = nvml.get("gpu") or {}
    if torch.get("version"):
        cuda = (f"CUDA {torch['cuda_build']} build" if torch.get("cuda_build") else "CPU build") + (
            ", sees the GPU" if torch.get("cuda_available") else ", no CUDA device")
        torch_text = f"torch {torch['version']} ({cuda})"
    else:
        torch_text = f"no torch ({torch.get('error', '')})"
    gpu_text = (f"{gpu.get('name')} {gpu.get('total_bytes', 0) / _GiB:.0f} GiB, driver {nvml.get('driver_version')}"
                if gpu else f"no NVML ({nvml.get('error', '')})")
    broken = [name for name, state in details["imports"].items() if state != "ok"]
    summary = (f"Python {platform.python_version()}, {torch_text}, {gpu_text}, "
               f"{MPS_CONTROL} {'found' if mps else 'absent'}, "
               f"cgroup v2 {'writable' if cgroup.get('writable') else 'not writable'}, "
               f"{details['cpus']['usable']} CPUs"
               + (f"; does not import: {', '.join(broken)}" if broken else ""))
    return passed(summary, **details)


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _imports(module: str) -> str:
    try:
        importlib.import_module(module)
    except Exception as exc:  # what is missing on this host is the information
        return f"{type(exc).__name__}: {exc}"
    return "ok"


def _torch() -> dict[str, Any]:
    try:
        import torch
    except Exception as exc:  # an ImportError, or a broken CUDA library under it
        return {"version": None, "error": f"{type(exc).__name__}: {exc}", "cuda_available": False}
    out: dict[str, Any] = {"version": torch.__version__, "cuda_build": torch.version.cuda}
    try:
        out["cuda_available"] = bool(torch.cuda.is_available())
        devices = []
        for i in range(torch.cuda.device_count() if out["cuda_available"] else 0):
            p = torch.cuda.get_device_properties(i)
            devices.append({"index": i, "name": p.name, "capability": f"{p.major}.{p.minor}",
                            "total_bytes": int(p.total_memory), "multiprocessors": p.multi_processor_count})
        out["devices"] = devices
    except Exception as exc:  # a driver that torch cannot talk to
        out["cuda_available"] = False
        out["error"] = f"{type(exc).__name__}: {exc}"
    return out


def _nvml(index: int) -> dict[str, Any]:
    try:
        import pynvml as nv
    except ImportError as exc:
        return {"error": f"nvidia-ml-py does not import: {exc}"}
    try:
        nv.nvmlInit()
    except nv.NVMLError as exc:
        return {"error": f"NVML unavailable: {exc}"}
    try:
        out: dict[str, Any] = {"driver_version": str(nv.nvmlSystemGetDriverVersion()),
                               "device_count": int(nv.nvmlDeviceGetCount())}
        try:
            v = int(nv.nvmlSystemGetCudaDriverVersion())
            out["cuda_driver_version"] = f"{v // 1000}.{v % 1000 // 10}"
        except nv.NVMLError:
            pass
        if index < out["device_count"]:
            h = nv.nvmlDeviceGetHandleByIndex(index)
            mem = nv.nvmlDeviceGetMemoryInfo(h)
            out["gpu"] = {"index": index, "name": str(nv.nvmlDeviceGetName(h)), "uuid": str(nv.nvmlDeviceGetUUID(h)),
                          "total_bytes": int(mem.total), "used_bytes": int(mem.used), "free_bytes": int(mem.free),
                          "compute_mode": int(nv.nvmlDeviceGetComputeMode(h))}
        else:
            out["error"] = f"--gpu {index}: NVML sees {out['device_count']} device(s)"
        return out
    except nv.NVMLError as exc:
        return {"error": f"NVML query failed: {exc}"}
    finally:
        nv.nvmlShutdown()


def _cgroup() -> dict[str, Any]:
    """Whether this process may create (and remove) a cgroup v2 group beside itself, as the agent would."""
    try:
        from freeride.agent.procs.cgroups import own_group, v2_mount
    except Exception as exc:  # the agent's package does not import here: said in "imports" too
        return {"writable": False, "error": f"freeride.agent.procs.cgroups does not import: {exc}"}
    mount, group = v2_mount(), own_group()
    out: dict[str, Any] = {"v2_mount": str(mount) if mount else None, "own_group": group, "writable": False}
    if mount is None or group is None:
        out["error"] = "no cgroup v2 hierarchy mounted" if mount is None else "no cgroup v2 entry in /proc/self/cgroup"
        return out
    probe = mount / group.lstrip("/") / f"freeride-gpucheck-{os.getpid()}"
    out["tried"] = str(probe)
    try:
        probe.mkdir()
    except OSError as exc:
        out["error"] = f"cannot create {probe}: {exc.strerror or exc}"
        return out
    try:
        probe.rmdir()
    except OSError as exc:
        out["error"] = f"created {probe} but cannot remove it: {exc.strerror or exc}"
        return out
    out["writable"] = True
    return out


def torch_hooks(ctx: CheckContext) -> Outcome:
    try:
        import torch
        import torch.distributed.pipelining as pipelining
    except Exception as exc:  # no torch, or one built without torch.distributed
        return failed(f"torch.distributed.pipelining does not import: {type(exc).__name__}: {exc}")
    import_errors = {}
    for info in pkgutil.walk_packages(pipelining.__path__, pipelining.__name__ + "."):
        try:
            importlib.import_module(info.name)
        except Exception as exc:  # a submodule that needs what this host lacks: recorded, the scan goes on
            import_errors[info.name] = f"{type(exc).__name__}: {exc}"
    holders: dict[str, dict[str, str]] = {}
    for name, module in sorted(sys.modules.items()):
        if not name.startswith("torch.") or not isinstance(module, ModuleType):
            continue
        found = {attr: _where(obj) for attr in HOOKED if (obj := vars(module).get(attr)) is not None}
        if found:
            holders[name] = found
    from freeride.trainer import torch_pipelining as tp

    tested = str(getattr(tp, "TESTED_TORCH", ""))
    in_range = _version_in(torch.__version__, tested)
    details: dict[str, Any] = {"torch": torch.__version__, "tested_torch": tested, "torch_in_tested_range": in_range,
                               "holders": holders, "import_errors": import_errors}
    hook_points = getattr(tp, "hook_points", None)
    if callable(hook_points):
        try:
            details["hook_points"] = _plain(hook_points())
        except Exception as exc:  # its own failure is evidence too
            details["hook_points_error"] = f"{type(exc).__name__}: {exc}"
    else:
        details["hook_points"] = "freeride.trainer.torch_pipelining.hook_points() does not exist in this checkout"
    missing = [attr for attr in HOOKED if not any(attr in h for h in holders.values())]
    version = f"torch {torch.__version__} ({'in' if in_range else 'outside' if in_range is False else '?'} " \
              f"tested {tested})"
    if missing:
        return failed(f"no torch module holds {', '.join(missing)}: the hook has nothing to wrap; {version}", **details)
    wait_in = sorted(n for n, h in holders.items() if "_wait_batch_p2p" in h)
    return passed(f"_wait_batch_p2p in {', '.join(wait_in)}; {len(holders)} module(s) hold a hook point; {version}",
                  **details)


def _where(obj: object) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', type(obj).__name__)}"


def _plain(obj: object) -> Any:
    """Any answer as JSON data: modules by name, functions by where they are defined."""
    if obj is None or isinstance(obj, str | int | float | bool):
        return obj
    if isinstance(obj, dict):
        return {str(_plain(k)): _plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple | set | frozenset):
        return [_plain(v) for v in obj]
    if isinstance(obj, ModuleType):
        return obj.__name__
    if callable(obj):
        return _where(obj)
    return repr(obj)[:200]


def _version_in(version: str, spec: str) -> bool | None:
    """Whether `version` (local part and all) is in the range `spec` (">=2.13,<2.14"); None if either is unreadable."""
    try:
        from packaging.specifiers import InvalidSpecifier, SpecifierSet
        from packaging.version import InvalidVersion, Version
    except ImportError:
        return None
    try:
        return Version(version.split("+")[0]) in SpecifierSet(spec)
    except (InvalidSpecifier, InvalidVersion):
        return None
