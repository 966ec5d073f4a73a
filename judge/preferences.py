"""From judgements to a pair's verdict: each order's verdict, swap consistency, the final verdict under a
declared rule, and a pointwise judge's verdict from its scores. Free of torch: judge-score, judge-serve,
judge-train and judge-calibrate all decide the same way.

    rule              the final verdict of a pairwise judge, which saw both orders
    agree             the verdict both orders give, else a tie (MT-Bench's rule: a judge that changes its
                      mind with the order has no preference it holds)
    mean_probability  the likeliest verdict of the two orders' verdict distributions averaged

A pointwise judge (MMIE-Eval) scores each answer alone: the answer whose expected score (its score where it
has no distribution; a reward model's reward) is higher by more than the tie margin wins, else a tie. Its verdict distribution is
that of the difference of two independent draws from the answers' score distributions.
"""

from __future__ import annotations

from itertools import product

from mmjudge.judge.data import VERDICTS, JudgeResult, OrderJudgement, flip, majority

RULES = ("agree", "mean_probability")
ORDERS = {"forward": "A", "reverse": "B"}  # an order's name -> the answer it shows first
POINTWISE_RULE = "expected_score"


def mean_distribution(distributions: list[dict[str, float] | None]) -> dict[str, float] | None:
    """The average of some verdict distributions (each over the same verdicts); None unless all are given."""
    if not distributions or any(d is None for d in distributions):
        return None
    return {v: sum(d[v] for d in distributions) / len(distributions) for v in distributions[0]}


def likeliest(distribution: dict[str, float]) -> str:
    return max(distribution, key=lambda v: (distribution[v], -VERDICTS.index(v)))  # equal probabilities: A, then B, then tie


def order_verdict(judgements: list[OrderJudgement], rule: str) -> str | None:
    """One order's verdict, as the rule reads it: under agree, its written verdicts' majority (one greedy
    judgement is its own); under mean_probability, the likeliest of its mean verdict distribution."""
    if rule == "mean_probability":
        distribution = mean_distribution([j.verdict_distribution for j in judgements])
        return likeliest(distribution) if distribution else None
    if rule == "agree":
        return majority([j.verdict for j in judgements])
    raise ValueError(f"unknown rule {rule!r}; the rules are {', '.join(RULES)}")


def pairwise_verdict(forward: list[OrderJudgement], reverse: list[OrderJudgement], rule: str) -> tuple[str | None, dict | None, bool | None]:
    """(final verdict, its distribution, swap consistency) of a pair judged in both orders."""
    ahead, behind = order_verdict(forward, rule), order_verdict(reverse, rule)
    consistent = None if ahead is None or behind is None else ahead == behind
    distribution = mean_distribution([j.verdict_distribution for j in forward + reverse])
    if rule == "agree":
        verdict = None if consistent is None else ahead if consistent else "tie"
    else:
        verdict = likeliest(distribution) if distribution else None
    return verdict, distribution, consistent


def first_wins(verdict: str | None, first: str) -> bool | None:
    """Whether a verdict prefers the answer shown first (None: no verdict, or a tie)."""
    return None if verdict in (None, "tie") else verdict == first


def pointwise_value(result: JudgeResult) -> float | None:
    """What a pointwise judge's verdict compares of an answer: its reward (a reward model's), else its expected
    score, else its written score."""
    return next((v for v in (result.reward, result.expected_score, result.score) if v is not None), None)


def pointwise_verdict(a: JudgeResult, b: JudgeResult, margin: float) -> tuple[str | None, dict | None]:
    """(verdict, distribution) of a pointwise judge's scores of answers A and B (module docstring)."""
    va, vb = pointwise_value(a), pointwise_value(b)
    verdict = None if va is None or vb is None else "A" if va - vb > margin else "B" if vb - va > margin else "tie"
    distribution = None
    if a.score_distribution and b.score_distribution:
        distribution = dict.fromkeys(VERDICTS, 0.0)
        for (sa, pa), (sb, pb) in product(a.score_distribution.items(), b.score_distribution.items()):
            difference = float(sa) - float(sb)
            distribution["A" if difference > margin else "B" if -difference > margin else "tie"] += pa * pb
    return verdict, distribution


def in_pair_terms(verdict: str | None, first: str) -> str | None:
    """A positional verdict ("A": the answer shown first) as the pair names it."""
    return verdict if first == "A" else flip(verdict)
