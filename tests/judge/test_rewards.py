"""What a reward is (judge/rewards.py): the arithmetic from the judge's distributions, and --reward checked
against the rubrics before any model loads."""

import pytest

from mmjudge.judge.calibrator import Calibrator
from mmjudge.judge.data import JudgeResult, PairResult, UsageError
from mmjudge.judge.formats import FORMATS
from mmjudge.judge.prompts import load_rubrics
from mmjudge.judge.rewards import label_problem, parse_reward, preference_reward, score_reward, verdict_reward


@pytest.fixture(scope="module")
def rubrics():
    return load_rubrics(FORMATS["pairs"].default_rubrics)  # judge-serve's: MMIE's and the pairwise rubric of category general


def result(distribution=None, score=None, expected=None) -> JudgeResult:
    return JudgeResult(id="0", model=None, category="SA", feedback="", score=score, criteria={}, score_distribution=distribution,
                       expected_score=expected, n_images=0, n_tiles=0, prompt_tokens=1, generated_tokens=0)


def test_a_score_reward_is_the_expected_score_mapped_from_the_rubrics_scale_to_0_1(rubrics):
    sa = rubrics["SA"]  # MMIE's 0-6
    assert score_reward(result({"0": 0.5, "6": 0.5}, score=0, expected=3.0), sa) == 0.5
    assert score_reward(result({"6": 1.0}, score=6, expected=6.0), sa) == 1.0
    # the expected score, not the written one, where there is a distribution
    assert score_reward(result({"2": 0.25, "4": 0.75}, score=4, expected=3.5), sa) == pytest.approx(3.5 / 6)
    assert score_reward(result(score=3), sa) == 0.5  # a scale without a distribution: the written score
    assert score_reward(result(), sa) is None  # no number: no reward, never a made-up one


def test_a_calibrated_score_reward_maps_the_expected_score_through_the_calibrator_then_its_scale(rubrics):
    halved = Calibrator(method="linear", source="expected_score", x=[0, 6], y=[0, 3], scale=(0, 6))
    assert score_reward(result({"4": 1.0}, score=4, expected=4.0), rubrics["SA"], halved) == pytest.approx(2 / 6)


def pair(distribution) -> PairResult:
    return PairResult(id="0", model_a=None, model_b=None, category="general", verdict=None, verdict_distribution=distribution,
                      rule="agree", n_images=0)


def test_a_preference_reward_is_the_probability_that_the_response_wins_a_tie_counting_half():
    assert preference_reward(pair({"A": 0.6, "B": 0.2, "tie": 0.2})) == pytest.approx(0.7)
    assert preference_reward(pair({"A": 0.25, "B": 0.75})) == pytest.approx(0.25)
    assert preference_reward(pair(None)) is None


def test_a_verdict_reward_is_1_where_the_trained_judge_writes_the_label_and_0_otherwise(rubrics):
    general = rubrics["general"]
    assert verdict_reward("Both are fine, A is sharper.\n### Verdict\nA", "A", general) == 1.0
    assert verdict_reward("### Verdict\ntie", "TIE", general) == 1.0
    assert verdict_reward("### Verdict\nB", "A", general) == 0.0
    assert verdict_reward("A is better", "A", general) == 0.0  # no verdict in the rubric's format: wrong, not skipped
    assert label_problem("C") and label_problem(None) and not label_problem("tie")


@pytest.mark.parametrize("given, message", [
    ("score", "give KIND:CATEGORY"),
    ("rank:SA", "give KIND:CATEGORY"),
    ("score:XX", "category 'XX' has none; the pointwise rubrics here are ['MSR', 'PBL', 'SA']"),
    ("score:general", "a score reward reads a pointwise rubric, and category 'general' has a pairwise one"),
    ("preference:SA", "a preference reward reads a pairwise rubric, and category 'SA' has a pointwise one"),
    ("preference:general:calibrator.json", "only a score reward goes through a calibrator"),
])
def test_a_reward_that_cannot_work_is_refused_saying_what_would(rubrics, given, message):
    with pytest.raises(UsageError) as refused:
        parse_reward(given, rubrics)
    assert message in str(refused.value)


def test_a_reward_names_itself_in_records(rubrics, tmp_path):
    assert parse_reward("score:SA", rubrics).name == "score:SA"
    assert parse_reward("preference:general", rubrics).needs_reference
    calibrator = tmp_path / "calibrator.json"
    Calibrator(method="linear", source="expected_score", x=[0, 6], y=[1, 5], scale=(0, 6)).save(calibrator)
    assert parse_reward(f"score:SA:{calibrator}", rubrics).name == "score:SA:calibrated"
