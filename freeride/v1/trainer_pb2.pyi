from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

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

class BubbleBatch(_message.Message):
    __slots__ = ("events",)
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[BubbleEvent]
    def __init__(self, events: _Optional[_Iterable[_Union[BubbleEvent, _Mapping]]] = ...) -> None: ...

class TrainerWelcome(_message.Message):
    __slots__ = ("gpu", "agent_version")
    GPU_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    gpu: int
    agent_version: str
    def __init__(self, gpu: _Optional[int] = ..., agent_version: _Optional[str] = ...) -> None: ...
