"""The start-up bench's figures over its runs (freeride.tooling.bench.startup.job_ratios), without a job."""

from __future__ import annotations

import pytest

from freeride.tooling.bench.startup import job_ratios, settings


def test_each_pair_is_one_ratio_and_the_null_compares_consecutive_plain_jobs() -> None:
    r = job_ratios([10.0, 11.0, 12.1], [10.5, 11.0, 11.0])
    assert r["plain"] == 11.0 and r["instrumented"] == 11.0
    assert r["ratios"] == pytest.approx([1.05, 1.0, 0.9091], abs=1e-4)
    assert r["ratio"] == 1.0  # the median pair
    assert r["null_ratio"] == pytest.approx(1.1)  # 11/10 and 12.1/11


def test_one_run_has_its_ratio_and_no_null() -> None:
    r = job_ratios([20.0], [21.0])
    assert (r["ratio"], r["ratios"], r["null_ratio"]) == (1.05, [1.05], None)


def test_settings_keep_their_order_and_refuse_an_unknown_one() -> None:
    assert settings("agent_task_fits_none, no_agent") == ("no_agent", "agent_task_fits_none")
    with pytest.raises(ValueError, match=r"\(not lunch\)"):
        settings("agent_idle,lunch")
