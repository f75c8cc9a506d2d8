"""Resolve a task reference ("pkg.mod:Class" or "path/file.py:Class") and bind its arguments."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from freeride.errors import TaskRefError
from freeride.sdk.task import ImperativeTask, IterativeTask

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def load_class(ref: str) -> type[IterativeTask] | type[ImperativeTask]:
    """Import the class a reference names; raise TaskRefError saying what is wrong."""
    module_part, sep, class_name = ref.rpartition(":")
    if not sep or not module_part or not class_name:
        raise TaskRefError(f"task reference {ref!r} must look like 'package.module:Class' or 'file.py:Class'")
    if module_part.endswith(".py"):
        path = Path(module_part)
        if not path.is_file():
            raise TaskRefError(f"task file {module_part!r} does not exist")
        name = f"_freeride_task_{abs(hash(str(path.resolve())))}"
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise TaskRefError(f"cannot load {module_part!r} as a Python file")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        folder = str(path.resolve().parent)  # as for `python file.py`: the file's own helpers import
        if folder not in sys.path:
            sys.path.insert(0, folder)
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            raise TaskRefError(f"importing {module_part!r} failed: {type(exc).__name__}: {exc}") from exc
    else:
        if not all(part.isidentifier() for part in module_part.split(".")):
            raise TaskRefError(
                f"task reference {ref!r}: {module_part!r} is neither a module name (package.module) nor a .py "
                "file; a reference looks like 'package.module:Class' or 'path/to/file.py:Class'")
        try:
            module = importlib.import_module(module_part)
        except ModuleNotFoundError as exc:
            if exc.name is not None and module_part != exc.name and not module_part.startswith(exc.name + "."):
                raise TaskRefError(
                    f"importing {module_part!r} failed: it needs {exc.name!r}, which is not installed"
                ) from exc
            raise TaskRefError(f"no module named {module_part!r} (is it installed or on PYTHONPATH?)") from exc
        except Exception as exc:
            raise TaskRefError(f"importing {module_part!r} failed: {type(exc).__name__}: {exc}") from exc
    cls = getattr(module, class_name, None)
    if cls is None:
        raise TaskRefError(f"module {module_part!r} has no attribute {class_name!r}")
    if not (inspect.isclass(cls) and issubclass(cls, IterativeTask | ImperativeTask)):
        raise TaskRefError(
            f"{ref!r} is not a task: subclass freeride.IterativeTask or freeride.ImperativeTask"
        )
    if cls in (IterativeTask, ImperativeTask):
        raise TaskRefError(f"{ref!r} is a base class; name your own subclass")
    return cls


def kind_of(cls: type) -> str:
    return "imperative" if issubclass(cls, ImperativeTask) else "iterative"


def bind_args(cls: type, args: Mapping[str, str]) -> dict[str, Any]:
    """Convert key=value strings to the types the class's __init__ declares."""
    init = vars(cls).get("__init__") or next((vars(k)["__init__"] for k in cls.__mro__ if "__init__" in vars(k)), None)
    if init is None or init is object.__init__:
        if args:
            raise TaskRefError(f"{cls.__name__} takes no arguments, got: {', '.join(sorted(args))}")
        return {}
    sig = inspect.signature(init)
    params = [p for p in list(sig.parameters.values())[1:] if p.kind not in (p.VAR_POSITIONAL,)]
    takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in params)
    named = {p.name: p for p in params if p.kind is not p.VAR_KEYWORD}
    bound: dict[str, Any] = {}
    for key, raw in args.items():
        param = named.get(key)
        if param is None:
            if takes_kwargs:
                bound[key] = raw
                continue
            accepted = ", ".join(named) or "none"
            raise TaskRefError(f"{cls.__name__} has no argument {key!r} (it takes: {accepted})")
        bound[key] = _coerce(cls.__name__, key, raw, param.annotation)
    missing = [n for n, p in named.items() if p.default is p.empty and n not in bound]
    if missing:
        raise TaskRefError(f"{cls.__name__} needs argument(s): {', '.join(missing)} (pass key=value)")
    return bound


def _coerce(owner: str, key: str, raw: str, annotation: Any) -> Any:
    kind = annotation if isinstance(annotation, type) else {"int": int, "float": float, "bool": bool}.get(
        str(annotation), str
    )
    try:
        if kind is bool:
            low = raw.lower()
            if low in _TRUE:
                return True
            if low in _FALSE:
                return False
            raise ValueError(raw)
        if kind in (int, float):
            return kind(raw)
    except ValueError:
        raise TaskRefError(f"{owner} argument {key}={raw!r} is not a valid {kind.__name__}") from None
    return raw
