"""An import-linter contract of our own: no module imports another package's private names.

A name (module or attribute) whose last dotted part starts with one underscore belongs to the package
that holds it: `freeride.trainer._waits` may be imported by `freeride.trainer.deepspeed`, not by
`freeride.tooling.demo.report`; `from freeride.cli.tasks import _helper` from outside
`freeride.cli` breaks it too. Declared in pyproject.toml ([tool.importlinter]) and run by
`./dev.sh test` with the layer contracts.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path
from typing import Any

import grimp
from importlinter import Contract, ContractCheck, fields, output


def _private(part: str) -> bool:
    return part.startswith("_") and not part.startswith("__")


def _owner(parts: list[str], attribute: bool) -> str | None:
    """The package that owns the first private part of a dotted name (None: nothing private).

    A private module belongs to the package it sits in; a private attribute (`_name` in a module)
    to the package of its module, so that modules of one package may share it."""
    for i, part in enumerate(parts):
        if _private(part):
            last = i == len(parts) - 1
            return ".".join(parts[: i - 1] if attribute and last else parts[:i])
    return None


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _root_dir(package: str) -> Path | None:
    spec = importlib.util.find_spec(package)  # a top-level package: imports nothing of it
    locations = spec.submodule_search_locations if spec is not None else None
    return Path(next(iter(locations))) if locations else None


def _source_file(module: str) -> Path | None:
    """The module's source, found from its top package's folder: importing the module (or its
    parents, as importlib's find_spec does) would load torch and the rest for no purpose."""
    top, *rest = module.split(".")
    root = _root_dir(top)
    if root is None:
        return None
    for path in (root.joinpath(*rest, "__init__.py"), root.joinpath(*rest).with_suffix(".py") if rest else None):
        if path is not None and path.is_file():
            return path
    return None


def _imported_names(module: str, modules: set[str]) -> list[tuple[int, str, list[str], bool]]:
    """Every name the module's source imports, from any import statement (one line or several):
    (line, statement, dotted parts, whether the last part is an attribute rather than a module)."""
    path = _source_file(module)
    if path is None:
        return []
    source = path.read_text()
    lines = source.splitlines()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Import | ast.ImportFrom):
            continue
        text = lines[node.lineno - 1].strip()  # the statement's first line
        if isinstance(node, ast.Import):
            out += [(node.lineno, text, a.name.split("."), False) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the importer's package up
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, *([base] if base else [])])
            out.append((node.lineno, text, base.split("."), False))
            for a in node.names:
                dotted = f"{base}.{a.name}"
                out.append((node.lineno, text, dotted.split("."), dotted not in modules))
    return out


class PrivateImportsContract(Contract):
    """Modules of `containers` import no private module or name from outside their own package."""

    type_name = "private_imports"
    containers = fields.ListField(subfield=fields.StringField())

    def check(self, graph: grimp.ImportGraph, verbose: bool) -> ContractCheck:
        containers: list[str] = list(self.containers)  # type: ignore[call-overload]
        modules = set(graph.modules)
        ours = {m.split(".")[0] for m in modules}  # other libraries' privates are their business
        broken: list[dict[str, Any]] = []
        for importer in sorted(modules):
            if not any(_inside(importer, c) for c in containers):
                continue
            seen: set[int] = set()
            for line, text, parts, attribute in _imported_names(importer, modules):
                owner = _owner(parts, attribute)
                if parts[0] in ours and owner is not None and not _inside(importer, owner) and line not in seen:
                    seen.add(line)  # one report per statement
                    broken.append({"importer": importer, "line": line, "text": text, "owner": owner})
        return ContractCheck(kept=not broken, metadata={"broken": broken})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for b in check.metadata["broken"]:
            output.print_error(f"{b['importer']}:{b['line']}: `{b['text']}` reaches a private name of {b['owner']}; "
                               "import a public name instead, or make this one public", bold=False)
            output.new_line()
