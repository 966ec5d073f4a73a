"""The rewards of judge-train --objective grpo on hand-written judge outputs: the verdict read by the rubric's
own format and put in the pair's terms before it is compared with people's, the format only where it reads,
and swap consistency across a pair's two orders."""

import pytest

from mmjudge.configs import CONFIG_DIR
from mmjudge.judge.prompts import Rubric, load_rubrics
from mmjudge.train.grpo_rewards import format_reward, swap_consistency_rewards, trl_rewards, verdict_reward

PAIRWISE = load_rubrics([CONFIG_DIR / "rubrics" / "pairwise.yaml"])["general"]
THINK = Rubric(kind="pairwise", category="think", verdict_format="think", instructions="Think, then answer.",
               template="{instructions}\n{question}\nA: {answer_a}\nB: {answer_b}\n")

REVIEW_A = "A is clearer.\nText quality: A\n### Verdict\nA"  # the toolkit's format, verdict A
REVIEW_B = "B names the marker.\n### Verdict\nB"
NO_HEADING = "A is clearer.\nText quality: A\nVerdict: A"  # no "### Verdict": no verdict


def test_verdict_is_compared_in_the_pair_s_terms():
    # people prefer answer B; shown in the reverse order, B is the answer shown first ("A")
    assert verdict_reward(REVIEW_B, PAIRWISE, "B", first="A") == 1.0
    assert verdict_reward(REVIEW_A, PAIRWISE, "B", first="A") == 0.0
    assert verdict_reward(REVIEW_A, PAIRWISE, "B", first="B") == 1.0
    assert verdict_reward(REVIEW_B, PAIRWISE, "B", first="B") == 0.0
    assert verdict_reward("Neither is better.\n### Verdict\ntie", PAIRWISE, "tie", first="B") == 1.0
    assert verdict_reward(NO_HEADING, PAIRWISE, "A", first="A") == 0.0  # unparsed: wrong, never right by chance


def test_format_rewards_the_rubric_s_own_layout():
    assert format_reward(REVIEW_A, PAIRWISE) == 1.0
    assert format_reward(NO_HEADING, PAIRWISE) == 0.0
    assert format_reward("<think>B names the marker.</think><answer>B</answer>", THINK) == 1.0
    assert format_reward("<think>B names the marker.</think> B", THINK) == 0.0
    assert format_reward(REVIEW_B, THINK) == 0.0  # the toolkit's layout is not the think rubric's
    assert verdict_reward("<think>B names the marker.</think>\n<answer>B</answer>", THINK, "A", first="B") == 1.0


def test_swap_consistency_is_the_share_of_the_other_order_that_agrees():
    # pair p: forward completions say A, A; reverse say A, B (pair terms). Pair q has one order only.
    verdicts = [("p", "A", "A"), ("p", "A", "A"), ("p", "B", "A"), ("p", "B", "B"), ("q", "A", "B"), ("p", "A", None)]
    assert swap_consistency_rewards(verdicts) == [0.5, 0.5, 2 / 3, 0.0, None, 0.0]


def test_trl_form_reads_the_columns_and_puts_reverse_verdicts_in_pair_terms():
    verdict, fmt, swap = trl_rewards({"general": PAIRWISE}, ["verdict", "format", "swap_consistency"])
    # one pair, people prefer A; forward writes A (right), reverse writes B (its first shown is B: right again)
    completions = [REVIEW_A, REVIEW_B, NO_HEADING, REVIEW_A]
    columns = {"category": ["general"] * 4, "preference": ["A"] * 4, "first": ["A", "B", "A", "B"], "pair_id": ["p"] * 4}
    assert verdict(completions=completions, **columns, trainer_state=None) == [1.0, 1.0, 0.0, 0.0]
    assert fmt(completions=completions, **columns) == [1.0, 1.0, 0.0, 1.0]
    # pair terms: forward A, none; reverse A, B. The forward A agrees with one of two reverse completions, the
    # reverse A with one of two forward ones, the reverse B with none
    assert swap(completions=completions, **columns) == [0.5, 0.5, 0.0, 0.0]


@pytest.mark.parametrize("name", ["verdict", "format", "swap_consistency"])
def test_each_reward_is_named_as_the_logs_name_it(name):
    assert trl_rewards({"general": PAIRWISE}, [name])[0].__name__ == name
