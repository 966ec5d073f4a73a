import numpy as np
import pytest

from mmjudge.judge.parsing import ScoreScale

TENTHS = ScoreScale(0, 1, 0.1)


def test_levels_read_as_written():
    assert TENTHS.n_levels == 11
    assert TENTHS.levels == [0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1]
    assert ScoreScale().levels == [0, 1, 2, 3, 4, 5, 6] and all(type(v) is int for v in ScoreScale().levels)  # MMIE writes 4, not 4.0
    assert ScoreScale().integral and not TENTHS.integral
    assert str(TENTHS) == "0-1 in steps of 0.1" and str(ScoreScale(1, 5)) == "1-5"


@pytest.mark.parametrize(
    "value, index",
    [
        (0.7, 7), (0.1 * 7, 7), (0.6 + 0.1, 7), (1 - 0.3, 7),  # 0.7000000000000001, 0.7, 0.7 from below
        (0.3, 3), (0.1 * 3, 3), (1 - 0.7, 3),  # 0.30000000000000004
        (0.34999, 3), (0.35001, 4), (0.04, 0), (0.96, 10),
        # half-way (a mean of two annotators): to the even level, whatever the float error of value / step
        (0.05, 0), (0.15, 2), (0.25, 2), (0.35, 4), (0.45, 4), (0.65, 6), (0.75, 8), (0.95, 10),
        (-0.2, 0), (1.3, 10),  # outside the scale: its ends
    ],
)
def test_a_value_snaps_to_its_nearest_level(value, index):
    assert TENTHS.index([value])[0] == index
    if 0 <= value <= 1:
        assert TENTHS.snap(value) == TENTHS.levels[index]
    else:
        assert TENTHS.snap(value) is None  # the parser's rule: a score outside the scale is no score


def test_half_way_follows_the_tenths_not_their_float_error():
    # (k + 0.5) / 10 for every k: float division gives values on both sides of the half
    halves = (np.arange(10) + 0.5) / 10
    assert list(TENTHS.index(halves)) == [round(k + 0.5) for k in range(10)]  # Python rounds halves to even


@pytest.mark.parametrize("low, high", [(0, 6), (1, 5), (-3, 3)])
def test_whole_steps_snap_as_rounding_the_raw_score_did(low, high):
    values = np.linspace(low, high, 8 * (high - low) + 1)  # every eighth: halves included
    assert list(ScoreScale(low, high).index(values)) == list(np.clip(np.rint(values), low, high).astype(int) - low)


def test_a_scale_not_starting_on_a_multiple_of_its_step():
    scale = ScoreScale(0.5, 3.5)
    assert scale.levels == [0.5, 1.5, 2.5, 3.5]
    assert [scale.snap(v) for v in (0.5, 1.4, 1.6, 3.5)] == [0.5, 1.5, 1.5, 3.5]


@pytest.mark.parametrize("high, step", [(0.7, 0.1), (1, 0.05), (1, 0.2), (10, 2.5), (0.3, 0.1)])
def test_float_steps_that_divide_the_scale_are_accepted(high, step):
    scale = ScoreScale(0, high, step)
    assert scale.levels[-1] == pytest.approx(high) and scale.n_levels == round(high / step) + 1


@pytest.mark.parametrize(
    "low, high, step, message",
    [(0, 1, 0.3, "step 0.3 does not divide the scale 0-1 into whole steps ((high - low) / step = 3.333)"),
     (0, 6, 4, "step 4 does not divide the scale 0-6"), (0, 1, 0, "step > 0"), (0, 1, -0.1, "step > 0"),
     (1, 1, 1, "low < high"), (6, 0, 1, "low < high"), (0, float("inf"), 1, "finite"), (0, 1, float("nan"), "finite")],
)
def test_a_bad_scale_says_why(low, high, step, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ScoreScale(low, high, step)


def test_a_scale_of_more_steps_than_any_rating_scale_is_refused():
    assert ScoreScale(0, 100, 0.1).n_levels == 1001
    with pytest.raises(ValueError, match="0-100 in steps of 0.05 is 2,000 steps; a scale has at most 1,000"):
        ScoreScale(0, 100, 0.05)
