"""A profile's input: the bubbles agents kept and what each rank declared, as one file that travels.

`freeride profile --record FILE` writes it; `--from FILE` reads it anywhere (no agent, no GPU). The
file is JSON: {"format": "freeride-profile", "version": 1, "bubbles": [...], "trainers": [...]}, one
object per bubble and per rank, times in CLOCK_MONOTONIC nanoseconds of the host that measured them.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from freeride.core.units import format_size
from freeride.v1 import tasks_pb2

FORMAT, VERSION = "freeride-profile", 1
# A node's agents keep a few thousand bubbles and at most 50,000 steps each (freeride.agent.control.history):
# a few MiB per GPU. The cap is far above any real recording and below what would exhaust memory.
MAX_BYTES = 64 << 20


@dataclass(frozen=True)
class RecordedBubble:
    gpu: int
    rank: int
    slot: int
    iteration: int
    start_ns: int
    end_ns: int
    kind: int  # freeride.v1.BubbleKind (0: not said)


@dataclass(frozen=True)
class Declaration:
    gpu: int
    rank: int
    stage: int
    schedule: str  # "": not declared
    stages: int  # p (0: not declared)
    microbatches: int  # m (0: not declared)
    stages_per_rank: int = 1  # v


@dataclass
class Recording:
    bubbles: list[RecordedBubble] = field(default_factory=list)
    trainers: list[Declaration] = field(default_factory=list)
    task_steps: dict[str, list[int]] = field(default_factory=dict)  # task id -> its recent step durations (ns)

    def add_timeline(self, resp: tasks_pb2.TimelineResponse) -> None:
        """One agent's Timeline answer (the protobuf stays here: the analysis sees domain objects)."""
        self.bubbles.extend(RecordedBubble(resp.gpu, b.rank, b.slot, b.iteration, b.start_ns, b.end_ns, b.kind)
                            for b in resp.bubbles)
        self.trainers.extend(Declaration(resp.gpu, t.rank, t.stage, t.schedule, t.stages, t.microbatches,
                                         t.stages_per_rank or 1) for t in resp.trainers)
        for w in resp.windows:
            for share in w.shares:
                self.task_steps.setdefault(share.task_id, []).extend(s.duration_ns for s in share.step_spans)


def save(path: Path, rec: Recording) -> None:
    doc = {"format": FORMAT, "version": VERSION, "bubbles": [asdict(b) for b in rec.bubbles],
           "trainers": [asdict(t) for t in rec.trainers], "task_steps": rec.task_steps}
    path.write_text(json.dumps(doc))


def load(path: Path, max_bytes: int = MAX_BYTES) -> Recording:
    """Raises ValueError with what is wrong (the CLI says it in one line)."""
    doc = _read_json(path, max_bytes)
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError(f"{path} is not a freeride profile recording; pass a file written by "
                         "`freeride profile --record`")
    if doc.get("version") != VERSION:
        raise ValueError(f"{path} is a version {doc.get('version')} recording; this freeride reads version {VERSION}")
    try:
        rec = Recording([RecordedBubble(**b) for b in doc["bubbles"]], [Declaration(**t) for t in doc["trainers"]],
                        {str(k): list(v) for k, v in doc.get("task_steps", {}).items()})
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"{path}: a malformed recording ({exc})") from None
    problem = _problem(rec)
    if problem:
        raise ValueError(f"{path}: {problem}; pass a file written by `freeride profile --record`")
    return rec


def _read_json(path: Path, max_bytes: int) -> object:
    # Read one byte past the cap rather than the whole file: `--from /dev/zero` (or a log passed by mistake)
    # must end in an error, not in the memory running out.
    try:
        with path.open("rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror}") from None
    if len(data) > max_bytes:
        raise ValueError(f"{path} is larger than {format_size(max_bytes)}, more than any recording of a node; "
                         "pass a file written by `freeride profile --record`")
    try:
        return json.loads(data)
    except RecursionError:  # json's C decoder recurses per nesting level: not a ValueError
        raise ValueError(f"{path} is JSON nested too deeply for a recording; pass a file written by "
                         "`freeride profile --record`") from None
    except ValueError as exc:
        raise ValueError(f"{path} is not JSON ({exc}); pass a file written by `freeride profile --record`") from None


def _problem(rec: Recording) -> str:
    """What makes the recording impossible ("": nothing): the analysis trusts whole numbers and forward time."""
    for b in rec.bubbles:
        bad = [k for k, v in asdict(b).items() if not _whole(v)]
        if bad:
            return f"a bubble's {bad[0]} is {getattr(b, bad[0])!r}, not a whole number"
        if b.end_ns < b.start_ns:
            return f"a bubble of rank {b.rank} ends before it starts ({b.start_ns} .. {b.end_ns} ns)"
    for t in rec.trainers:
        bad = [k for k, v in asdict(t).items() if k != "schedule" and not _whole(v)]
        if bad or not isinstance(t.schedule, str):
            return f"rank {t.rank!r}'s declaration has a bad {(bad or ['schedule'])[0]}"
    for task_id, durations in rec.task_steps.items():
        if not all(_whole(d) for d in durations):
            return f"task {task_id}'s step durations are not all whole numbers of ns"
        if any(d < 0 for d in durations):
            return f"task {task_id} has a negative step duration"
    return ""


def _whole(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)
