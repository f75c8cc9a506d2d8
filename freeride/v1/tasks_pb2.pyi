from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TaskState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TASK_STATE_UNSPECIFIED: _ClassVar[TaskState]
    TASK_STATE_SUBMITTED: _ClassVar[TaskState]
    TASK_STATE_STARTING: _ClassVar[TaskState]
    TASK_STATE_READY: _ClassVar[TaskState]
    TASK_STATE_RUNNING: _ClassVar[TaskState]
    TASK_STATE_PAUSED: _ClassVar[TaskState]
    TASK_STATE_DONE: _ClassVar[TaskState]
    TASK_STATE_FAILED: _ClassVar[TaskState]
    TASK_STATE_CANCELLED: _ClassVar[TaskState]
TASK_STATE_UNSPECIFIED: TaskState
TASK_STATE_SUBMITTED: TaskState
TASK_STATE_STARTING: TaskState
TASK_STATE_READY: TaskState
TASK_STATE_RUNNING: TaskState
TASK_STATE_PAUSED: TaskState
TASK_STATE_DONE: TaskState
TASK_STATE_FAILED: TaskState
TASK_STATE_CANCELLED: TaskState

class TaskSpec(_message.Message):
    __slots__ = ("name", "ref", "args", "priority", "mem_limit_bytes", "max_restarts", "checkpoint_interval_s", "python", "no_mps")
    class ArgsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    REF_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    MEM_LIMIT_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_RESTARTS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    PYTHON_FIELD_NUMBER: _ClassVar[int]
    NO_MPS_FIELD_NUMBER: _ClassVar[int]
    name: str
    ref: str
    args: _containers.ScalarMap[str, str]
    priority: int
    mem_limit_bytes: int
    max_restarts: int
    checkpoint_interval_s: float
    python: str
    no_mps: bool
    def __init__(self, name: _Optional[str] = ..., ref: _Optional[str] = ..., args: _Optional[_Mapping[str, str]] = ..., priority: _Optional[int] = ..., mem_limit_bytes: _Optional[int] = ..., max_restarts: _Optional[int] = ..., checkpoint_interval_s: _Optional[float] = ..., python: _Optional[str] = ..., no_mps: bool = ...) -> None: ...

class TaskCounters(_message.Message):
    __slots__ = ("steps", "harvested_s", "overrun_s", "overrun_steps", "windows", "killed_steps", "step_estimate_s", "peak_memory_bytes")
    STEPS_FIELD_NUMBER: _ClassVar[int]
    HARVESTED_S_FIELD_NUMBER: _ClassVar[int]
    OVERRUN_S_FIELD_NUMBER: _ClassVar[int]
    OVERRUN_STEPS_FIELD_NUMBER: _ClassVar[int]
    WINDOWS_FIELD_NUMBER: _ClassVar[int]
    KILLED_STEPS_FIELD_NUMBER: _ClassVar[int]
    STEP_ESTIMATE_S_FIELD_NUMBER: _ClassVar[int]
    PEAK_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    steps: int
    harvested_s: float
    overrun_s: float
    overrun_steps: int
    windows: int
    killed_steps: int
    step_estimate_s: float
    peak_memory_bytes: int
    def __init__(self, steps: _Optional[int] = ..., harvested_s: _Optional[float] = ..., overrun_s: _Optional[float] = ..., overrun_steps: _Optional[int] = ..., windows: _Optional[int] = ..., killed_steps: _Optional[int] = ..., step_estimate_s: _Optional[float] = ..., peak_memory_bytes: _Optional[int] = ...) -> None: ...

class TaskInfo(_message.Message):
    __slots__ = ("id", "spec", "state", "reason", "restarts", "created_unix_s", "updated_unix_s", "counters", "progress", "checkpoint_steps", "kind", "pid", "memory_bytes", "log_path")
    class ProgressEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RESTARTS_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    UPDATED_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_STEPS_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    LOG_PATH_FIELD_NUMBER: _ClassVar[int]
    id: str
    spec: TaskSpec
    state: TaskState
    reason: str
    restarts: int
    created_unix_s: float
    updated_unix_s: float
    counters: TaskCounters
    progress: _containers.ScalarMap[str, float]
    checkpoint_steps: int
    kind: str
    pid: int
    memory_bytes: int
    log_path: str
    def __init__(self, id: _Optional[str] = ..., spec: _Optional[_Union[TaskSpec, _Mapping]] = ..., state: _Optional[_Union[TaskState, str]] = ..., reason: _Optional[str] = ..., restarts: _Optional[int] = ..., created_unix_s: _Optional[float] = ..., updated_unix_s: _Optional[float] = ..., counters: _Optional[_Union[TaskCounters, _Mapping]] = ..., progress: _Optional[_Mapping[str, float]] = ..., checkpoint_steps: _Optional[int] = ..., kind: _Optional[str] = ..., pid: _Optional[int] = ..., memory_bytes: _Optional[int] = ..., log_path: _Optional[str] = ...) -> None: ...

class SubmitRequest(_message.Message):
    __slots__ = ("spec",)
    SPEC_FIELD_NUMBER: _ClassVar[int]
    spec: TaskSpec
    def __init__(self, spec: _Optional[_Union[TaskSpec, _Mapping]] = ...) -> None: ...

class TaskRef(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class ListRequest(_message.Message):
    __slots__ = ("states",)
    STATES_FIELD_NUMBER: _ClassVar[int]
    states: _containers.RepeatedScalarFieldContainer[TaskState]
    def __init__(self, states: _Optional[_Iterable[_Union[TaskState, str]]] = ...) -> None: ...

class ListResponse(_message.Message):
    __slots__ = ("tasks",)
    TASKS_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[TaskInfo]
    def __init__(self, tasks: _Optional[_Iterable[_Union[TaskInfo, _Mapping]]] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GpuStats(_message.Message):
    __slots__ = ("gpu", "bubbles", "bubble_s", "harvested_s", "overrun_s", "overrun_steps", "steps", "windows", "events", "prediction_error_p50", "uptime_s", "dropped_events", "trainers", "event_delay_us_p50", "event_delay_us_p99", "rejected_events", "trainer_free_memory_bytes", "windows_granted", "memory", "trainer_streams", "training_s")
    GPU_FIELD_NUMBER: _ClassVar[int]
    BUBBLES_FIELD_NUMBER: _ClassVar[int]
    BUBBLE_S_FIELD_NUMBER: _ClassVar[int]
    HARVESTED_S_FIELD_NUMBER: _ClassVar[int]
    OVERRUN_S_FIELD_NUMBER: _ClassVar[int]
    OVERRUN_STEPS_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    WINDOWS_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    PREDICTION_ERROR_P50_FIELD_NUMBER: _ClassVar[int]
    UPTIME_S_FIELD_NUMBER: _ClassVar[int]
    DROPPED_EVENTS_FIELD_NUMBER: _ClassVar[int]
    TRAINERS_FIELD_NUMBER: _ClassVar[int]
    EVENT_DELAY_US_P50_FIELD_NUMBER: _ClassVar[int]
    EVENT_DELAY_US_P99_FIELD_NUMBER: _ClassVar[int]
    REJECTED_EVENTS_FIELD_NUMBER: _ClassVar[int]
    TRAINER_FREE_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    WINDOWS_GRANTED_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    TRAINER_STREAMS_FIELD_NUMBER: _ClassVar[int]
    TRAINING_S_FIELD_NUMBER: _ClassVar[int]
    gpu: int
    bubbles: int
    bubble_s: float
    harvested_s: float
    overrun_s: float
    overrun_steps: int
    steps: int
    windows: int
    events: int
    prediction_error_p50: float
    uptime_s: float
    dropped_events: int
    trainers: int
    event_delay_us_p50: float
    event_delay_us_p99: float
    rejected_events: int
    trainer_free_memory_bytes: int
    windows_granted: int
    memory: GpuMemory
    trainer_streams: _containers.RepeatedCompositeFieldContainer[TrainerStream]
    training_s: float
    def __init__(self, gpu: _Optional[int] = ..., bubbles: _Optional[int] = ..., bubble_s: _Optional[float] = ..., harvested_s: _Optional[float] = ..., overrun_s: _Optional[float] = ..., overrun_steps: _Optional[int] = ..., steps: _Optional[int] = ..., windows: _Optional[int] = ..., events: _Optional[int] = ..., prediction_error_p50: _Optional[float] = ..., uptime_s: _Optional[float] = ..., dropped_events: _Optional[int] = ..., trainers: _Optional[int] = ..., event_delay_us_p50: _Optional[float] = ..., event_delay_us_p99: _Optional[float] = ..., rejected_events: _Optional[int] = ..., trainer_free_memory_bytes: _Optional[int] = ..., windows_granted: _Optional[int] = ..., memory: _Optional[_Union[GpuMemory, _Mapping]] = ..., trainer_streams: _Optional[_Iterable[_Union[TrainerStream, _Mapping]]] = ..., training_s: _Optional[float] = ...) -> None: ...

class TrainerStream(_message.Message):
    __slots__ = ("peer", "rank", "stage", "path", "edges", "rejected", "dropped", "pid")
    PEER_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    EDGES_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    peer: str
    rank: int
    stage: int
    path: str
    edges: int
    rejected: int
    dropped: int
    pid: int
    def __init__(self, peer: _Optional[str] = ..., rank: _Optional[int] = ..., stage: _Optional[int] = ..., path: _Optional[str] = ..., edges: _Optional[int] = ..., rejected: _Optional[int] = ..., dropped: _Optional[int] = ..., pid: _Optional[int] = ...) -> None: ...

class GpuMemory(_message.Message):
    __slots__ = ("mode", "name", "uuid", "compute_mode", "mps", "total_bytes", "used_bytes", "free_bytes", "side_tasks_used_bytes", "side_tasks_reserved_bytes", "others_used_bytes", "trainer_peak_bytes", "usable_bytes", "headroom_bytes", "waiting_tasks")
    MODE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_MODE_FIELD_NUMBER: _ClassVar[int]
    MPS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    SIDE_TASKS_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    SIDE_TASKS_RESERVED_BYTES_FIELD_NUMBER: _ClassVar[int]
    OTHERS_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    TRAINER_PEAK_BYTES_FIELD_NUMBER: _ClassVar[int]
    USABLE_BYTES_FIELD_NUMBER: _ClassVar[int]
    HEADROOM_BYTES_FIELD_NUMBER: _ClassVar[int]
    WAITING_TASKS_FIELD_NUMBER: _ClassVar[int]
    mode: str
    name: str
    uuid: str
    compute_mode: str
    mps: str
    total_bytes: int
    used_bytes: int
    free_bytes: int
    side_tasks_used_bytes: int
    side_tasks_reserved_bytes: int
    others_used_bytes: int
    trainer_peak_bytes: int
    usable_bytes: int
    headroom_bytes: int
    waiting_tasks: int
    def __init__(self, mode: _Optional[str] = ..., name: _Optional[str] = ..., uuid: _Optional[str] = ..., compute_mode: _Optional[str] = ..., mps: _Optional[str] = ..., total_bytes: _Optional[int] = ..., used_bytes: _Optional[int] = ..., free_bytes: _Optional[int] = ..., side_tasks_used_bytes: _Optional[int] = ..., side_tasks_reserved_bytes: _Optional[int] = ..., others_used_bytes: _Optional[int] = ..., trainer_peak_bytes: _Optional[int] = ..., usable_bytes: _Optional[int] = ..., headroom_bytes: _Optional[int] = ..., waiting_tasks: _Optional[int] = ...) -> None: ...

class StatsResponse(_message.Message):
    __slots__ = ("gpu", "tasks")
    GPU_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    gpu: GpuStats
    tasks: _containers.RepeatedCompositeFieldContainer[TaskInfo]
    def __init__(self, gpu: _Optional[_Union[GpuStats, _Mapping]] = ..., tasks: _Optional[_Iterable[_Union[TaskInfo, _Mapping]]] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AgentEvent(_message.Message):
    __slots__ = ("time_ns", "task", "window", "trainer")
    TIME_NS_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    TRAINER_FIELD_NUMBER: _ClassVar[int]
    time_ns: int
    task: TaskInfo
    window: WindowRecord
    trainer: TrainerChange
    def __init__(self, time_ns: _Optional[int] = ..., task: _Optional[_Union[TaskInfo, _Mapping]] = ..., window: _Optional[_Union[WindowRecord, _Mapping]] = ..., trainer: _Optional[_Union[TrainerChange, _Mapping]] = ...) -> None: ...

class TrainerChange(_message.Message):
    __slots__ = ("connected", "peer", "trainers", "path")
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    TRAINERS_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    connected: bool
    peer: str
    trainers: int
    path: str
    def __init__(self, connected: bool = ..., peer: _Optional[str] = ..., trainers: _Optional[int] = ..., path: _Optional[str] = ...) -> None: ...

class WindowRecord(_message.Message):
    __slots__ = ("window_id", "rank", "slot", "iteration", "bubble_start_ns", "bubble_end_ns", "until_ns", "predicted_ns", "shares", "seen_ns")
    WINDOW_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    SLOT_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    BUBBLE_START_NS_FIELD_NUMBER: _ClassVar[int]
    BUBBLE_END_NS_FIELD_NUMBER: _ClassVar[int]
    UNTIL_NS_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_NS_FIELD_NUMBER: _ClassVar[int]
    SHARES_FIELD_NUMBER: _ClassVar[int]
    SEEN_NS_FIELD_NUMBER: _ClassVar[int]
    window_id: int
    rank: int
    slot: int
    iteration: int
    bubble_start_ns: int
    bubble_end_ns: int
    until_ns: int
    predicted_ns: int
    shares: _containers.RepeatedCompositeFieldContainer[WindowShare]
    seen_ns: int
    def __init__(self, window_id: _Optional[int] = ..., rank: _Optional[int] = ..., slot: _Optional[int] = ..., iteration: _Optional[int] = ..., bubble_start_ns: _Optional[int] = ..., bubble_end_ns: _Optional[int] = ..., until_ns: _Optional[int] = ..., predicted_ns: _Optional[int] = ..., shares: _Optional[_Iterable[_Union[WindowShare, _Mapping]]] = ..., seen_ns: _Optional[int] = ...) -> None: ...

class WindowShare(_message.Message):
    __slots__ = ("task_id", "first_step_ns", "idle_ns", "steps", "busy_ns", "overrun_ns", "step_spans", "granted_ns", "woke_ns")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_STEP_NS_FIELD_NUMBER: _ClassVar[int]
    IDLE_NS_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    BUSY_NS_FIELD_NUMBER: _ClassVar[int]
    OVERRUN_NS_FIELD_NUMBER: _ClassVar[int]
    STEP_SPANS_FIELD_NUMBER: _ClassVar[int]
    GRANTED_NS_FIELD_NUMBER: _ClassVar[int]
    WOKE_NS_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    first_step_ns: int
    idle_ns: int
    steps: int
    busy_ns: int
    overrun_ns: int
    step_spans: _containers.RepeatedCompositeFieldContainer[StepSpan]
    granted_ns: int
    woke_ns: int
    def __init__(self, task_id: _Optional[str] = ..., first_step_ns: _Optional[int] = ..., idle_ns: _Optional[int] = ..., steps: _Optional[int] = ..., busy_ns: _Optional[int] = ..., overrun_ns: _Optional[int] = ..., step_spans: _Optional[_Iterable[_Union[StepSpan, _Mapping]]] = ..., granted_ns: _Optional[int] = ..., woke_ns: _Optional[int] = ...) -> None: ...

class StepSpan(_message.Message):
    __slots__ = ("start_ns", "duration_ns")
    START_NS_FIELD_NUMBER: _ClassVar[int]
    DURATION_NS_FIELD_NUMBER: _ClassVar[int]
    start_ns: int
    duration_ns: int
    def __init__(self, start_ns: _Optional[int] = ..., duration_ns: _Optional[int] = ...) -> None: ...

class BubbleSpan(_message.Message):
    __slots__ = ("rank", "slot", "iteration", "start_ns", "end_ns", "predicted_ns", "kind")
    RANK_FIELD_NUMBER: _ClassVar[int]
    SLOT_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    START_NS_FIELD_NUMBER: _ClassVar[int]
    END_NS_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_NS_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    rank: int
    slot: int
    iteration: int
    start_ns: int
    end_ns: int
    predicted_ns: int
    kind: int
    def __init__(self, rank: _Optional[int] = ..., slot: _Optional[int] = ..., iteration: _Optional[int] = ..., start_ns: _Optional[int] = ..., end_ns: _Optional[int] = ..., predicted_ns: _Optional[int] = ..., kind: _Optional[int] = ...) -> None: ...

class TrainerDeclaration(_message.Message):
    __slots__ = ("rank", "stage", "schedule", "stages", "microbatches", "stages_per_rank")
    RANK_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    STAGES_FIELD_NUMBER: _ClassVar[int]
    MICROBATCHES_FIELD_NUMBER: _ClassVar[int]
    STAGES_PER_RANK_FIELD_NUMBER: _ClassVar[int]
    rank: int
    stage: int
    schedule: str
    stages: int
    microbatches: int
    stages_per_rank: int
    def __init__(self, rank: _Optional[int] = ..., stage: _Optional[int] = ..., schedule: _Optional[str] = ..., stages: _Optional[int] = ..., microbatches: _Optional[int] = ..., stages_per_rank: _Optional[int] = ...) -> None: ...

class TimelineRequest(_message.Message):
    __slots__ = ("since_ns",)
    SINCE_NS_FIELD_NUMBER: _ClassVar[int]
    since_ns: int
    def __init__(self, since_ns: _Optional[int] = ...) -> None: ...

class TimelineResponse(_message.Message):
    __slots__ = ("gpu", "now_ns", "bubbles", "windows", "tasks", "trainers")
    GPU_FIELD_NUMBER: _ClassVar[int]
    NOW_NS_FIELD_NUMBER: _ClassVar[int]
    BUBBLES_FIELD_NUMBER: _ClassVar[int]
    WINDOWS_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    TRAINERS_FIELD_NUMBER: _ClassVar[int]
    gpu: int
    now_ns: int
    bubbles: _containers.RepeatedCompositeFieldContainer[BubbleSpan]
    windows: _containers.RepeatedCompositeFieldContainer[WindowRecord]
    tasks: _containers.RepeatedCompositeFieldContainer[TaskInfo]
    trainers: _containers.RepeatedCompositeFieldContainer[TrainerDeclaration]
    def __init__(self, gpu: _Optional[int] = ..., now_ns: _Optional[int] = ..., bubbles: _Optional[_Iterable[_Union[BubbleSpan, _Mapping]]] = ..., windows: _Optional[_Iterable[_Union[WindowRecord, _Mapping]]] = ..., tasks: _Optional[_Iterable[_Union[TaskInfo, _Mapping]]] = ..., trainers: _Optional[_Iterable[_Union[TrainerDeclaration, _Mapping]]] = ...) -> None: ...

class LogsRequest(_message.Message):
    __slots__ = ("id", "follow", "tail_lines")
    ID_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_FIELD_NUMBER: _ClassVar[int]
    TAIL_LINES_FIELD_NUMBER: _ClassVar[int]
    id: str
    follow: bool
    tail_lines: int
    def __init__(self, id: _Optional[str] = ..., follow: bool = ..., tail_lines: _Optional[int] = ...) -> None: ...

class LogChunk(_message.Message):
    __slots__ = ("data", "path")
    DATA_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    path: str
    def __init__(self, data: _Optional[bytes] = ..., path: _Optional[str] = ...) -> None: ...

class DeleteResponse(_message.Message):
    __slots__ = ("task", "files_removed", "bytes_freed")
    TASK_FIELD_NUMBER: _ClassVar[int]
    FILES_REMOVED_FIELD_NUMBER: _ClassVar[int]
    BYTES_FREED_FIELD_NUMBER: _ClassVar[int]
    task: TaskInfo
    files_removed: int
    bytes_freed: int
    def __init__(self, task: _Optional[_Union[TaskInfo, _Mapping]] = ..., files_removed: _Optional[int] = ..., bytes_freed: _Optional[int] = ...) -> None: ...

class PruneRequest(_message.Message):
    __slots__ = ("older_than_s", "states", "dry_run")
    OLDER_THAN_S_FIELD_NUMBER: _ClassVar[int]
    STATES_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    older_than_s: float
    states: _containers.RepeatedScalarFieldContainer[TaskState]
    dry_run: bool
    def __init__(self, older_than_s: _Optional[float] = ..., states: _Optional[_Iterable[_Union[TaskState, str]]] = ..., dry_run: bool = ...) -> None: ...

class PruneResponse(_message.Message):
    __slots__ = ("tasks", "files_removed", "bytes_freed", "dry_run")
    TASKS_FIELD_NUMBER: _ClassVar[int]
    FILES_REMOVED_FIELD_NUMBER: _ClassVar[int]
    BYTES_FREED_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[TaskInfo]
    files_removed: int
    bytes_freed: int
    dry_run: bool
    def __init__(self, tasks: _Optional[_Iterable[_Union[TaskInfo, _Mapping]]] = ..., files_removed: _Optional[int] = ..., bytes_freed: _Optional[int] = ..., dry_run: bool = ...) -> None: ...
