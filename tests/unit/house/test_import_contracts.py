"""The private-names import contract (tools/import_contracts.py) that ./dev.sh test runs with import-linter."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import grimp
import pytest
from importlinter import ContractCheck
from support.paths import REPO

sys.path.insert(0, str(REPO))  # the repository root: tools/ lives there
from tools.import_contracts import PrivateImportsContract

FILES = {
    "pkg/__init__.py": "",
    "pkg/low/__init__.py": "",
    "pkg/low/_impl.py": "def helper(): ...\n",
    "pkg/low/api.py": "from pkg.low._impl import helper\n\ndef _hidden(): ...\n\ndef shown(): ...\n",
    "pkg/high/__init__.py": "",
}


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    for name, text in FILES.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [m for m in sys.modules if m == "pkg" or m.startswith("pkg.")]:
        del sys.modules[name]


def check(root: Path, user_code: str) -> ContractCheck:
    (root / "pkg/high/user.py").write_text(user_code)
    graph = grimp.build_graph("pkg", cache_dir=None)
    contract = PrivateImportsContract(name="private", session_options={}, contract_options={"containers": ["pkg"]})
    return contract.check(graph, verbose=False)


def test_a_package_may_use_its_own_private_modules_and_names(package: Path):
    (package / "pkg/low/sibling.py").write_text("from pkg.low.api import _hidden\n")  # same package: allowed
    assert check(package, "from pkg.low.api import shown\n").kept  # api.py imports pkg.low._impl: same package


@pytest.mark.parametrize("line", [
    "from pkg.low._impl import helper\n",
    "import pkg.low._impl\n",
    "from pkg.low import _impl\n",
    "from pkg.low.api import shown, _hidden\n",
    "from pkg.low.api import (\n    shown,\n    _hidden,\n)\n",
])
def test_reaching_into_another_package_private_name_breaks_it(package: Path, line: str):
    result = check(package, line)
    assert not result.kept
    (broken,) = result.metadata["broken"]
    assert broken["importer"] == "pkg.high.user" and broken["owner"] == "pkg.low"
