"""Specification of the bubble-length predictor and the safety-margin controller."""

from __future__ import annotations

from freeride.agent.control.predictor import MarginController, SlotPredictor

MS = 1_000_000
WARMUP = 1 * MS  # the skipped first observation; it would be the minimum if it counted


def _fed(lengths: list[int], **kwargs: float) -> SlotPredictor:
    p = SlotPredictor(**kwargs)  # type: ignore[arg-type]
    for n in lengths:
        p.observe(n)
    return p


# -- SlotPredictor ---------------------------------------------------------------------------------


def test_predicts_nothing_before_any_observation() -> None:
    assert SlotPredictor().predict_ns() is None


def test_first_observation_is_skipped_as_warm_up() -> None:
    p = _fed([50 * MS])
    assert p.predict_ns() is None
    p.observe(10 * MS)
    assert p.predict_ns() == 10 * MS


def test_warm_up_length_never_influences_the_prediction() -> None:
    # The warm-up iteration is much shorter; if it counted, the minimum would be 1 ms.
    assert _fed([1 * MS, 10 * MS, 11 * MS]).predict_ns() == 10 * MS


def test_skip_count_is_configurable() -> None:
    p = _fed([5 * MS, 5 * MS], skip=2)
    assert p.predict_ns() is None
    p.observe(7 * MS)
    assert p.predict_ns() == 7 * MS


def test_prediction_is_the_minimum_of_recent_lengths() -> None:
    assert _fed([WARMUP, 10 * MS, 9 * MS, 11 * MS, 10 * MS]).predict_ns() == 9 * MS


def test_non_positive_lengths_are_ignored_and_do_not_consume_the_skip() -> None:
    p = _fed([0, -5, 10 * MS])  # 0 and -5 ignored; 10 ms is the skipped first observation
    assert p.predict_ns() is None
    p.observe(8 * MS)
    p.observe(0)
    p.observe(-1)
    assert p.predict_ns() == 8 * MS


def test_shorter_bubble_lowers_the_prediction_immediately() -> None:
    p = _fed([WARMUP, 10 * MS, 10 * MS, 10 * MS])
    p.observe(4 * MS)
    assert p.predict_ns() == 4 * MS


def test_a_single_long_outlier_does_not_raise_the_prediction() -> None:
    p = _fed([WARMUP, 10 * MS, 10 * MS, 30 * MS])
    assert p.predict_ns() == 10 * MS


def test_adapts_upward_after_change_run_consecutive_outliers() -> None:
    p = _fed([WARMUP, 10 * MS, 10 * MS, 10 * MS], change_ratio=0.25, change_run=3)
    p.observe(20 * MS)
    p.observe(21 * MS)
    assert p.predict_ns() == 10 * MS  # two in a row are not yet a schedule change
    p.observe(22 * MS)
    assert p.predict_ns() == 20 * MS  # the history is replaced by the outliers


def test_an_inlier_resets_the_outlier_run() -> None:
    p = _fed([WARMUP, 10 * MS, 10 * MS], change_ratio=0.25, change_run=3)
    p.observe(20 * MS)
    p.observe(20 * MS)
    p.observe(11 * MS)  # within 25 %: the run starts over
    p.observe(20 * MS)
    p.observe(20 * MS)
    assert p.predict_ns() == 10 * MS
    p.observe(20 * MS)
    assert p.predict_ns() == 20 * MS


def test_lengths_within_change_ratio_are_not_outliers() -> None:
    p = _fed([WARMUP, 10 * MS], change_ratio=0.25, change_run=2)
    for _ in range(5):
        p.observe(12 * MS)  # +20 %: ordinary noise, the minimum stays
    assert p.predict_ns() == 10 * MS


def test_history_is_bounded_so_old_minima_roll_over() -> None:
    p = _fed([WARMUP, 10 * MS, 11 * MS, 12 * MS, 12 * MS], history=4)
    assert p.predict_ns() == 10 * MS
    p.observe(12 * MS)  # pushes the 10 ms length out of the 4-long history
    assert p.predict_ns() == 11 * MS
    p.observe(12 * MS)
    assert p.predict_ns() == 12 * MS


# -- MarginController ------------------------------------------------------------------------------


def test_margin_starts_at_the_base() -> None:
    assert MarginController(base_ns=200_000).margin_ns() == 200_000


def test_clean_windows_keep_the_base_margin() -> None:
    m = MarginController(base_ns=200_000)
    for _ in range(10):
        m.on_window(0)
    assert m.margin_ns() == 200_000


def test_overrun_raises_the_margin_by_its_length() -> None:
    m = MarginController(base_ns=100, cap_ns=10_000)
    m.on_window(300)
    assert m.margin_ns() == 400
    m.on_window(200)
    assert m.margin_ns() == 600


def test_extra_margin_is_capped() -> None:
    m = MarginController(base_ns=100, cap_ns=1_000)
    m.on_window(5_000)
    assert m.margin_ns() == 1_100
    m.on_window(5_000)
    assert m.margin_ns() == 1_100


def test_clean_windows_decay_the_extra_margin() -> None:
    m = MarginController(base_ns=100, cap_ns=10_000, decay=0.5)
    m.on_window(1_000)
    m.on_window(0)
    assert m.margin_ns() == 600
    m.on_window(0)
    assert m.margin_ns() == 350


def test_extra_margin_decays_back_to_the_base() -> None:
    m = MarginController(base_ns=100, cap_ns=5_000_000)
    m.on_window(5_000_000)
    previous = m.margin_ns()
    for _ in range(400):
        m.on_window(0)
        assert m.margin_ns() <= previous
        previous = m.margin_ns()
    assert m.margin_ns() == 100


def test_a_one_off_short_bubble_is_forgotten_after_a_run_of_normal_lengths() -> None:
    # A trainer hiccup shortens one bubble: the prediction drops at once (no overrun), and
    # comes back after `change_run` normal lengths instead of staying low for the whole history.
    ms = 1_000_000
    p = SlotPredictor(history=16, skip=1, change_ratio=0.25, change_run=3)
    for length in (25, 25, 12):
        p.observe(length * ms)
    assert p.predict_ns() == 12 * ms
    for _ in range(2):
        p.observe(25 * ms)
        assert p.predict_ns() == 12 * ms
    p.observe(25 * ms)
    assert p.predict_ns() == 25 * ms
