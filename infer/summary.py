"""The end-of-run summary: MMIE's figures (sample count, mean score overall and per category) plus
per criterion, per evaluated model, parse failures, truncations and skipped records, a warning when the
scores collapse onto one level, and with a calibrator its score sets and escalations."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from statistics import mean

from mmjudge.judge.calibrator import Calibrator
from mmjudge.judge.data import CRITERIA, JudgeResult, Problem
from mmjudge.judge.parsing import COLLAPSE_SHARE, SCORE_HEADING, ScoreScale

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
    }


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
    if summary["scored"] or not summary["samples"]:
        return []
    reasons = "; ".join(f"{n} x {reason}" for reason, n in summary.get("parse_errors", {}).items())
    return ["!" * 100,
            f"warning: NONE of the {summary['samples']} outputs parsed: no record has a score, and the mean score is undefined.",
            f"  why: {reasons}",
            "  Is the judge trained to write this rubric's format (an untrained or base model is not), and is --max_new_tokens long enough"
            " for its feedback? expected_score is still written where the judge's score distribution was read after a forced"
            f" '{SCORE_HEADING}' heading.",
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
