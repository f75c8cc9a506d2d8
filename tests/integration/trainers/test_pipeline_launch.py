"""The CPU pipeline's ranks forked from one process that imported torch (PipelineRun's default on a CPU) train
exactly as ranks that are each their own interpreter, and a rank that fails is named with its log either way."""

from __future__ import annotations

from pathlib import Path

import pytest

from freeride.tooling.bench.pipeline import PipelineConfig, launch

pytestmark = pytest.mark.background  # parameters, losses and logs

CFG = PipelineConfig(schedule="1F1B", stages=2, microbatches=2, forward_ms=1.0, backward_ms=2.0, iterations=2)


def test_forked_ranks_train_the_same_as_ranks_started_each_on_its_own(tmp_path: Path) -> None:
    forked = launch(CFG, tmp_path / "forked")
    started = launch(CFG, tmp_path / "started", fork=False)
    assert [r["params_sha256"] for r in forked] == [r["params_sha256"] for r in started]
    assert forked[-1]["losses"] == started[-1]["losses"] and forked[-1]["losses"]
    assert sorted(p.name for p in (tmp_path / "forked").iterdir()) == [
        "exits.json", "rank0.json", "rank0.log", "rank1.json", "rank1.log", "ranks.log"]


@pytest.mark.parametrize("fork", [True, False])
def test_a_failing_rank_is_named_with_its_log(tmp_path: Path, fork: bool) -> None:
    with pytest.raises(RuntimeError, match=r"pipeline ranks \[0, 1\] failed") as failed:
        launch(PipelineConfig(schedule="NoSuchSchedule", stages=2, iterations=1), tmp_path / "run", fork=fork)
    assert "rank 0: " in str(failed.value) and "NoSuchSchedule" in str(failed.value)
