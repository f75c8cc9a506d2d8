"""The checks, in the order they run: each one's name (the `--only` key), where it lives and its time budget.

`overhead` runs last: it is the longest, and it measures one --edge-sync mode after another, so a budget that
runs short costs its last modes rather than the checks after it."""

from __future__ import annotations

from dataclasses import dataclass

_CHECKS = "freeride.tooling.gpucheck.checks"


@dataclass(frozen=True)
class CheckSpec:
    name: str
    target: str  # "package.module:function" or "/path/to/file.py:function"; the function takes a CheckContext
    about: str
    needs_cuda: bool = False
    budget_s: float = 60.0  # at most this long on a GPU run
    fake_budget_s: float = 60.0  # at most this long in a --fake-gpu run (small counts)
    min_s: float = 10.0  # less than this left of the run's budget: skipped, and reserved while earlier checks run

    def budget(self, fake: bool) -> float:
        return self.fake_budget_s if fake else self.budget_s


CHECKS: tuple[CheckSpec, ...] = (
    CheckSpec("environment", f"{_CHECKS}.host:environment",
              "Python, torch and CUDA, driver and GPU (NVML), package versions, MPS control program, cgroup v2, CPUs",
              budget_s=60, fake_budget_s=30, min_s=10),
    CheckSpec("doctor", f"{_CHECKS}.doctor:doctor", "`freeride doctor --json`, without MPS and with --mps start",
              budget_s=30, fake_budget_s=30, min_s=10),
    CheckSpec("torch-hooks", f"{_CHECKS}.host:torch_hooks",
              "the torch.distributed.pipelining modules that hold the hooked functions; torch vs TESTED_TORCH",
              budget_s=60, fake_budget_s=40, min_s=15),
    CheckSpec("mps-daemon", f"{_CHECKS}.mps_daemon:mps_daemon",
              "the MPS control daemon's life: start, health, servers, a client, clients, terminate_client, quit",
              budget_s=60, fake_budget_s=30, min_s=20),
    CheckSpec("mps-mem-limit", f"{_CHECKS}.mps_limit:mps_mem_limit",
              "an allocation past CUDA_MPS_PINNED_DEVICE_MEM_LIMIT fails inside the task only",
              needs_cuda=True, budget_s=120, min_s=45),
    CheckSpec("watchdog", f"{_CHECKS}.watchdog:watchdog",
              "the memory watchdog stops a task over its cap, without and with MPS; whom NVML credits the memory to",
              budget_s=150, fake_budget_s=90, min_s=45),
    CheckSpec("sidetasks", f"{_CHECKS}.sidetasks:sidetasks",
              "each shipped side task with device=cuda makes progress in a real agent's bubbles",
              needs_cuda=True, budget_s=150, min_s=60),
    CheckSpec("control", f"{_CHECKS}.bench:control",
              "`freeride bench control --json`: hook, event delay, grant, trainer CPU per edge",
              budget_s=90, fake_budget_s=45, min_s=30),
    CheckSpec("harvest", f"{_CHECKS}.bench:harvest", "`freeride bench harvest --json`: grant latency, efficiency",
              budget_s=90, fake_budget_s=45, min_s=30),
    CheckSpec("overhead", f"{_CHECKS}.bench:overhead",
              "`freeride bench overhead --json` on the GPU: slowdown, efficiency, stop after END",
              needs_cuda=True, budget_s=300, min_s=120),
)

NAMES: tuple[str, ...] = tuple(c.name for c in CHECKS)


def select(only: list[str], skip: list[str]) -> list[CheckSpec]:
    """The checks to run, in run order (names already validated)."""
    chosen = [c for c in CHECKS if not only or c.name in only]
    return [c for c in chosen if c.name not in skip]
