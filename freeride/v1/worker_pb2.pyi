from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WindowEndReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WINDOW_END_REASON_UNSPECIFIED: _ClassVar[WindowEndReason]
    WINDOW_END_REASON_REVOKED: _ClassVar[WindowEndReason]
    WINDOW_END_REASON_EXPIRED: _ClassVar[WindowEndReason]
    WINDOW_END_REASON_NO_FIT: _ClassVar[WindowEndReason]
    WINDOW_END_REASON_DONE: _ClassVar[WindowEndReason]
    WINDOW_END_REASON_STOPPING: _ClassVar[WindowEndReason]
    WINDOW_END_REASON_UNAVAILABLE: _ClassVar[WindowEndReason]
    WINDOW_END_REASON_CHECKPOINT: _ClassVar[WindowEndReason]

class ControlAction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CONTROL_ACTION_UNSPECIFIED: _ClassVar[ControlAction]
    CONTROL_ACTION_PAUSE: _ClassVar[ControlAction]
    CONTROL_ACTION_CANCEL: _ClassVar[ControlAction]
    CONTROL_ACTION_CHECKPOINT: _ClassVar[ControlAction]
WINDOW_END_REASON_UNSPECIFIED: WindowEndReason
WINDOW_END_REASON_REVOKED: WindowEndReason
WINDOW_END_REASON_EXPIRED: WindowEndReason
WINDOW_END_REASON_NO_FIT: WindowEndReason
WINDOW_END_REASON_DONE: WindowEndReason
WINDOW_END_REASON_STOPPING: WindowEndReason
WINDOW_END_REASON_UNAVAILABLE: WindowEndReason
WINDOW_END_REASON_CHECKPOINT: WindowEndReason
CONTROL_ACTION_UNSPECIFIED: ControlAction
CONTROL_ACTION_PAUSE: ControlAction
CONTROL_ACTION_CANCEL: ControlAction
CONTROL_ACTION_CHECKPOINT: ControlAction

class WorkerMessage(_message.Message):
    __slots__ = ("hello", "ready", "steps", "window_done", "checkpointed", "finished", "failed", "waiting", "checkpointing", "idle_cpu")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    WINDOW_DONE_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINTED_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINTING_FIELD_NUMBER: _ClassVar[int]
    IDLE_CPU_FIELD_NUMBER: _ClassVar[int]
    hello: WorkerHello
    ready: WorkerReady
    steps: StepReport
    window_done: WindowDone
    checkpointed: Checkpointed
    finished: WorkerFinished
    failed: WorkerFailed
    waiting: WorkerWaiting
    checkpointing: WorkerCheckpointing
    idle_cpu: WorkerIdleCpu
    def __init__(self, hello: _Optional[_Union[WorkerHello, _Mapping]] = ..., ready: _Optional[_Union[WorkerReady, _Mapping]] = ..., steps: _Optional[_Union[StepReport, _Mapping]] = ..., window_done: _Optional[_Union[WindowDone, _Mapping]] = ..., checkpointed: _Optional[_Union[Checkpointed, _Mapping]] = ..., finished: _Optional[_Union[WorkerFinished, _Mapping]] = ..., failed: _Optional[_Union[WorkerFailed, _Mapping]] = ..., waiting: _Optional[_Union[WorkerWaiting, _Mapping]] = ..., checkpointing: _Optional[_Union[WorkerCheckpointing, _Mapping]] = ..., idle_cpu: _Optional[_Union[WorkerIdleCpu, _Mapping]] = ...) -> None: ...

class WorkerHello(_message.Message):
    __slots__ = ("task_id", "instance", "pid")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    instance: int
    pid: int
    def __init__(self, task_id: _Optional[str] = ..., instance: _Optional[int] = ..., pid: _Optional[int] = ...) -> None: ...

class WorkerReady(_message.Message):
    __slots__ = ("kind", "resumed_steps", "progress")
    class ProgressEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    KIND_FIELD_NUMBER: _ClassVar[int]
    RESUMED_STEPS_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    kind: str
    resumed_steps: int
    progress: _containers.ScalarMap[str, float]
    def __init__(self, kind: _Optional[str] = ..., resumed_steps: _Optional[int] = ..., progress: _Optional[_Mapping[str, float]] = ...) -> None: ...

class Step(_message.Message):
    __slots__ = ("start_ns", "duration_ns")
    START_NS_FIELD_NUMBER: _ClassVar[int]
    DURATION_NS_FIELD_NUMBER: _ClassVar[int]
    start_ns: int
    duration_ns: int
    def __init__(self, start_ns: _Optional[int] = ..., duration_ns: _Optional[int] = ...) -> None: ...

class StepReport(_message.Message):
    __slots__ = ("window_id", "steps", "progress", "peak_memory_bytes")
    class ProgressEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    WINDOW_ID_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    PEAK_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    window_id: int
    steps: _containers.RepeatedCompositeFieldContainer[Step]
    progress: _containers.ScalarMap[str, float]
    peak_memory_bytes: int
    def __init__(self, window_id: _Optional[int] = ..., steps: _Optional[_Iterable[_Union[Step, _Mapping]]] = ..., progress: _Optional[_Mapping[str, float]] = ..., peak_memory_bytes: _Optional[int] = ...) -> None: ...

class WindowDone(_message.Message):
    __slots__ = ("window_id", "reason", "idle_ns", "step_estimate_ns", "woke_ns")
    WINDOW_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    IDLE_NS_FIELD_NUMBER: _ClassVar[int]
    STEP_ESTIMATE_NS_FIELD_NUMBER: _ClassVar[int]
    WOKE_NS_FIELD_NUMBER: _ClassVar[int]
    window_id: int
    reason: WindowEndReason
    idle_ns: int
    step_estimate_ns: int
    woke_ns: int
    def __init__(self, window_id: _Optional[int] = ..., reason: _Optional[_Union[WindowEndReason, str]] = ..., idle_ns: _Optional[int] = ..., step_estimate_ns: _Optional[int] = ..., woke_ns: _Optional[int] = ...) -> None: ...

class Checkpointed(_message.Message):
    __slots__ = ("steps", "path", "progress")
    class ProgressEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    STEPS_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    steps: int
    path: str
    progress: _containers.ScalarMap[str, float]
    def __init__(self, steps: _Optional[int] = ..., path: _Optional[str] = ..., progress: _Optional[_Mapping[str, float]] = ...) -> None: ...

class WorkerFinished(_message.Message):
    __slots__ = ("progress",)
    class ProgressEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    progress: _containers.ScalarMap[str, float]
    def __init__(self, progress: _Optional[_Mapping[str, float]] = ...) -> None: ...

class WorkerFailed(_message.Message):
    __slots__ = ("reason", "retryable")
    REASON_FIELD_NUMBER: _ClassVar[int]
    RETRYABLE_FIELD_NUMBER: _ClassVar[int]
    reason: str
    retryable: bool
    def __init__(self, reason: _Optional[str] = ..., retryable: bool = ...) -> None: ...

class WorkerWaiting(_message.Message):
    __slots__ = ("reason", "waiting")
    REASON_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    reason: str
    waiting: bool
    def __init__(self, reason: _Optional[str] = ..., waiting: bool = ...) -> None: ...

class WorkerCheckpointing(_message.Message):
    __slots__ = ("active",)
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    active: bool
    def __init__(self, active: bool = ...) -> None: ...

class WorkerIdleCpu(_message.Message):
    __slots__ = ("cpu_ns", "idle_ns")
    CPU_NS_FIELD_NUMBER: _ClassVar[int]
    IDLE_NS_FIELD_NUMBER: _ClassVar[int]
    cpu_ns: int
    idle_ns: int
    def __init__(self, cpu_ns: _Optional[int] = ..., idle_ns: _Optional[int] = ...) -> None: ...

class AgentCommand(_message.Message):
    __slots__ = ("setup", "control")
    SETUP_FIELD_NUMBER: _ClassVar[int]
    CONTROL_FIELD_NUMBER: _ClassVar[int]
    setup: WorkerSetup
    control: Control
    def __init__(self, setup: _Optional[_Union[WorkerSetup, _Mapping]] = ..., control: _Optional[_Union[Control, _Mapping]] = ...) -> None: ...

class WorkerSetup(_message.Message):
    __slots__ = ("task_ref", "args", "checkpoint_path", "checkpoint_interval_s", "mem_limit_bytes")
    class ArgsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TASK_REF_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_PATH_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    MEM_LIMIT_BYTES_FIELD_NUMBER: _ClassVar[int]
    task_ref: str
    args: _containers.ScalarMap[str, str]
    checkpoint_path: str
    checkpoint_interval_s: float
    mem_limit_bytes: int
    def __init__(self, task_ref: _Optional[str] = ..., args: _Optional[_Mapping[str, str]] = ..., checkpoint_path: _Optional[str] = ..., checkpoint_interval_s: _Optional[float] = ..., mem_limit_bytes: _Optional[int] = ...) -> None: ...

class Control(_message.Message):
    __slots__ = ("action",)
    ACTION_FIELD_NUMBER: _ClassVar[int]
    action: ControlAction
    def __init__(self, action: _Optional[_Union[ControlAction, str]] = ...) -> None: ...
