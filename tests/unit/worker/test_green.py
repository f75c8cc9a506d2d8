"""--green-sms: a side task's kernels in a CUDA green context of N SMs (freeride/worker/green.py), from the agent's
setting to the worker's environment to the context made current; anything missing is one line, never a failure."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from freeride.agent.config import AgentConfig, ConfigError
from freeride.gpu.control import GpuControl
from freeride.gpu.fake import FakeDevice
from freeride.worker import green


class FakeGreenContext:
    made: list[dict[str, Any]] = []

    def __init__(self) -> None:
        self.current = False

    @classmethod
    def create(cls, **kwargs: Any) -> FakeGreenContext:
        cls.made.append(kwargs)
        return cls()

    def set_context(self) -> None:
        self.current = True


def fake_torch(with_green: bool = True) -> Any:
    cuda = SimpleNamespace(green_contexts=SimpleNamespace(GreenContext=FakeGreenContext)) if with_green \
        else SimpleNamespace()
    return SimpleNamespace(__version__="2.99", cuda=cuda)


def test_the_worker_makes_a_green_context_of_the_asked_sms_current_on_its_device() -> None:
    FakeGreenContext.made = []
    said = green.enter(16, "cuda:0", torch=fake_torch())
    assert said == "kernels run in a green context of 16 SMs on cuda:0"
    assert FakeGreenContext.made == [{"num_sms": 16, "device_id": 0}]
    assert green._entered[-1].current


@pytest.mark.parametrize(("sms", "device"), [(0, "cuda:0"), (16, "cpu")])
def test_nothing_is_asked_off_or_on_a_cpu(sms: int, device: str) -> None:
    FakeGreenContext.made = []
    assert green.enter(sms, device, torch=fake_torch()) == ""
    assert FakeGreenContext.made == []


def test_a_torch_without_green_contexts_or_a_refusing_driver_is_one_line_and_the_task_runs() -> None:
    assert green.enter(8, "cuda:0", torch=fake_torch(with_green=False)) == (
        "--green-sms 8 ignored: torch 2.99 has no torch.cuda.green_contexts")

    class Refused(FakeGreenContext):
        @classmethod
        def create(cls, **kwargs: Any) -> FakeGreenContext:
            raise RuntimeError("CUDA driver 12.4 is too old for green contexts")

    refusing = SimpleNamespace(green_contexts=SimpleNamespace(GreenContext=Refused))
    torch = SimpleNamespace(__version__="2.99", cuda=refusing)
    assert green.enter(8, "cuda:0", torch=torch) == (
        "--green-sms 8 ignored: RuntimeError: CUDA driver 12.4 is too old for green contexts")


def test_the_agents_setting_reaches_the_workers_environment_and_is_checked() -> None:
    control = GpuControl(FakeDevice.from_spec(0, ""), None, gpu=0, green_sms=66)
    env = control.client_env({}, mem_limit_bytes=0, no_mps=False)
    assert env is not None and env["FREERIDE_GREEN_SMS"] == "66"
    off = GpuControl(FakeDevice.from_spec(0, ""), None, gpu=0).client_env({}, mem_limit_bytes=0, no_mps=False)
    assert off is not None and "FREERIDE_GREEN_SMS" not in off
    with pytest.raises(ConfigError, match=r"--green-sms must be >= 0 \(0: off\), got -1"):
        AgentConfig(green_sms=-1).validate()
