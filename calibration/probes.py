"""judge-calibrate --probes: the bias suite's effects (judge/probes.py) from judge-score's probe_<kind>.json files,
each against the judge's own scores of the unperturbed samples (the first --predictions file). No human score is
needed; the report gives each probe's mean shift and share changed with 95% bootstrap intervals and its gate.
Imports no torch."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from pydantic import BaseModel

from mmjudge.calibration.inputs import HumanRecord, JudgeRecord, read_predictions
from mmjudge.judge.data import InputError, Problem, UsageError
from mmjudge.judge.parsing import ScoreScale
from mmjudge.judge.probes import PROBES, ProbeEffect, Share, mean_with_interval, probe_effect

PROBE_FILE = re.compile(r"probe_(\w+)\.json")


def probe_kind(path: str | Path) -> str:
    """The probe a judge-score probe file holds, from its name (probe_<kind>.json)."""
    match = PROBE_FILE.fullmatch(Path(path).name)
    if not match or match.group(1) not in PROBES:
        raise UsageError(f"--probes {path}: not a judge-score probe file; they are named probe_<kind>.json, kind one of {', '.join(PROBES)}")
    return match.group(1)


def _value(record: JudgeRecord, overall: str) -> float | None:
    return record.expected_score if overall == "expected_score" else record.scores.get("overall")


def probe_effects(original: dict[str, JudgeRecord], paths: list[str], scale: ScoreScale, overall: str, threshold: float, max_shift: float,
                  resamples: int, seed: int) -> dict[str, ProbeEffect]:
    """Each probe file's effect on the samples scored (a value in --overall's field) in both it and the original run."""
    kinds = [probe_kind(path) for path in paths]
    if len(set(kinds)) != len(kinds):
        raise UsageError(f"--probes {' '.join(map(str, paths))}: one file per probe, each once")
    effects, problems = {}, []
    for kind, path in zip(kinds, paths):
        found = read_predictions(str(path), scale)
        problems += found.problems
        pairs = [(a, b) for rid, r in found.records.items() if rid in original
                 and (a := _value(original[rid], overall)) is not None and (b := _value(r, overall)) is not None]
        if not problems and found.records and not set(found.records) & set(original):
            problems.append(Problem(str(path), "no id in common with the first --predictions file: probe files go with the run that wrote them"))
        before, after = np.array([a for a, _ in pairs]), np.array([b for _, b in pairs])
        effects[kind] = probe_effect(kind, before, after, scale.index(before) if pairs else before, scale.index(after) if pairs else after,
                                     threshold, max_shift, resamples, seed)
    if problems:
        raise InputError(problems)
    return effects


class FamilyPreference(BaseModel):
    """Self- and family-preference (arXiv 2604.11589): does the judge score its own family's answers higher than people
    do, beside other models' answers? Residual = judge − people's mean, on the ids both scored."""

    family: str  # matched, case-insensitively, inside each answer's model name
    models: list[str]  # the models that matched
    n_family: int
    n_other: int
    residual_family: float | None
    residual_other: float | None
    difference: Share | None  # family minus other, with a 95% bootstrap interval (each group resampled on its own)
    gate: str
    passed: bool | None  # None: a group without ids
    reason: str | None = None


def family_preference(judged: dict[str, JudgeRecord], human: dict[str, HumanRecord], family: str, overall: str, max_shift: float,
                      resamples: int, seed: int) -> FamilyPreference:
    rows = [(model, value - reference) for rid, r in judged.items() if rid in human
            and (model := r.model or human[rid].model) is not None and (value := _value(r, overall)) is not None
            and (reference := human[rid].mean("overall")) is not None]
    mine = np.array([res for model, res in rows if family.lower() in model.lower()])
    others = np.array([res for model, res in rows if family.lower() not in model.lower()])
    gate = f"passes where the judge's residual on its family's answers exceeds the others' by at most {max_shift:g} levels"
    common = dict(family=family, models=sorted({m for m, _ in rows if family.lower() in m.lower()}), n_family=len(mine), n_other=len(others),
                  gate=gate)
    if not len(mine) or not len(others):
        return FamilyPreference(**common, residual_family=None, residual_other=None, difference=None, passed=None,
                                reason=f"{len(mine)} scored answer(s) by a model named like {family!r} and {len(others)} by others; both are needed")
    rng = np.random.default_rng(seed)
    draws = [mine[rng.integers(0, len(mine), len(mine))].mean() - others[rng.integers(0, len(others), len(others))].mean()
             for _ in range(resamples)] or [mine.mean() - others.mean()]
    difference = Share(value=float(mine.mean() - others.mean()), low=float(np.percentile(draws, 2.5)), high=float(np.percentile(draws, 97.5)))
    return FamilyPreference(**common, residual_family=float(mine.mean()), residual_other=float(others.mean()), difference=difference,
                            passed=difference.value <= max_shift)


class PairFamilyPreference(BaseModel):
    """Self- and family-preference on pairs (arXiv 2604.11589's own setting): on the pairs where one answer is by a model of
    the judge's family and the other is not, how often the judge picks the family's answer beside how often people do."""

    family: str
    models: list[str]  # the models that matched
    n: int  # pairs with one family answer, a verdict and people's reference verdict
    judge_share: float | None  # of them, the judge picks the family's answer (a tie counts half)
    people_share: float | None
    difference: Share | None  # judge minus people, with a 95% bootstrap interval over the pairs
    gate: str
    passed: bool | None  # None: no such pair
    reason: str | None = None


def _picks(verdict: str, family_side: str) -> float:
    return 0.5 if verdict == "tie" else float(verdict == family_side)


def pair_family_preference(judged: dict, people: dict, family: str, max_gap: float, resamples: int, seed: int) -> PairFamilyPreference:
    """`judged`: {id: Judged} of one judge, `people`: {id: People} (calibration/preferences.py); a pair's models are the
    judge's record's, else people's."""
    matches = lambda model: model is not None and family.lower() in model.lower()  # noqa: E731
    rows, models = [], set()
    for rid, j in judged.items():
        if rid not in people or j.verdict is None or (reference := people[rid].reference) is None:
            continue
        a, b = j.model_a or people[rid].model_a, j.model_b or people[rid].model_b
        if matches(a) == matches(b):  # both answers the family's, or neither: nothing to prefer
            continue
        side = "A" if matches(a) else "B"
        models.add(a if side == "A" else b)
        rows.append((_picks(j.verdict, side), _picks(reference, side)))
    gate = f"passes where the judge picks its family's answer at most {max_gap:g} more often than people do"
    common = dict(family=family, models=sorted(models), n=len(rows), gate=gate)
    if not rows:
        return PairFamilyPreference(**common, judge_share=None, people_share=None, difference=None, passed=None,
                                    reason=f"no pair with one answer by a model named like {family!r} and one by another, judged and labelled")
    mine, theirs = np.array(rows).T
    difference = mean_with_interval(mine - theirs, resamples, seed)
    return PairFamilyPreference(**common, judge_share=float(mine.mean()), people_share=float(theirs.mean()), difference=difference,
                                passed=difference.value <= max_gap)
