"""freeride.cli.value: harvested GPU-hours, their value, and the training slowdown's cost subtracted honestly."""

from __future__ import annotations

import argparse

import pytest

from freeride.cli.common import UsageError
from freeride.cli.value import NOT_MEASURED, Pricing, Worth


def ns(price: str | None = None, slowdown: str | None = None) -> argparse.Namespace:
    return argparse.Namespace(gpu_hour_price=price, training_slowdown=slowdown)


def test_net_value_subtracts_the_training_time_the_slowdown_cost():
    # 90 harvested GPU-hours beside 1010 GPU-hours of training slowed 1 %: it would have taken 1000 without,
    # so the side tasks cost 10 GPU-hours; at 2.00 per GPU-hour 180 gross, 160 net.
    w = Worth.of(90 * 3600, 1010 * 3600, Pricing(2.0, 0.01))
    assert w.harvested_gpu_hours == 90 and w.training_gpu_hours == 1010
    assert w.slowdown_gpu_hours == pytest.approx(10)
    assert w.value == pytest.approx(180)
    assert w.net_value == pytest.approx(160)
    assert w.notes() == []


def test_no_slowdown_declared_means_no_net_value_not_a_zero_slowdown():
    w = Worth.of(3600, 7200, Pricing(gpu_hour_price=2.0))
    assert w.value == pytest.approx(2.0)
    assert w.slowdown_gpu_hours is None and w.net_value is None
    assert w.notes() == [NOT_MEASURED]
    assert "not measured" in w.cells()
    d = w.as_dict()
    assert d["net_value"] is None and d["slowdown_measured"] is False
    assert Worth.of(3600, 7200, Pricing(2.0, 0.0)).net_value == pytest.approx(2.0)  # declared zero: that is a claim


def test_without_a_price_gpu_hours_are_still_shown():
    w = Worth.of(1800, 3600, Pricing(training_slowdown=0.5))
    assert w.value is None and w.net_value is None
    assert w.slowdown_gpu_hours == pytest.approx(1 / 3)
    assert w.cells()[:2] == ["0.5", "1"]
    assert any("--gpu-hour-price" in n for n in w.notes())


def test_flags_win_over_their_environment_twins_and_percentages_are_ratios():
    env = {"FREERIDE_GPU_HOUR_PRICE": "3", "FREERIDE_TRAINING_SLOWDOWN": "0.5%"}
    assert Pricing.from_args(ns(), env) == Pricing(3.0, 0.005)
    assert Pricing.from_args(ns("2.5", "0.01"), env) == Pricing(2.5, 0.01)
    assert Pricing.from_args(ns(), {}) == Pricing()


@pytest.mark.parametrize(("args", "env", "words"), [
    (ns(price="cheap"), {}, ["--gpu-hour-price 'cheap'", "e.g. 2.50"]),
    (ns(price="-1"), {}, ["--gpu-hour-price '-1'"]),
    (ns(price="5%"), {}, ["--gpu-hour-price '5%'"]),
    (ns(price="1e308"), {}, ["--gpu-hour-price '1e308'", "at most 1,000,000"]),
    (ns(), {"FREERIDE_GPU_HOUR_PRICE": "2e6"}, ["FREERIDE_GPU_HOUR_PRICE '2e6'", "at most 1,000,000"]),
    (ns(slowdown="2"), {}, ["--training-slowdown '2'", "between 0 and 1", "0.5%"]),
    (ns(), {"FREERIDE_TRAINING_SLOWDOWN": "nan"}, ["FREERIDE_TRAINING_SLOWDOWN 'nan'"]),
])
def test_a_bad_value_says_which_flag_or_variable_and_what_to_give(args, env, words):
    with pytest.raises(UsageError) as err:
        Pricing.from_args(args, env)
    assert all(w in str(err.value) for w in words), str(err.value)
