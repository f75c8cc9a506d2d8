"""What every CLI command shares: the usage error, JSON output, and file references made absolute."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message

from freeride.errors import FreerideError


class UsageError(FreerideError):
    """Bad command-line input."""


def message_dict(msg: Message) -> dict[str, Any]:
    """A message as `--json` prints it: proto field names, every field present."""
    return MessageToDict(msg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)


def print_json(obj: Message | dict[str, Any] | list[Any]) -> None:
    print(json.dumps(message_dict(obj) if isinstance(obj, Message) else obj, indent=2, sort_keys=True))


def absolute_ref(ref: str) -> str:
    """Make a file reference absolute: the agent resolves paths from its own directory."""
    path, sep, cls = ref.rpartition(":")
    if sep and path.endswith(".py"):
        return f"{Path(path).absolute()}:{cls}"
    return ref
