"""Everything judge-calibrate measures, for each judge: agreement per criterion and group, system-level
ranking agreement, calibration, bias diagnostics, and the human-human ceiling."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from calibration.fit import calibrator, cross_fit, reliability
from calibration.inputs import Ratings
from calibration.stats import Stat, agreement_table, collapse_warning, kendall, krippendorff_alpha, pearson, undefined
from judge.calibrator import Calibrator


@dataclass
class Options:
    criteria: list[str]
    group_by: str  # "category", "model" or "none"
    bootstrap: int
    seed: int
    fit: str  # "isotonic", "linear" or "none"
    folds: int
    scale: tuple[float, float]


@dataclass
class Paired:
    """One judge x criterion, aligned on ids both sides scored."""

    ids: list[str]
    judge: np.ndarray
    human: np.ndarray
    groups: list[str]


def paired(ratings: Ratings, judge: str, criterion: str, group_by: str, use_expected: bool = False) -> Paired:
    ids, j, h, groups = [], [], [], []
    for rid, record in ratings.judges[judge].items():
        human = ratings.human.get(rid)
        value = record.expected_score if use_expected and criterion == "overall" else record.scores.get(criterion)
        if human is None or value is None or human.mean(criterion) is None:
            continue
        ids.append(rid)
        j.append(value)
        h.append(human.mean(criterion))
        group = {"category": record.category or human.category, "model": record.model or human.model}.get(group_by)
        groups.append(str(group) if group is not None else "all")
    return Paired(ids, np.array(j, dtype=float), np.array(h, dtype=float), groups)


def _json(table: dict[str, Stat]) -> dict:
    return {name: stat.to_json() for name, stat in table.items()}


def system_level(ratings: Ratings, judge: str, criterion: str) -> dict:
    """Per evaluated model: mean judge score vs mean human score, as leaderboards rank models."""
    by_model: dict[str, tuple[list, list]] = {}
    for rid, record in ratings.judges[judge].items():
        human = ratings.human.get(rid)
        model = record.model or (human.model if human else None)
        if human is None or model is None or record.scores.get(criterion) is None or human.mean(criterion) is None:
            continue
        by_model.setdefault(model, ([], []))[0].append(record.scores[criterion])
        by_model[model][1].append(human.mean(criterion))
    models = sorted(by_model)
    j = np.array([np.mean(by_model[m][0]) for m in models])
    h = np.array([np.mean(by_model[m][1]) for m in models])
    return {"models": {m: {"judge_mean": float(a), "human_mean": float(b)} for m, a, b in zip(models, j, h)},
            "pearson": pearson(j, h).to_json(), "kendall_tau_b": kendall(j, h).to_json()}


def bias(ratings: Ratings, judge: str, p: Paired) -> dict:
    """Does the judge's error (judge - human) grow with answer length or image count, or differ by category?"""
    residual = p.judge - p.human
    features = {
        "answer_chars": [ratings.human[i].answer_chars for i in p.ids],
        "n_images": [ratings.human[i].n_images if ratings.human[i].n_images is not None else ratings.judges[judge][i].n_images for i in p.ids],
    }
    out = {}
    for name, values in features.items():
        known = all(v is not None for v in values)
        stat = pearson(np.array(values, dtype=float), residual) if known else undefined(f"{name} is unknown for some ids (no answer in the human file)")
        out[f"residual_vs_{name}"] = stat.to_json()
    by_category: dict[str, list[float]] = {}
    for rid, r in zip(p.ids, residual):
        by_category.setdefault(ratings.human[rid].category or ratings.judges[judge][rid].category or "unknown", []).append(r)
    out["mean_residual_by_category"] = {c: float(np.mean(v)) for c, v in sorted(by_category.items())}
    return out


def human_ceiling(ratings: Ratings, criterion: str, scale) -> dict:
    """Agreement of one annotator with the mean of the others, on ids rated more than once; and
    Krippendorff's alpha over all annotators. The judge can hardly be expected to do better."""
    first, rest, matrix_rows = [], [], {}
    for rid, record in ratings.human.items():
        values = record.ratings.get(criterion, [])
        if len(values) >= 2:
            first.append(values[0])
            rest.append(np.mean(values[1:]))
        for k, v in enumerate(values):
            matrix_rows.setdefault(k, {})[rid] = v
    if len(first) < 3:
        return {"undefined": f"{len(first)} id(s) rated by two or more annotators; need 3"}
    ids = sorted(ratings.human)
    matrix = np.array([[row.get(i, np.nan) for i in ids] for row in matrix_rows.values()])
    table = agreement_table(first, rest, scale)
    table["krippendorff_interval"] = krippendorff_alpha(matrix, "interval")
    table["krippendorff_ordinal"] = krippendorff_alpha(matrix, "ordinal")
    return _json(table)


def calibrate(ratings: Ratings, judge: str, opts: Options) -> tuple[dict, Calibrator | None, dict]:
    """Cross-fitted calibration of the overall score (expected score when every record has one)."""
    scored = [r for r in ratings.judges[judge].values() if r.scores.get("overall") is not None]
    use_expected = bool(scored) and all(r.expected_score is not None for r in scored)
    p = paired(ratings, judge, "overall", "none", use_expected)
    source = "expected_score" if use_expected else "score"
    result = cross_fit(p.judge, p.human, opts.fit, opts.folds, opts.seed, opts.scale)
    arrays = {"judge": p.judge, "human": p.human, "calibrated": result.pop("calibrated", None)}
    report = {"source": source, **result, "reliability_before": reliability(p.judge, p.human)}
    if arrays["calibrated"] is not None:
        report["reliability_after"] = reliability(arrays["calibrated"], p.human)
    cal = calibrator(p.judge, p.human, opts.fit, source, "overall", opts.scale) if len(p.judge) >= 2 else None
    return report, cal, arrays


def analyse(ratings: Ratings, opts: Options) -> tuple[dict, dict, dict]:
    """(report, calibrators by judge, arrays for plots by judge)."""
    report = {"scale": list(opts.scale), "criteria": opts.criteria, "group_by": opts.group_by, "notes": ratings.notes,
              "bootstrap": opts.bootstrap, "seed": opts.seed, "judges": {}, "human_ceiling": {}}
    calibrators, arrays = {}, {}
    for name in ratings.judges:
        judge_report, judge_arrays = {"criteria": {}, "collapse": {}}, {}
        for criterion in opts.criteria:
            p = paired(ratings, name, criterion, opts.group_by)
            if len(p.ids) == 0:
                judge_report["criteria"][criterion] = {"undefined": "no pairs with both a judge and a human score"}
                continue
            groups = {g: [i for i, x in enumerate(p.groups) if x == g] for g in sorted(set(p.groups))}
            judge_report["criteria"][criterion] = {
                "all": _json(agreement_table(p.judge, p.human, opts.scale, opts.bootstrap, opts.seed)),
                "groups": {g: _json(agreement_table(p.judge[i], p.human[i], opts.scale, opts.bootstrap, opts.seed)) for g, i in groups.items()},
            }
            judge_report["collapse"][criterion] = collapse_warning(p.judge, opts.scale)
            judge_arrays[criterion] = p
        if "overall" in judge_arrays:
            judge_report["system_level"] = system_level(ratings, name, "overall")
            judge_report["bias"] = bias(ratings, name, judge_arrays["overall"])
            if opts.fit != "none":
                judge_report["calibration"], calibrators[name], judge_arrays["calibration"] = calibrate(ratings, name, opts)
        report["judges"][name] = judge_report
        arrays[name] = judge_arrays
    for criterion in opts.criteria:
        report["human_ceiling"][criterion] = human_ceiling(ratings, criterion, opts.scale)
    return report, calibrators, arrays
