"""The end-of-run summary: MMIE's figures (sample count, mean score overall and per category) plus
per criterion, per evaluated model, parse failures, truncations and skipped records, a warning when the
scores collapse onto one level, and with a calibrator its score sets and escalations. A run over pairs has
its own (`summarize_pairs`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from statistics import mean

from mmjudge.judge.calibrator import Calibrator
from mmjudge.judge.data import CRITERIA, JudgeResult, Pair, PairResult, Problem
from mmjudge.judge.parsing import COLLAPSE_SHARE, SCORE_HEADING, ScoreScale
from mmjudge.judge.preferences import ORDERS, first_wins, order_verdict

SUMMARY = "summary.json"  # its file, beside the results
PARSE_ERRORS_SHOWN = 3


def _mean_by(results: list[JudgeResult], group: Callable[[JudgeResult], str | None]) -> dict[str, dict]:
    groups: dict[str, list[int | float]] = {}
    for r in results:
        if r.score is not None:
            groups.setdefault(str(group(r)), []).append(r.score)
    return {name: {"n": len(scores), "mean_score": mean(scores)} for name, scores in sorted(groups.items())}


def histogram(values: list[int | float], scale: ScoreScale) -> dict[str, int]:
    """How many values fall on each level of the scale, every level listed."""
    counts = dict.fromkeys(map(str, scale.levels), 0)
    for k in scale.index(values).astype(int):
        counts[str(scale.level(int(k)))] += 1
    return counts


def collapse(values: list[int | float], scale: ScoreScale) -> dict | None:
    """The level that takes more than COLLAPSE_SHARE of the values, with their histogram; None if none does:
    a judge's collapse is seen here before any human label exists."""
    counts = histogram(values, scale)
    level, count = max(counts.items(), key=lambda item: item[1])
    if not values or count / len(values) <= COLLAPSE_SHARE:
        return None
    return {"level": level, "share": count / len(values), "n": len(values), "histogram": counts}


def calibrated(results: list[JudgeResult], calibrator: Calibrator) -> dict:
    """What the calibrator said of the records: the size of their score sets, and how many to escalate."""
    sets = [r.score_set for r in results if r.score_set is not None]  # [low, high] on a scale of whole numbers
    entry = {}
    if calibrator.score_sets is not None:
        entry["score_sets"] = {"coverage": calibrator.score_sets.coverage, "held_out_coverage": calibrator.score_sets.held_out_coverage,
                               "with_set": len(sets), "without_set": len(results) - len(sets),
                               "mean_levels": mean(high - low + 1 for low, high in sets) if sets else None}
    if (escalation := calibrator.escalation) is not None:
        verdicts = [r.escalate for r in results]
        entry["escalation"] = {"agreement": escalation.agreement, "target_agreement": escalation.target_agreement,
                               "escalate": verdicts.count(True), "judge_alone": verdicts.count(False), "undecided": verdicts.count(None)}
    return entry


def summarize(results: list[JudgeResult], skipped: list[Problem], scale: ScoreScale, calibrator: Calibrator | None = None) -> dict:
    scored = [r.score for r in results if r.score is not None]
    criteria, collapsed = {}, {}
    for name in CRITERIA:
        values = [r.criteria[name] for r in results if r.criteria.get(name) is not None]
        if values:
            criteria[name] = {"n": len(values), "mean_score": mean(values)}
        if found := collapse(values, scale):
            collapsed[name] = found
    if found := collapse(scored, scale):
        collapsed = {"overall": found, **collapsed}
    overall = mean(scored) if scored else None
    return {
        "samples": len(results),
        "scored": len(scored),
        "mean_score": overall,
        # MMIE publishes the mean score as a percentage of the top of the scale.
        "percent": None if overall is None else 100 * scale.share(overall),
        "by_category": _mean_by(results, lambda r: r.category),
        "by_model": _mean_by(results, lambda r: r.model),
        "by_criterion": criteria,
        "parse_failures": sum(r.parse_error is not None for r in results),
        # why they failed, the most frequent first: all of one reason is a format the judge does not write
        "parse_errors": dict(Counter(r.parse_error for r in results if r.parse_error is not None).most_common(PARSE_ERRORS_SHOWN)),
        "truncated": sum(bool(r.truncated) for r in results),
        "skipped_invalid": [str(p) for p in skipped],
        "collapse": collapsed,
        **({"calibrator": calibrated(results, calibrator)} if calibrator is not None else {}),
        **reward_summary(results),
    }


def reward_summary(results: list[JudgeResult]) -> dict:
    """A reward model's rewards (it writes no score), only where there are any: other runs' summaries keep their keys."""
    rewards = [r.reward for r in results if r.reward is not None]
    return {"rewarded": len(rewards), "mean_reward": mean(rewards)} if rewards else {}


def format_summary(summary: dict) -> str:
    fmt = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
    lines = [
        f"Samples: {summary['samples']}  scored: {summary['scored']}  parse failures: {summary['parse_failures']}"
        f"  truncated: {summary['truncated']}  skipped (invalid): {len(summary['skipped_invalid'])}",
        f"Mean score: {fmt(summary['mean_score'])}  ({fmt(summary['percent'])}% of the scale)",
    ]
    for title, key in (("category", "by_category"), ("model", "by_model"), ("criterion", "by_criterion")):
        for name, group in summary[key].items():
            lines.append(f"  {title} {name}: {fmt(group['mean_score'])} (n={group['n']})")
    if summary.get("structured"):
        lines.append("Structured: each answer held to its rubric's layout and scale by a grammar (--structured)")
    if summary.get("rewarded"):
        lines.append(f"Mean reward: {summary['mean_reward']:.3f} (n={summary['rewarded']}; a reward model writes no score)")
    lines += calibrator_lines(summary.get("calibrator", {}))
    lines += nothing_parsed(summary)
    for name, found in summary["collapse"].items():
        counts = "  ".join(f"{level}: {n}" for level, n in found["histogram"].items())
        lines.append(f"warning: {name} scores collapse: {found['share']:.0%} of {found['n']} are {found['level']} "
                     f"(over {COLLAPSE_SHARE:.0%} on one level measures little); histogram {counts}")
    lines += [f"warning: {warning}" for warning in summary.get("warnings", [])]
    return "\n".join(lines)


def nothing_parsed(summary: dict) -> list[str]:
    """A banner for a run none of whose outputs gave a score: its mean is undefined and its records carry no
    score, which a line of counts among others does not make plain."""
    if summary["scored"] or not summary["samples"] or summary.get("rewarded"):
        return []
    reasons = "; ".join(f"{n} x {reason}" for reason, n in summary.get("parse_errors", {}).items())
    return ["!" * 100,
            f"warning: NONE of the {summary['samples']} outputs parsed: no record has a score, and the mean score is undefined.",
            f"  why: {reasons}",
            "  Is the judge trained to write this rubric's format (an untrained or base model is not), and is --max_new_tokens long enough"
            f" for its feedback? A judge scoring here still writes expected_score, read after a forced '{SCORE_HEADING}' heading;"
            " one behind a chat server (--backend openai) cannot.",
            "!" * 100]


def calibrator_lines(entry: dict) -> list[str]:
    lines = []
    if sets := entry.get("score_sets"):
        size = "n/a" if sets["mean_levels"] is None else f"{sets['mean_levels']:.2f}"
        lines.append(f"Score sets (cover the human score at {sets['coverage']:.0%}): {sets['with_set']} record(s), "
                     f"{size} levels on average; {sets['without_set']} without (no score distribution)")
    if escalation := entry.get("escalation"):
        agreement = "exactly" if escalation["agreement"] == "exact" else "within one level"
        lines.append(f"Escalate to people: {escalation['escalate']}  judge alone: {escalation['judge_alone']}  "
                     f"undecided (no score distribution): {escalation['undecided']}  "
                     f"(the judge alone agrees with people {agreement} at {escalation['target_agreement']:.0%} or more)")
    return lines


def summarize_pairs(results: list[PairResult], pairs: list[Pair], skipped: list[Problem], records: list[dict] | None = None) -> dict:
    """The end-of-run figures of a pairwise run: the verdicts, how often the two orders agree, how often the
    answer shown first wins in each order (position bias), parse failures, and, where the input says what
    people preferred, how often the final verdict agrees with them (ties counted as a third verdict; and
    with every pair where either side is a tie left out). With a calibrator's `records` (each saying whether it was
    abstained), how many were kept and how often the kept verdicts agree with people."""
    judgements = [j for r in results for j in r.forward + r.reverse]
    swapped = [r.swap_consistent for r in results if r.swap_consistent is not None]
    people = {p.id: p.preference for p in pairs}
    compared = [(r.verdict, people[r.id]) for r in results if r.verdict is not None and people.get(r.id) is not None]
    decisive = [(j, h) for j, h in compared if "tie" not in (j, h)]
    return {
        "pairs": len(results),
        "judged": sum(r.verdict is not None for r in results),
        "rules": sorted({r.rule for r in results}),
        "verdicts": dict(Counter(r.verdict or "none" for r in results)),
        "swap_consistency": mean(swapped) if swapped else None,
        "first_shown_wins": {order: first_shown_share(results, order) for order in ORDERS},
        "parse_failures": sum(j.parse_error is not None for j in judgements)
                          + sum(s.parse_error is not None for r in results for s in (r.scores or {}).values()),
        "agreement": {"with_ties": mean(j == h for j, h in compared) if compared else None, "n_with_ties": len(compared),
                      "without_ties": mean(j == h for j, h in decisive) if decisive else None, "n_without_ties": len(decisive)},
        "truncated": sum(any(j.truncated for j in r.forward + r.reverse) or any(s.truncated for s in (r.scores or {}).values()) for r in results),
        "skipped_invalid": [str(p) for p in skipped],
        **({"selective": selective_counts(records, people)} if records is not None else {}),
    }


def selective_counts(records: list[dict], people: dict[str, str | None]) -> dict:
    kept = [r for r in records if r.get("abstained") is False]
    compared = [r["verdict"] == people[r["id"]] for r in kept if people.get(r["id"]) is not None]
    return {"kept": len(kept), "abstained": len(records) - len(kept),
            "agreement_kept": mean(compared) if compared else None, "n_agreement_kept": len(compared)}


def first_shown_share(results: list[PairResult], order: str) -> dict:
    """How often the answer shown first won in one order, among the pairs whose verdict in that order (as
    their rule reads it) preferred one answer."""
    wins = [w for r in results if getattr(r, order) and (w := first_wins(order_verdict(getattr(r, order), r.rule), ORDERS[order])) is not None]
    return {"share": mean(wins) if wins else None, "n": len(wins)}


def format_pairs_summary(summary: dict) -> str:
    fmt = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
    verdicts = "  ".join(f"{v}: {n}" for v, n in sorted(summary["verdicts"].items()))
    first = summary["first_shown_wins"]
    agreement = summary["agreement"]
    lines = [
        f"Pairs: {summary['pairs']}  judged: {summary['judged']}  parse failures: {summary['parse_failures']}"
        f"  truncated: {summary['truncated']}  skipped (invalid): {len(summary['skipped_invalid'])}",
        f"Verdicts ({', '.join(summary['rules'])}): {verdicts}",
        f"Swap consistency: {fmt(summary['swap_consistency'])}  first shown wins: forward {fmt(first['forward']['share'])} "
        f"(n={first['forward']['n']}), reverse {fmt(first['reverse']['share'])} (n={first['reverse']['n']})",
    ]
    if agreement["n_with_ties"]:
        lines.append(f"Agreement with people: {fmt(agreement['with_ties'])} (n={agreement['n_with_ties']}, ties as a verdict), "
                     f"{fmt(agreement['without_ties'])} (n={agreement['n_without_ties']}, ties left out)")
    if (selective := summary.get("selective")) is not None:
        lines.append(f"Selective (--calibrator): {selective['kept']} kept, {selective['abstained']} abstained"
                     + (f"; kept verdicts agree with people {fmt(selective['agreement_kept'])} (n={selective['n_agreement_kept']})"
                        if selective["n_agreement_kept"] else ""))
    lines += [f"warning: {warning}" for warning in summary.get("warnings", [])]
    return "\n".join(lines)
