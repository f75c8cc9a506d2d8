"""Specification of task-reference resolution, argument binding and the pre-submit check."""

from __future__ import annotations

import json
import textwrap
import uuid
from pathlib import Path

import pytest

from freeride import ImperativeTask, IterativeTask
from freeride.errors import TaskRefError
from freeride.worker._loader import bind_args, kind_of, load_class
from freeride.worker.check import check, main

TASK_SOURCE = textwrap.dedent(
    """
    from freeride import ImperativeTask, IterativeTask

    class Counter(IterativeTask):
        priority = 5
        mem_limit_bytes = 1024

        def __init__(self, steps: int, rate: float = 0.5, verbose: bool = False, label: str = "x"):
            self.steps, self.rate, self.verbose, self.label = steps, rate, verbose, label

        def step(self):
            pass

    class Loop(ImperativeTask):
        def run(self):
            pass

    class NotATask:
        pass

    Base = IterativeTask
    value = 3
    """
)


@pytest.fixture
def task_file(tmp_path: Path) -> Path:
    path = tmp_path / "my_task.py"
    path.write_text(TASK_SOURCE)
    return path


@pytest.fixture
def task_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The same task source, importable as a module with a name unique to this test."""
    name = f"_test_loader_mod_{uuid.uuid4().hex}"
    (tmp_path / f"{name}.py").write_text(TASK_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def ref_error(ref: str) -> str:
    with pytest.raises(TaskRefError) as info:
        load_class(ref)
    return str(info.value)


# -- load_class ------------------------------------------------------------------------------------


def test_loads_a_class_from_a_module_reference(task_module: str) -> None:
    cls = load_class(f"{task_module}:Counter")
    assert cls.__name__ == "Counter"
    assert issubclass(cls, IterativeTask)


def test_loads_an_installed_task_by_module_reference() -> None:
    cls = load_class("sidetasks.kmeans:KMeans")
    assert cls.__name__ == "KMeans"
    assert kind_of(cls) == "iterative"


def test_loads_a_class_from_a_file_reference(task_file: Path) -> None:
    cls = load_class(f"{task_file}:Counter")
    assert cls.__name__ == "Counter"
    assert issubclass(cls, IterativeTask)
    assert cls.priority == 5


def test_a_task_file_imports_modules_that_sit_beside_it(tmp_path: Path) -> None:
    helper = f"helper_{uuid.uuid4().hex}"
    (tmp_path / f"{helper}.py").write_text("STEP_MS = 7.0\n")
    (tmp_path / "task.py").write_text(textwrap.dedent(f"""
        from freeride import IterativeTask
        from {helper} import STEP_MS

        class Paced(IterativeTask):
            step_ms = STEP_MS

            def step(self) -> None:
                pass
    """))
    cls = load_class(f"{tmp_path / 'task.py'}:Paced")
    assert cls.step_ms == 7.0  # type: ignore[attr-defined]


def test_loads_an_imperative_task_from_a_file(task_file: Path) -> None:
    cls = load_class(f"{task_file}:Loop")
    assert issubclass(cls, ImperativeTask)
    assert kind_of(cls) == "imperative"


@pytest.mark.parametrize("ref", ["no_colon_here", "pkg.mod:", ":Class", ""])
def test_reference_without_module_and_class_is_rejected_with_the_expected_form(ref: str) -> None:
    assert "package.module:Class" in ref_error(ref)


@pytest.mark.parametrize("module", ["../../x", "..x", ".x", "pkg/mod", "pkg.my-mod", "pkg..mod"])
def test_a_module_part_that_is_neither_a_module_name_nor_a_file_says_what_a_reference_is(module: str) -> None:
    assert ref_error(f"{module}:Y") == (
        f"task reference '{module}:Y': {module!r} is neither a module name (package.module) nor a .py file; "
        "a reference looks like 'package.module:Class' or 'path/to/file.py:Class'")


def test_missing_module_is_reported_by_name() -> None:
    message = ref_error("no_such_module_for_freeride_tests:Task")
    assert "no_such_module_for_freeride_tests" in message
    assert "PYTHONPATH" in message


def test_missing_attribute_is_reported(task_module: str) -> None:
    message = ref_error(f"{task_module}:Nope")
    assert "no attribute 'Nope'" in message


@pytest.mark.parametrize("attr", ["NotATask", "value"])
def test_object_that_is_not_a_task_class_is_rejected(task_file: Path, attr: str) -> None:
    message = ref_error(f"{task_file}:{attr}")
    assert "is not a task" in message
    assert "IterativeTask" in message


@pytest.mark.parametrize("ref", ["freeride:IterativeTask", "freeride:ImperativeTask"])
def test_base_classes_themselves_are_rejected(ref: str) -> None:
    assert "base class" in ref_error(ref)


def test_base_class_reached_through_a_file_is_rejected(task_file: Path) -> None:
    assert "base class" in ref_error(f"{task_file}:Base")


def test_nonexistent_file_is_reported(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.py"
    message = ref_error(f"{missing}:Task")
    assert "does not exist" in message
    assert str(missing) in message


def test_file_that_raises_on_import_is_reported_with_the_error(tmp_path: Path) -> None:
    path = tmp_path / "broken.py"
    path.write_text("raise RuntimeError('boom at import')\n")
    message = ref_error(f"{path}:Task")
    assert "importing" in message
    assert "RuntimeError" in message
    assert "boom at import" in message


def test_module_that_raises_on_import_is_reported_with_the_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = f"_test_loader_broken_{uuid.uuid4().hex}"
    (tmp_path / f"{name}.py").write_text("x = 1 / 0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    message = ref_error(f"{name}:Task")
    assert "ZeroDivisionError" in message


def test_missing_dependency_of_a_task_module_names_the_dependency(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = f"_test_loader_dep_{uuid.uuid4().hex}"
    (tmp_path / f"{name}.py").write_text("import no_such_dependency_for_freeride_tests\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    message = ref_error(f"{name}:Task")
    assert "no_such_dependency_for_freeride_tests" in message


# -- bind_args -------------------------------------------------------------------------------------


class StringAnnotated(IterativeTask):
    # This module uses `from __future__ import annotations`: these annotations are strings.
    def __init__(self, steps: int, rate: float = 0.5, verbose: bool = False, label: str = "x") -> None:
        pass


class NoInit(IterativeTask):
    pass


class Untyped(IterativeTask):
    def __init__(self, anything=None) -> None:  # type: ignore[no-untyped-def]
        pass


class WithKwargs(IterativeTask):
    def __init__(self, n: int = 0, **extra: str) -> None:
        pass


def test_bind_args_coerces_to_declared_types_from_string_annotations() -> None:
    bound = bind_args(StringAnnotated, {"steps": "10", "rate": "0.25", "verbose": "yes", "label": "abc"})
    assert bound == {"steps": 10, "rate": 0.25, "verbose": True, "label": "abc"}
    assert type(bound["steps"]) is int
    assert type(bound["rate"]) is float


def test_bind_args_coerces_to_declared_types_from_real_annotations(task_file: Path) -> None:
    cls = load_class(f"{task_file}:Counter")  # that file has no `from __future__ import annotations`
    bound = bind_args(cls, {"steps": "7", "rate": "2", "verbose": "off"})
    assert bound == {"steps": 7, "rate": 2.0, "verbose": False}
    assert type(bound["rate"]) is float


@pytest.mark.parametrize(("raw", "expected"), [
    ("1", True), ("true", True), ("YES", True), ("On", True),
    ("0", False), ("false", False), ("No", False), ("OFF", False),
])
def test_bool_arguments_accept_common_spellings(raw: str, expected: bool) -> None:
    assert bind_args(StringAnnotated, {"steps": "1", "verbose": raw})["verbose"] is expected


def test_unannotated_arguments_stay_strings() -> None:
    assert bind_args(Untyped, {"anything": "42"}) == {"anything": "42"}


def test_omitted_optional_arguments_are_not_bound() -> None:
    assert bind_args(StringAnnotated, {"steps": "3"}) == {"steps": 3}


def test_unknown_argument_is_rejected_listing_the_accepted_ones() -> None:
    with pytest.raises(TaskRefError) as info:
        bind_args(StringAnnotated, {"steps": "1", "colour": "red"})
    message = str(info.value)
    assert "'colour'" in message
    assert "steps, rate, verbose, label" in message


def test_arguments_to_a_class_without_init_are_rejected() -> None:
    assert bind_args(NoInit, {}) == {}
    with pytest.raises(TaskRefError, match="takes no arguments"):
        bind_args(NoInit, {"x": "1"})


def test_keyword_catch_all_accepts_unknown_arguments_as_strings() -> None:
    assert bind_args(WithKwargs, {"n": "2", "other": "v"}) == {"n": 2, "other": "v"}


@pytest.mark.parametrize(("key", "raw", "kind"), [
    ("steps", "ten", "int"), ("steps", "1.5", "int"), ("rate", "fast", "float"), ("verbose", "maybe", "bool"),
])
def test_values_that_do_not_convert_are_rejected(key: str, raw: str, kind: str) -> None:
    args = {"steps": "1", key: raw}
    with pytest.raises(TaskRefError) as info:
        bind_args(StringAnnotated, args)
    message = str(info.value)
    assert f"{key}={raw!r}" in message
    assert f"valid {kind}" in message


def test_missing_required_arguments_are_reported() -> None:
    with pytest.raises(TaskRefError) as info:
        bind_args(StringAnnotated, {"rate": "1.0"})
    assert "steps" in str(info.value)
    assert "key=value" in str(info.value)


# -- check -----------------------------------------------------------------------------------------


def test_check_reports_kind_priority_and_memory_of_a_valid_task(task_file: Path) -> None:
    result = check(f"{task_file}:Counter", {"steps": "3"})
    assert result == {
        "ok": True,
        "kind": "iterative",
        "mem_limit_bytes": 1024,
        "priority": 5,
        "name": "Counter",
    }


def test_check_reports_defaults_for_an_imperative_task(task_file: Path) -> None:
    result = check(f"{task_file}:Loop", {})
    assert result["ok"] is True
    assert result["kind"] == "imperative"
    assert result["priority"] == 0
    assert result["mem_limit_bytes"] == 0


def test_check_reports_a_bad_reference_as_not_ok_with_the_reason(tmp_path: Path) -> None:
    result = check(f"{tmp_path / 'missing.py'}:Task", {})
    assert result["ok"] is False
    assert "does not exist" in str(result["error"])


def test_check_reports_bad_arguments_as_not_ok(task_file: Path) -> None:
    result = check(f"{task_file}:Counter", {})
    assert result["ok"] is False
    assert "steps" in str(result["error"])


def test_check_main_prints_one_json_object(task_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([f"{task_file}:Counter", "steps=4", "label=a=b"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["ok"] is True
    assert result["name"] == "Counter"


CHECKED_SOURCE = textwrap.dedent(
    """
    from freeride import IterativeTask

    class Checked(IterativeTask):
        def __init__(self, size: int = 1, name: str = "x"):
            self.size = size

        @classmethod
        def check_args(cls, **kwargs):
            if kwargs.get("name") == "echo":
                raise ValueError(repr(sorted(kwargs.items())))
            if kwargs.get("name") == "boom":
                raise KeyError("name")
            if kwargs.get("name") == "silent":
                raise ValueError()
            if kwargs.get("size", 1) <= 0:
                raise ValueError("size must be positive,\\n  got " + str(kwargs["size"]))

        def step(self):
            pass
    """
)


@pytest.fixture
def checked_file(tmp_path: Path) -> Path:
    path = tmp_path / f"checked_{uuid.uuid4().hex}.py"
    path.write_text(CHECKED_SOURCE)
    return path


def test_check_runs_check_args_with_the_given_arguments_as_converted(checked_file: Path) -> None:
    assert check(f"{checked_file}:Checked", {"size": "3"})["ok"] is True
    echoed = check(f"{checked_file}:Checked", {"size": "3", "name": "echo"})
    assert echoed["error"] == "[('name', 'echo'), ('size', 3)]"  # converted (an int), and only what was given


@pytest.mark.parametrize(
    ("args", "error"),
    [
        ({"size": "0"}, "size must be positive, got 0"),  # a ValueError: the task's own words, on one line
        ({"name": "boom"}, "check_args raised KeyError: 'name'"),  # anything else: named
        ({"name": "silent"}, "check_args raised ValueError"),  # a ValueError without words
    ],
)
def test_check_args_refusing_makes_the_check_not_ok_with_one_line(
    checked_file: Path, args: dict[str, str], error: str
) -> None:
    assert check(f"{checked_file}:Checked", args) == {"ok": False, "error": error}


def test_the_base_check_args_accepts_anything() -> None:
    IterativeTask.check_args(anything=1)
    ImperativeTask.check_args()
