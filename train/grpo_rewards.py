"""The rewards a judge earns in judge-train --objective grpo (train/grpo.py), each a plain function of the judge's
written output, and their TRL form (`trl_rewards`). Free of torch.

    reward             of one completion (the judge's output for one order of one pair)
    verdict            1 where the verdict it writes, read by the rubric's verdict format and put in the pair's
                       terms, is people's (their majority; a tie is a verdict), else 0: a verdict that does not
                       parse is a wrong one
    format             1 where the rubric's verdict format reads a verdict in it, else 0 (for `verdict_format:
                       think`, only the whole <think>...</think><answer>...</answer> layout reads)
    swap_consistency   the share of the same pair's completions in the other order whose verdict, in the
                       pair's terms, is this one's; 0 where this one gives none

Swap consistency needs both orders of a pair among the completions rewarded together: the trainer's sampler
(train/grpo.py's BothOrders) draws a pair's forward and reverse prompts next to each other, each num_generations
times, and every process is given whole groups of them (train/config.py checks the batch sizes).
"""

from __future__ import annotations

from collections.abc import Callable

from mmjudge.judge.preferences import in_pair_terms
from mmjudge.judge.prompts import Rubric
from mmjudge.judge.verdicts import VERDICT_FORMATS

REWARDS = ("verdict", "format", "swap_consistency")


def written_verdict(completion: str, rubric: Rubric) -> str | None:
    """The verdict a completion writes, positional ("A": the answer shown first); None where it gives none."""
    return VERDICT_FORMATS[rubric.verdict_format].read(completion, rubric.criteria).verdict


def verdict_reward(completion: str, rubric: Rubric, preference: str, first: str) -> float:
    """1.0 where the completion's verdict, shown with answer `first` first, is `preference` (the pair's terms)."""
    return 1.0 if in_pair_terms(written_verdict(completion, rubric), first) == preference else 0.0


def format_reward(completion: str, rubric: Rubric) -> float:
    """1.0 where the rubric's verdict format reads a verdict in the completion."""
    return 1.0 if written_verdict(completion, rubric) is not None else 0.0


def swap_consistency_rewards(verdicts: list[tuple[str, str, str | None]]) -> list[float | None]:
    """For each (pair id, answer shown first, verdict in the pair's terms) of the completions rewarded together,
    the share of that pair's completions in the other order that agree with it; None where the other order is
    not among them (no reward rather than a made-up one)."""
    rewards = []
    for pair_id, first, verdict in verdicts:
        other = [v for p, f, v in verdicts if p == pair_id and f != first]
        if not other:
            rewards.append(None)
        else:
            rewards.append(sum(verdict is not None and v == verdict for v in other) / len(other))
    return rewards


def trl_rewards(rubrics: dict[str, Rubric], names: list[str]) -> list[Callable]:
    """The rewards `names` as TRL's GRPOTrainer calls a reward function: keyword arguments, the completions and
    the dataset's columns (category, preference, first, pair_id), one value per completion."""

    def verdict(completions, category, preference, first, **_):
        return [verdict_reward(c, rubrics[k], p, f) for c, k, p, f in zip(completions, category, preference, first)]

    def format(completions, category, **_):  # noqa: A001 - the reward's name in TRL's logs
        return [format_reward(c, rubrics[k]) for c, k in zip(completions, category)]

    def swap_consistency(completions, category, first, pair_id, **_):
        return swap_consistency_rewards([(p, f, in_pair_terms(written_verdict(c, rubrics[k]), f))
                                         for c, k, f, p in zip(completions, category, first, pair_id)])

    functions = {"verdict": verdict, "format": format, "swap_consistency": swap_consistency}
    return [functions[name] for name in names]
