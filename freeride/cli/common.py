"""What every CLI command shares: the usage error, checked number flags, JSON and table output, file references.

Heavy modules (rich) are imported only by the commands that print a table: `health`, `ls --json` and
the like answer without paying for them (docs/operations.md, *The CLI's output*).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from freeride.core.text import printable
from freeride.errors import FreerideError

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

PIPED_WIDTH = 1000  # rich cuts tables to 80 columns when stdout is no terminal; a pipe gets whole rows
_Field = Any  # a FieldDescriptor: protobuf's pure-Python class or upb's, which the stubs tell apart
_INT64 = frozenset({FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_SINT64,
                    FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED64})


class UsageError(FreerideError):
    """Bad command-line input."""


# -- number flags ---------------------------------------------------------------------------------
def whole(lo: int | None = None, hi: int | None = None, hint: str = "") -> Callable[[str], int]:
    """An argparse `type` for a whole number in lo..hi; argparse prints 'argument --x: <our message>'."""
    def parse(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            value = None
        if value is None or (lo is not None and value < lo) or (hi is not None and value > hi):
            raise argparse.ArgumentTypeError(f"give a whole number{_range(lo, hi)}, not {text!r}{hint}")
        return value

    return parse


def seconds(lo: float = 0.0, hi: float | None = None, above: bool = False) -> Callable[[str], float]:
    """An argparse `type` for a finite number of seconds >= lo (> lo when `above`), <= hi when given."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        low_ok = value > lo if above else value >= lo
        if not math.isfinite(value) or not low_ok or (hi is not None and value > hi):
            bound = f"> {lo:g}" if above else f">= {lo:g}"
            top = f" and <= {hi:g}" if hi is not None else ""
            raise argparse.ArgumentTypeError(f"give a number of seconds {bound}{top}, not {text!r}")
        return value

    return parse


def number(text: str) -> float:
    """An argparse `type` for any finite number (ranges are checked by whoever uses it, e.g. AgentConfig)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"give a number, not {text!r}")
    return value


def _range(lo: int | None, hi: int | None) -> str:
    if lo is not None and hi is not None:
        return f" between {lo} and {hi}"
    if lo is not None:
        return f" >= {lo}"
    return f" <= {hi}" if hi is not None else ""


# -- JSON -----------------------------------------------------------------------------------------
def message_dict(msg: Message) -> dict[str, Any]:
    """A message as `--json` prints it: proto field names, every field present (an unset optional one as
    null), 64-bit integers as numbers (proto's JSON mapping makes them strings), enums by name."""
    out: dict[str, Any] = {}
    for f in msg.DESCRIPTOR.fields:
        oneof = _real_oneof(f)
        if oneof is not None and msg.WhichOneof(oneof) != f.name:
            continue  # only the member of a oneof that is set
        value = getattr(msg, f.name)
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            vf = f.message_type.fields_by_name["value"]
            out[f.name] = {k: _value(vf, v) for k, v in value.items()}
        elif _repeated(f):
            out[f.name] = [_value(f, v) for v in value]
        elif f.has_presence and f.message_type is None and not msg.HasField(f.name):
            out[f.name] = None
        else:
            out[f.name] = _value(f, value)
    return out


def _real_oneof(f: _Field) -> str | None:
    """The declared oneof `f` belongs to (a proto3 `optional` field sits in a synthetic one named after it)."""
    o = f.containing_oneof
    if o is None or (len(o.fields) == 1 and o.name == f"_{f.name}"):
        return None
    return str(o.name)


def _value(f: _Field, value: Any) -> Any:
    if f.message_type is not None:
        return message_dict(value)
    if f.enum_type is not None:
        named = f.enum_type.values_by_number.get(value)
        return named.name if named is not None else value
    if f.type in _INT64:
        return int(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None  # JSON has no NaN or infinity
    if isinstance(value, bytes):
        return value.hex()
    return value


def _finite(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj


def print_json(obj: Message | dict[str, Any] | list[Any]) -> None:
    """Strict JSON on stdout: numbers as numbers, NaN and infinities as null."""
    data = message_dict(obj) if isinstance(obj, Message) else _finite(obj)
    print(json.dumps(data, indent=2, sort_keys=True, allow_nan=False))


# -- tables ---------------------------------------------------------------------------------------
def console() -> Console:
    """Rich's console for tables. Piped, rows are whole (rich would cut them to 80 columns); an explicit
    COLUMNS wins. Task names and reasons are never read as rich markup."""
    from rich.console import Console

    class _Console(Console):
        def on_broken_pipe(self) -> None:
            raise BrokenPipeError  # rich would exit 1; the CLI ends every command the same way (freeride.cli.app)

    piped = not sys.stdout.isatty() and not os.environ.get("COLUMNS")
    return _Console(width=PIPED_WIDTH if piped else None, markup=False, highlight=False)


def table(title: str | None, *columns: str, **options: Any) -> Table:
    """A rich table with these columns (rich imported here, on first use); every text cell goes through
    `printable`."""
    from rich.table import Table

    class _Table(Table):
        def add_row(self, *cells: Any, **kwargs: Any) -> None:
            super().add_row(*(printable(c) if isinstance(c, str) else c for c in cells), **kwargs)

    out = _Table(title=printable(title) if title else title, **options)
    for col in columns:
        out.add_column(col)
    return out


def progress_text(progress: Mapping[str, float], limit: int | None = None) -> str:
    """A task's latest progress map (what its progress() returned), compact: 'accuracy=0.91 loss=0.32'."""
    return " ".join(f"{k}={v:.4g}" for k, v in sorted(progress.items())[:limit]) or "-"


def absolute_ref(ref: str) -> str:
    """Make a file reference absolute: the agent resolves paths from its own directory."""
    path, sep, cls = ref.rpartition(":")
    if sep and path.endswith(".py"):
        return f"{Path(path).absolute()}:{cls}"
    return ref


def _repeated(f: Any) -> bool:
    """protobuf >= 6.31 says `is_repeated` (7 has no `label`); 5.x only has the label."""
    is_repeated = getattr(f, "is_repeated", None)
    return bool(is_repeated) if is_repeated is not None else f.label == f.LABEL_REPEATED
