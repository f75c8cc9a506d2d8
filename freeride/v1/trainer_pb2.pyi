from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class BubbleEdge(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BUBBLE_EDGE_UNSPECIFIED: _ClassVar[BubbleEdge]
    BUBBLE_EDGE_START: _ClassVar[BubbleEdge]
    BUBBLE_EDGE_END: _ClassVar[BubbleEdge]

class BubbleKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BUBBLE_KIND_UNSPECIFIED: _ClassVar[BubbleKind]
    BUBBLE_KIND_FILL: _ClassVar[BubbleKind]
    BUBBLE_KIND_WARMUP: _ClassVar[BubbleKind]
    BUBBLE_KIND_DRAIN: _ClassVar[BubbleKind]
    BUBBLE_KIND_COOLDOWN: _ClassVar[BubbleKind]
    BUBBLE_KIND_BETWEEN_STEPS: _ClassVar[BubbleKind]
BUBBLE_EDGE_UNSPECIFIED: BubbleEdge
BUBBLE_EDGE_START: BubbleEdge
BUBBLE_EDGE_END: BubbleEdge
BUBBLE_KIND_UNSPECIFIED: BubbleKind
BUBBLE_KIND_FILL: BubbleKind
BUBBLE_KIND_WARMUP: BubbleKind
BUBBLE_KIND_DRAIN: BubbleKind
BUBBLE_KIND_COOLDOWN: BubbleKind
BUBBLE_KIND_BETWEEN_STEPS: BubbleKind

class BubbleEvent(_message.Message):
    __slots__ = ("edge", "slot", "iteration", "stage", "rank", "time_ns", "expected_duration_ns", "free_memory_bytes", "kind")
    EDGE_FIELD_NUMBER: _ClassVar[int]
    SLOT_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    TIME_NS_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_DURATION_NS_FIELD_NUMBER: _ClassVar[int]
    FREE_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    edge: BubbleEdge
    slot: int
    iteration: int
    stage: int
    rank: int
    time_ns: int
    expected_duration_ns: int
    free_memory_bytes: int
    kind: BubbleKind
    def __init__(self, edge: _Optional[_Union[BubbleEdge, str]] = ..., slot: _Optional[int] = ..., iteration: _Optional[int] = ..., stage: _Optional[int] = ..., rank: _Optional[int] = ..., time_ns: _Optional[int] = ..., expected_duration_ns: _Optional[int] = ..., free_memory_bytes: _Optional[int] = ..., kind: _Optional[_Union[BubbleKind, str]] = ...) -> None: ...

class TrainerHello(_message.Message):
    __slots__ = ("rank", "stage", "shared_memory", "ring_records", "schedule", "stages", "microbatches", "stages_per_rank", "pid")
    RANK_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    SHARED_MEMORY_FIELD_NUMBER: _ClassVar[int]
    RING_RECORDS_FIELD_NUMBER: _ClassVar[int]
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    STAGES_FIELD_NUMBER: _ClassVar[int]
    MICROBATCHES_FIELD_NUMBER: _ClassVar[int]
    STAGES_PER_RANK_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    rank: int
    stage: int
    shared_memory: bool
    ring_records: int
    schedule: str
    stages: int
    microbatches: int
    stages_per_rank: int
    pid: int
    def __init__(self, rank: _Optional[int] = ..., stage: _Optional[int] = ..., shared_memory: bool = ..., ring_records: _Optional[int] = ..., schedule: _Optional[str] = ..., stages: _Optional[int] = ..., microbatches: _Optional[int] = ..., stages_per_rank: _Optional[int] = ..., pid: _Optional[int] = ...) -> None: ...

class BubbleBatch(_message.Message):
    __slots__ = ("events", "hello")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    HELLO_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[BubbleEvent]
    hello: TrainerHello
    def __init__(self, events: _Optional[_Iterable[_Union[BubbleEvent, _Mapping]]] = ..., hello: _Optional[_Union[TrainerHello, _Mapping]] = ...) -> None: ...

class TrainerWelcome(_message.Message):
    __slots__ = ("gpu", "agent_version", "ring_socket", "ring_key", "hello_answered")
    GPU_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    RING_SOCKET_FIELD_NUMBER: _ClassVar[int]
    RING_KEY_FIELD_NUMBER: _ClassVar[int]
    HELLO_ANSWERED_FIELD_NUMBER: _ClassVar[int]
    gpu: int
    agent_version: str
    ring_socket: str
    ring_key: bytes
    hello_answered: bool
    def __init__(self, gpu: _Optional[int] = ..., agent_version: _Optional[str] = ..., ring_socket: _Optional[str] = ..., ring_key: _Optional[bytes] = ..., hello_answered: bool = ...) -> None: ...
