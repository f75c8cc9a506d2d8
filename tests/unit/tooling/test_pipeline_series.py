"""A series of pipeline configurations runs in one set of rank processes only if they share what those processes are
started with (freeride.tooling.bench.pipeline.launch_series); said before any process starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from freeride.tooling.bench.pipeline import PipelineConfig, launch_series


@pytest.mark.parametrize(("other", "named"), [
    (PipelineConfig(stages=2), "stages"),
    (PipelineConfig(socket_dir="/elsewhere"), "socket_dir"),
    (PipelineConfig(framework="deepspeed"), "framework"),
])
def test_a_series_whose_processes_would_differ_is_refused_before_anything_starts(
    tmp_path: Path, other: PipelineConfig, named: str
) -> None:
    with pytest.raises(ValueError, match=f"these differ: {named}"):
        launch_series([PipelineConfig(schedule="GPipe"), other], tmp_path / "run")
    assert not (tmp_path / "run").exists()  # nothing was started


def test_a_series_of_deepspeed_jobs_is_refused() -> None:
    with pytest.raises(ValueError, match="a series runs torch configurations"):
        launch_series([PipelineConfig(framework="deepspeed"), PipelineConfig(framework="deepspeed")], Path("/x"))
