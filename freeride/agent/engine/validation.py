"""Bounds on a submitted task spec: values outside them are mistakes or attacks, never workloads.

Checked once, at submit, before the reference check; a bad spec is refused with InvalidSpecError
(INVALID_ARGUMENT at the gRPC edge) and a message that says what to change.
"""

from __future__ import annotations

import re

from freeride.agent.domain.model import TaskSpec
from freeride.errors import InvalidSpecError

MAX_NAME_CHARS = 128
MAX_REF_CHARS = 4096
MAX_ARGS = 256
MAX_ARG_KEY_CHARS = 128
MAX_ARG_VALUE_CHARS = 64 * 1024
MAX_MEM_BYTES = 1 << 50  # 1 PiB: anything above is a typo, not a GPU
MIN_MEM_BYTES = 64 << 20  # a bare worker (Python, gRPC, freeride) holds about 40 MiB: a smaller cap fails at once
_ARG_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def check_spec(spec: TaskSpec, device_total_bytes: int | None) -> None:
    """Raise InvalidSpecError for the first bound the spec breaks; `device_total_bytes` bounds the cap when known."""
    if not spec.ref.strip():
        raise InvalidSpecError("the task reference is empty: give 'package.module:Class' or 'file.py:Class'")
    if len(spec.name) > MAX_NAME_CHARS:
        raise InvalidSpecError(f"task name is longer than {MAX_NAME_CHARS} characters")
    if not 0 <= spec.priority <= 100:
        raise InvalidSpecError(f"priority must be between 0 and 100, got {spec.priority}")
    if not 0 <= spec.mem_limit_bytes <= MAX_MEM_BYTES:
        raise InvalidSpecError(f"memory limit must be between 0 and 1 PiB, got {spec.mem_limit_bytes} bytes")
    if 0 < spec.mem_limit_bytes < MIN_MEM_BYTES:
        raise InvalidSpecError(
            f"memory cap of {spec.mem_limit_bytes} bytes is below {MIN_MEM_BYTES >> 20} MiB, less than a bare worker "
            f"(Python, gRPC and freeride) holds; give --mem {MIN_MEM_BYTES >> 20}MiB or more, or leave it out")
    if not -1 <= spec.max_restarts <= 1000:
        raise InvalidSpecError(f"max_restarts must be between -1 (agent default) and 1000, got {spec.max_restarts}")
    if not 0 <= spec.checkpoint_interval_s <= 86400 * 7:
        raise InvalidSpecError(f"checkpoint interval must be between 0 and 7 days, got {spec.checkpoint_interval_s}")
    for key in spec.args:
        if not _ARG_KEY.match(key):
            raise InvalidSpecError(f"argument name {key!r} is not a Python identifier")
    if len(spec.ref) > MAX_REF_CHARS:
        raise InvalidSpecError(f"the task reference is longer than {MAX_REF_CHARS} characters")
    if len(spec.args) > MAX_ARGS:
        raise InvalidSpecError(f"{len(spec.args)} task arguments; at most {MAX_ARGS} are accepted")
    for key, value in spec.args.items():
        if len(key) > MAX_ARG_KEY_CHARS:
            raise InvalidSpecError(f"argument name {key[:32]!r}... is longer than {MAX_ARG_KEY_CHARS} characters")
        if len(value) > MAX_ARG_VALUE_CHARS:
            raise InvalidSpecError(
                f"argument {key!r} is {len(value)} characters long; at most {MAX_ARG_VALUE_CHARS} "
                "(pass a file path for bulk data)"
            )
    if device_total_bytes and spec.mem_limit_bytes > device_total_bytes:
        raise InvalidSpecError(
            f"memory cap {spec.mem_limit_bytes / 2**30:.1f} GiB is more than the device has "
            f"({device_total_bytes / 2**30:.1f} GiB); lower --mem"
        )
