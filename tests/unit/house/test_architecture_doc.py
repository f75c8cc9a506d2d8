"""docs/architecture.md's layout table names every module of the product, so the map cannot go stale."""

from __future__ import annotations

import re

from support.paths import REPO

ROOT = REPO


def test_every_module_has_its_line_in_the_architecture_doc():
    doc = (ROOT / "docs" / "architecture.md").read_text()
    named = set(re.findall(r"`([\w/]+(?:\.py|/))`", doc))
    # A row may name several files of one folder: `agent/memory.py`, `agent/admission.py` or `deepspeed.py`.
    folders = {n for n in named if n.endswith("/")}
    missing = []
    for path in sorted((ROOT / "freeride").rglob("*.py")):
        rel = path.relative_to(ROOT / "freeride").as_posix()
        if rel.startswith("v1/") or (path.name == "__init__.py" and rel != "__init__.py"):
            continue
        if any(rel.startswith(f) for f in folders) or {rel, f"freeride/{rel}", path.name} & named:
            continue
        missing.append(rel)
    assert not missing, f"docs/architecture.md has no line for: {', '.join(missing)}"
