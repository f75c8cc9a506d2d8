"""An import-linter contract of our own: no module imports another package's private names.

A name (module or attribute) whose last dotted part starts with one underscore belongs to the package
that holds it: `freeride.trainer._waits` may be imported by `freeride.trainer.deepspeed`, not by
`freeride.tooling.demo_report`; `from freeride.cli.commands import _client` from outside
`freeride.cli` breaks it too. Declared in pyproject.toml ([tool.importlinter]) and run by
`./dev.sh test` with the layer contracts.
"""

from __future__ import annotations

import re
from typing import Any

import grimp
from importlinter import Contract, ContractCheck, fields, output

_FROM_IMPORT = re.compile(r"^\s*from\s+([\w.]+)\s+import\s+\(?([^)#]*)")


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


class PrivateImportsContract(Contract):
    """Modules of `containers` import no private module or name from outside their own package."""

    type_name = "private_imports"
    containers = fields.ListField(subfield=fields.StringField())

    def check(self, graph: grimp.ImportGraph, verbose: bool) -> ContractCheck:
        containers: list[str] = list(self.containers)  # type: ignore[call-overload]
        broken: list[dict[str, Any]] = []
        for importer in sorted(graph.modules):
            if not any(_inside(importer, c) for c in containers):
                continue
            for imported in sorted(graph.find_modules_directly_imported_by(importer)):
                for detail in graph.get_import_details(importer=importer, imported=imported):
                    names = [(imported.split("."), False)]
                    match = _FROM_IMPORT.match(detail["line_contents"])
                    if match:  # `from package.module import a, _b`: the names after import count too
                        for name in (n.split()[0] for n in match.group(2).split(",") if n.strip()):
                            dotted = f"{match.group(1)}.{name}"
                            names.append((dotted.split("."), dotted not in graph.modules))
                    for parts, attribute in names:
                        owner = _owner(parts, attribute)
                        if owner is not None and not _inside(importer, owner):
                            broken.append({"importer": importer, "line": detail["line_number"],
                                           "text": detail["line_contents"].strip(), "owner": owner})
                            break
        return ContractCheck(kept=not broken, metadata={"broken": broken})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for b in check.metadata["broken"]:
            output.print_error(f"{b['importer']}:{b['line']}: `{b['text']}` reaches a private name of {b['owner']}; "
                               "import a public name instead, or make this one public", bold=False)
            output.new_line()
