"""A GPU that is not there, shipped in the product (`freeride agent --fake-gpu SPEC`), like dcgm-exporter's
--fake-gpus: the whole agent (admission, caps, watchdog, MPS handling, telemetry) runs without a GPU.

What it reports, honestly:
- identity and total memory come from the spec;
- "other processes" (the trainer, say) use `used` bytes, re-read from `file` (JSON `{"used_bytes": N}`)
  on every query when one is given, so a test can change it while the agent runs;
- a worker's GPU memory is its resident set size (with its children's): a CPU task that allocates
  shows up as a task allocating GPU memory. Only processes the agent started as clients count.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from freeride.core.units import parse_size
from freeride.errors import InvalidSpecError
from freeride.gpu.device import COMPUTE_MODES, DeviceInfo, GpuError, MemoryInfo
from freeride.gpu.probe import rss_bytes

log = logging.getLogger(__name__)

DEFAULT_SPEC = "name=Fake GPU,total=16GiB"
_KEYS = ("name", "total", "used", "uuid", "mode", "file")


class FakeDevice:
    kind = "fake"

    def __init__(self, info: DeviceInfo, used_bytes: int = 0, mode: str = "DEFAULT", file: Path | None = None) -> None:
        self.info = info
        self._used = used_bytes
        self._mode = mode
        self._file = file
        self._clients: set[int] = set()

    @classmethod
    def from_spec(cls, index: int, spec: str) -> FakeDevice:
        """'name=Fake H100,total=80GiB,used=60GiB,mode=DEFAULT,file=/path/state.json' (every key optional)."""
        values: dict[str, str] = {}
        for part in filter(None, (p.strip() for p in (spec if spec != "default" else DEFAULT_SPEC).split(","))):
            key, sep, value = part.partition("=")
            if not sep or key not in _KEYS:
                raise InvalidSpecError(f"--fake-gpu: bad item {part!r}; use key=value with keys {', '.join(_KEYS)}")
            values[key] = value
        total = parse_size(values.get("total", "16GiB"))
        used = parse_size(values.get("used", "0"))
        mode = values.get("mode", "DEFAULT").upper()
        if total <= 0 or used > total:
            raise InvalidSpecError(f"--fake-gpu: need 0 < used <= total, got total={total} used={used}")
        if mode not in COMPUTE_MODES.values():
            raise InvalidSpecError(f"--fake-gpu: mode must be one of {', '.join(COMPUTE_MODES.values())}")
        info = DeviceInfo(index, values.get("uuid", f"GPU-fake-{index:04d}"), values.get("name", "Fake GPU"), total)
        file = Path(values["file"]) if "file" in values else None
        return cls(info, used, mode, file)

    def _other_used(self) -> int:
        if self._file is None:
            return self._used
        try:
            return int(json.loads(self._file.read_text())["used_bytes"])
        except FileNotFoundError:
            return self._used
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise GpuError(f"fake GPU state file {self._file} is unreadable: {exc}") from None

    def process_memory(self) -> dict[int, int]:
        out = {}
        for pid in list(self._clients):
            used = rss_bytes(pid)
            if used:
                out[pid] = used
            else:
                self._clients.discard(pid)  # gone
        return out

    def memory(self) -> MemoryInfo:
        used = min(self.info.total_bytes, self._other_used() + sum(self.process_memory().values()))
        return MemoryInfo(self.info.total_bytes, self.info.total_bytes - used, used)

    def compute_mode(self) -> str:
        return self._mode

    def add_client(self, pid: int) -> None:
        self._clients.add(pid)

    def close(self) -> None:
        self._clients.clear()
