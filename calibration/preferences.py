"""judge-calibrate for preferences: how far a judge's verdicts on pairs agree with people's, how its verdicts
depend on the order it saw the answers in, and how it ranks the evaluated models. Pure numpy/scipy; no torch.

Inputs. A judge's verdicts: judge-score's eval_result.json of a pairwise run (PairResults: each order's
verdict as its rule reads it, the final one, the verdict distribution), an OpenING battle file of a judge's
winners (IntJudge's, GPT-4o's; one order), or `{id, verdict, model_a?, model_b?}` records. People's: a pairs
file (the toolkit's; several annotators a pair allowed, each once), `{id, preference, annotator?}` records,
or a benchmark's own file (VL-RewardBench's records, Multimodal RewardBench's all_data.json, an MMRB2 task
file, an OpenING battle file of people's winners), each read by its format's owner in judge/formats/. A
pair's people are the majority of its annotators who gave a preference, each once (a tie where they split).

Figures, each judge against people on the pairs both have a verdict for:
- accuracy with ties (A, B and tie as three verdicts) and without (the pairs either side calls a tie left
  out), each with a 95% percentile bootstrap interval over pairs; Cohen's kappa over A / B / tie; per group.
- position bias: in each order, how often the answer shown first wins among the verdicts that prefer one
  (0.5 is none), with a two-sided binomial test against 0.5; swap consistency: how often the two orders agree.
- win rates of each evaluated model under four tie rules (OpenING's): ties forced to the answer they lean to
  (the verdict distribution's likelier answer, or the file's Tie(A)/Tie(B); else A, as OpenING forces a plain
  tie), ties left out, a tie worth 0, a tie worth 0.5; the judge's and people's.
- a Bradley-Terry ranking of the evaluated models from the final verdicts (a tie half a win each), the
  judge's and people's, with 95% bootstrap intervals over pairs, and Kendall's tau between the two orders.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from scipy import stats as sps

from mmjudge.calibration.selective import SELECTIVE_ERROR_RATE, SelectiveReport, fit as fit_threshold, report as selective_report
from mmjudge.calibration.panel import PanelReport, fit_panel
from mmjudge.calibration.probes import PairFamilyPreference, pair_family_preference
from mmjudge.calibration.inputs import fitted_identity
from mmjudge.calibration.stats import BOOTSTRAP_CELLS, Interval, Stat, kendall, undefined
from mmjudge.judge.data import (VERDICTS, InputError, PairResult, Problem, Verdict, load_records, people_majority, repeated_preference, validation_problems,
                                verdict_of)
from mmjudge.judge.calibrator import UNCERTAINTIES, FittedOn, PairCalibrator, Selective, pair_confidence, preference_log_odds
from mmjudge.judge.formats import FORMATS
from mmjudge.judge.formats.base import Preference, first_record
from mmjudge.judge.preferences import ORDERS, first_wins, order_verdict
from mmjudge.judge.probes import FAMILY_MAX_GAP

TIE_RULES = {"forced": "ties forced to the answer they lean to", "excluded": "ties left out", "zero": "a tie worth 0", "half": "a tie worth 0.5"}
TIE_PRIOR = 0.1  # a tenth of a tie between every two models that met: a model that never wins keeps a finite strength
SHOWN_IDS = 5


@dataclass
class Judged:
    """One judge's verdicts on one pair."""

    verdict: str | None
    orders: dict[str, str | None] = field(default_factory=dict)  # the orders it was judged in -> that order's verdict
    lean: str | None = None  # the answer a tie leans to
    model_a: str | None = None
    model_b: str | None = None
    group: str | None = None
    distribution: dict[str, float] | None = None  # the verdict distribution, averaged over both orders where there are two
    judge_fingerprint: str | None = None  # which judge and rubric gave it (judge/identity.py), where the file says
    category: str | None = None
    rubric_fingerprint: str | None = None


@dataclass
class People:
    verdicts: list[str | None]  # one per annotator
    model_a: str | None = None
    model_b: str | None = None
    group: str | None = None

    @property
    def reference(self) -> str | None:
        return people_majority(self.verdicts)


class FlatVerdict(BaseModel):
    model_config = ConfigDict(extra="ignore", protected_namespaces=())  # model_a, model_b: a pair's fields, not pydantic's
    id: str | int
    verdict: Verdict | None
    model_a: str | None = None
    model_b: str | None = None
    group: str | None = None
    verdict_distribution: dict[str, float] | None = None

    @field_validator("verdict", mode="before")
    @classmethod
    def _normal(cls, value: object) -> object:
        return verdict_of(value)

    @field_validator("verdict_distribution")
    @classmethod
    def _probabilities(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value is not None and (set(value) - set(VERDICTS) or not all(0 <= p <= 1 for p in value.values())):
            raise ValueError(f"a verdict distribution maps {', '.join(VERDICTS)} to probabilities between 0 and 1, got {value}")
        return value


def _content(path: str) -> object:
    content, problems = load_records(path)  # a Parquet file's rows (VL-RewardBench's release), or JSON
    if problems:
        raise InputError(problems)
    return content


def _owner(content: object):
    """The format whose file of verdicts this is, or None."""
    return next((f for f in FORMATS.values() if f.read_preferences is not None and f.looks_like(content)), None)


def is_preference_file(path: str) -> bool:
    """Whether a predictions file holds verdicts on pairs (judge-calibrate then reports on preferences)."""
    try:
        content = _content(path)
    except InputError:
        return False
    record = first_record(content)
    # judge-score's PairResults; an OpenING battle file; records whose verdict is a word (A, B, tie): a number is a score's field
    return record is not None and ({"verdict", "rule"} <= set(record) or {"winner", "model_A"} <= set(record) or isinstance(record.get("verdict"), str))


def _lean(result: PairResult) -> str | None:
    distribution = result.verdict_distribution
    if result.verdict != "tie" or not distribution or distribution.get("A") == distribution.get("B"):
        return None
    return "A" if distribution["A"] > distribution["B"] else "B"


def read_judge(path: str) -> tuple[dict[str, Judged], list[Problem]]:
    content = _content(path)
    record = first_record(content)
    if record is not None and {"verdict", "rule"} <= set(record):  # judge-score's PairResults
        judged, problems = {}, []
        for index, raw in enumerate(content):
            try:
                r = PairResult.model_validate(raw)
            except ValidationError as err:
                problems += validation_problems(path, index, raw.get("id") if isinstance(raw, dict) else None, err)
                continue
            rule = r.rule if r.rule in ("agree", "mean_probability") else "agree"
            orders = {order: order_verdict(getattr(r, order), rule) for order in ORDERS if getattr(r, order)}
            judged[r.id] = Judged(r.verdict, orders, _lean(r), r.model_a, r.model_b, r.group or r.category, r.verdict_distribution,
                                  r.judge_fingerprint, r.category, r.rubric_fingerprint)
        return judged, problems
    owner = _owner(content)
    if owner is not None:  # an OpenING battle file of a judge's winners: the battle's own order
        found = owner.read_preferences(path, content)
        return {p.id: Judged(p.verdict, {"forward": p.verdict}, p.lean, p.model_a, p.model_b, p.group) for p in found.records}, found.problems
    judged, problems = {}, []
    if not isinstance(content, list):
        return {}, [Problem(path, "expected judge-score's eval_result.json of pairs, an OpenING battle file, or {id, verdict} records")]
    for index, raw in enumerate(content):
        try:
            r = FlatVerdict.model_validate(raw)
        except ValidationError as err:
            problems += validation_problems(path, index, raw.get("id") if isinstance(raw, dict) else None, err)
            continue
        judged[str(r.id)] = Judged(r.verdict, {}, None, r.model_a, r.model_b, r.group, r.verdict_distribution)
    return judged, problems


def read_people(path: str) -> tuple[dict[str, People], list[Problem]]:
    content = _content(path)
    found = (_owner(content) or FORMATS["pairs"]).read_preferences(path, content)
    people: dict[str, People] = {}
    seen: dict[tuple, str | None] = {}
    problems = list(found.problems)
    for p in found.records:
        key = (p.id, p.annotator)
        if key in seen:
            if seen[key] != p.verdict:
                problems.append(Problem(path, repeated_preference(p.annotator), record_id=p.id))
            continue
        seen[key] = p.verdict
        entry = people.setdefault(p.id, People([], p.model_a, p.model_b, p.group))
        entry.verdicts.append(p.verdict)
    if not found.records and not problems:
        problems.append(Problem(path, "no preferences"))
    return people, problems


# -- statistics ---------------------------------------------------------------------------------------

def share(hits: list[bool], resamples: int, seed: int) -> Stat:
    """The share of True, with a 95% percentile bootstrap interval over the items when asked."""
    if not hits:
        return undefined("no pairs")
    values = np.asarray(hits, dtype=float)
    interval = None
    if resamples:
        rng = np.random.default_rng(seed)
        chunk = max(1, BOOTSTRAP_CELLS // len(values))
        means = np.concatenate([values[rng.integers(0, len(values), size=(min(chunk, resamples - start), len(values)))].mean(1)
                                for start in range(0, resamples, chunk)])
        interval = Interval(low=float(np.percentile(means, 2.5)), high=float(np.percentile(means, 97.5)))
    return Stat(value=float(values.mean()), bootstrap_95=interval)


def cohen_kappa(judge: list[str], human: list[str]) -> Stat:
    """Cohen's kappa over the three verdicts A, B and tie (unweighted)."""
    if len(judge) < 3:
        return undefined(f"n = {len(judge)} < 3")
    observed = np.mean([j == h for j, h in zip(judge, human)])
    expected = sum(judge.count(v) * human.count(v) for v in VERDICTS) / len(judge) ** 2
    if expected == 1:
        return undefined("both sides give one verdict only: no agreement beyond chance to measure")
    return Stat(value=float((observed - expected) / (1 - expected)))


class PositionBias(BaseModel):
    n: int  # verdicts that prefer one answer
    first_wins: int
    share: float | None  # of the answer shown first winning; 0.5 is no bias
    p_value: float | None  # two-sided binomial test of share = 0.5


def position_bias(wins: list[bool]) -> PositionBias:
    if not wins:
        return PositionBias(n=0, first_wins=0, share=None, p_value=None)
    return PositionBias(n=len(wins), first_wins=sum(wins), share=sum(wins) / len(wins), p_value=float(sps.binomtest(sum(wins), len(wins)).pvalue))


def outcome(verdict: str, lean: str | None, rule: str) -> tuple[float, float] | None:
    """(score of A, score of B) of one battle under a tie rule; None where the rule leaves it out."""
    if verdict in ("A", "B"):
        return (1.0, 0.0) if verdict == "A" else (0.0, 1.0)
    return {"forced": (1.0, 0.0) if (lean or "A") == "A" else (0.0, 1.0), "excluded": None, "zero": (0.0, 0.0), "half": (0.5, 0.5)}[rule]


Battle = tuple[str, str, str, str | None]  # model A, model B, verdict, lean


def win_rates(battles: list[Battle], rule: str) -> dict[str, float]:
    """Each model's score per battle it counts in, best first (a model of no counted battle is left out)."""
    scored: dict[str, list[float]] = {}
    for a, b, verdict, lean in battles:
        if (points := outcome(verdict, lean, rule)) is not None:
            scored.setdefault(a, []).append(points[0])
            scored.setdefault(b, []).append(points[1])
    rates = {model: sum(points) / len(points) for model, points in scored.items()}
    return dict(sorted(rates.items(), key=lambda item: -item[1]))


def bradley_terry(first: np.ndarray, second: np.ndarray, points: np.ndarray, n_models: int) -> np.ndarray:
    """Log-strengths (mean 0) of the models, by Hunter's MM algorithm (2004) on the wins: battle k between
    models first[k] and second[k] scored points[k] for the first (1, 0 or 0.5 for a tie, which is half a win
    each), with TIE_PRIOR ties between every two models that met."""
    wins = np.zeros((n_models, n_models))
    np.add.at(wins, (first, second), points)
    np.add.at(wins, (second, first), 1 - points)
    met = (wins + wins.T) > 0
    wins += TIE_PRIOR / 2 * met
    games = wins + wins.T
    played = games.sum(1) > 0
    strength = np.ones(n_models)
    for _ in range(1000):
        updated = np.where(played, wins.sum(1) / np.maximum((games / (strength[:, None] + strength[None, :])).sum(1), 1e-300), 1.0)
        updated /= np.exp(np.log(updated).mean())
        converged = np.max(np.abs(np.log(updated) - np.log(strength))) < 1e-10
        strength = updated
        if converged:
            break
    return np.log(strength) - np.log(strength).mean()


class Strength(BaseModel):
    battles: int
    log_strength: float  # Bradley-Terry, natural log; 0 is the average model
    low: float | None  # 95% bootstrap interval
    high: float | None


class Ranking(BaseModel):
    models: dict[str, Strength]  # best first
    reason: str | None = None  # why there is none


def ranking(battles: list[Battle], resamples: int, seed: int) -> Ranking:
    models = sorted({m for a, b, _, _ in battles for m in (a, b)})
    if len(models) < 2:
        return Ranking(models={}, reason=f"{len(models)} evaluated model(s) named in pairs with a verdict; a ranking needs 2")
    index = {m: k for k, m in enumerate(models)}
    first, second = (np.array([index[battle[k]] for battle in battles]) for k in (0, 1))
    points = np.array([outcome(verdict, None, "half")[0] for _, _, verdict, _ in battles])
    point = bradley_terry(first, second, points, len(models))
    low = high = [None] * len(models)
    if resamples:
        rng = np.random.default_rng(seed)
        draws = []
        for _ in range(resamples):
            k = rng.integers(0, len(battles), len(battles))
            draws.append(bradley_terry(first[k], second[k], points[k], len(models)))
        low, high = np.percentile(draws, 2.5, axis=0).tolist(), np.percentile(draws, 97.5, axis=0).tolist()
    counts = Counter(m for a, b, _, _ in battles for m in (a, b))
    order = sorted(range(len(models)), key=lambda k: -point[k])
    return Ranking(models={models[k]: Strength(battles=counts[models[k]], log_strength=float(point[k]), low=low[k], high=high[k]) for k in order})


class GroupAgreement(BaseModel):
    n: int
    accuracy_with_ties: Stat
    accuracy_without_ties: Stat


class Coverage(BaseModel):
    predictions: str
    records: int
    shared_ids: int
    only_in_predictions: int
    only_in_human: int
    no_verdict: int  # shared pairs the judge gave no verdict (its output did not parse)
    first_ids_left_out: list[str]


class JudgeAgreement(BaseModel):
    coverage: Coverage
    n_with_ties: int
    accuracy_with_ties: Stat
    n_without_ties: int
    accuracy_without_ties: Stat
    kappa: Stat
    confusion: dict[str, dict[str, int]]  # people's verdict -> the judge's -> pairs
    groups: dict[str, GroupAgreement]
    position_bias: dict[str, PositionBias]  # forward, reverse, both
    swap_consistency: Stat  # over the pairs judged in both orders, each with a verdict
    win_rates: dict[str, dict[str, float]]  # tie rule -> model -> rate
    ranking: Ranking
    kendall_tau_with_people: Stat  # between the judge's and people's Bradley-Terry orders
    selective: SelectiveReport | None = None  # abstention: coverage and error among kept verdicts per risk level


class PreferenceReport(BaseModel):
    kind: str = "preferences"
    human_file: str
    human_pairs: int
    most_annotators: int
    group_by: str
    bootstrap: int
    seed: int
    tie_rules: dict[str, str] = TIE_RULES
    tie_prior: float = TIE_PRIOR
    notes: list[str]
    people_win_rates: dict[str, dict[str, float]]
    people_ranking: Ranking
    judges: dict[str, JudgeAgreement]
    panel: PanelReport | None = None
    family_preference: PairFamilyPreference | None = None  # --judge_family, of the first judge (family_of)
    family_of: str | None = None
    # What judge-calibrate writes beside the report for judge-score --calibrator: each judge's selective threshold
    # (calibrator.json: --calibrator_of's), the panel's and the panel's verdicts on every pair its members share.
    calibrators: dict[str, PairCalibrator] = Field(default_factory=dict, exclude=True)
    panel_calibrator: PairCalibrator | None = Field(default=None, exclude=True)
    panel_verdicts: list[dict] = Field(default_factory=list, exclude=True)


def _battles(items) -> list[Battle]:
    return [(x.model_a, x.model_b, verdict, lean) for x, verdict, lean in items if x.model_a and x.model_b and verdict is not None]


def judge_agreement(path: str, judged: dict[str, Judged], people: dict[str, People], group_by: str, resamples: int, seed: int,
                    people_ranking: Ranking) -> JudgeAgreement:
    shared = [rid for rid in judged if rid in people]
    compared = [(rid, judged[rid].verdict, people[rid].reference) for rid in shared
                if judged[rid].verdict is not None and people[rid].reference is not None]
    decisive = [(rid, j, h) for rid, j, h in compared if "tie" not in (j, h)]

    def accuracy(rows):
        return share([j == h for _, j, h in rows], resamples, seed)

    labels = {"category": lambda rid: judged[rid].group or people[rid].group or "unknown",
              "model": lambda rid: " vs ".join(sorted(filter(None, (judged[rid].model_a, judged[rid].model_b)))) or "unknown"}
    groups = {}
    if group_by != "none":
        for name in sorted({labels[group_by](rid) for rid, _, _ in compared}):
            rows = [row for row in compared if labels[group_by](row[0]) == name]
            groups[name] = GroupAgreement(n=len(rows), accuracy_with_ties=accuracy(rows),
                                          accuracy_without_ties=accuracy([r for r in rows if "tie" not in r[1:]]))
    bias = {order: [w for j in judged.values() if (w := first_wins(j.orders.get(order), first)) is not None] for order, first in ORDERS.items()}
    both = [j.orders["forward"] == j.orders["reverse"] for j in judged.values()
            if j.orders.get("forward") is not None and j.orders.get("reverse") is not None]
    battles = _battles((j, j.verdict, j.lean) for j in judged.values())
    judge_ranking = ranking(battles, resamples, seed)
    common = [m for m in judge_ranking.models if m in people_ranking.models]
    tau = (kendall(np.array([judge_ranking.models[m].log_strength for m in common]), np.array([people_ranking.models[m].log_strength for m in common]))
           if len(common) >= 3 else undefined(f"{len(common)} model(s) ranked by both; Kendall's tau needs 3"))
    left_out = sorted(set(judged) ^ set(people))
    return JudgeAgreement(
        coverage=Coverage(predictions=path, records=len(judged), shared_ids=len(shared), only_in_predictions=len(set(judged) - set(people)),
                          only_in_human=len(set(people) - set(judged)), no_verdict=sum(judged[rid].verdict is None for rid in shared),
                          first_ids_left_out=left_out[:SHOWN_IDS]),
        n_with_ties=len(compared), accuracy_with_ties=accuracy(compared), n_without_ties=len(decisive), accuracy_without_ties=accuracy(decisive),
        kappa=cohen_kappa([j for _, j, _ in compared], [h for _, _, h in compared]),
        confusion={h: {j: sum(1 for _, jj, hh in compared if (jj, hh) == (j, h)) for j in VERDICTS} for h in VERDICTS},
        groups=groups,
        position_bias={**{order: position_bias(wins) for order, wins in bias.items()}, "both": position_bias(bias["forward"] + bias["reverse"])},
        swap_consistency=share(both, resamples, seed) if both else undefined("no pair was judged in both orders with a verdict in each"),
        win_rates={rule: win_rates(battles, rule) for rule in TIE_RULES},
        ranking=judge_ranking, kendall_tau_with_people=tau,
    )


@dataclass(frozen=True)
class Selection:
    """How judge-calibrate fits abstention and panels on pairs (its flags)."""

    max_error: float = 0.1  # alpha
    uncertainty: str = UNCERTAINTIES[0]
    panel: bool = False
    folds: int = 5


def _labelled(judged: dict[str, Judged], people: dict[str, People], uncertainty: str) -> tuple[np.ndarray, np.ndarray]:
    """(confidence, correct) of the pairs with a verdict, a distribution and people's reference."""
    rows = [(c, judged[rid].verdict == people[rid].reference) for rid in judged if rid in people and people[rid].reference is not None
            and (c := pair_confidence(judged[rid].verdict, judged[rid].distribution, uncertainty)) is not None]
    return np.array([c for c, _ in rows], dtype=float), np.array([ok for _, ok in rows], dtype=bool)


def selective_fit(name: str, path: str, human_path: str, judged: dict[str, Judged], people: dict[str, People], selection: Selection,
                  seed: int) -> tuple[SelectiveReport, PairCalibrator]:
    confidence, correct = _labelled(judged, people, selection.uncertainty)
    found = selective_report(confidence, correct, selection.uncertainty, selection.max_error, selection.folds, seed)
    chosen = next(p for p in found.points if p.alpha == selection.max_error)
    judge_fingerprint, rubric_fingerprints = fitted_identity(judged)
    calibrator = PairCalibrator(selective=Selective(uncertainty=selection.uncertainty, max_error=selection.max_error, error_rate=found.delta,
                                                    threshold=chosen.threshold, n=found.n),
                                fitted_on=FittedOn(judge=name, predictions=path, human=human_path, n=found.n,
                                                   judge_fingerprint=judge_fingerprint, rubric_fingerprints=rubric_fingerprints))
    return found, calibrator


def panel_fit(judges: dict[str, tuple[str, dict[str, Judged]]], people: dict[str, People], human_path: str, selection: Selection,
              seed: int) -> tuple[PanelReport, PairCalibrator | None, list[dict]]:
    """The stacked panel of every judge (calibration/panel.py), its selective threshold fitted on its cross-fitted
    distributions, and its verdicts on every pair all members lean on (labelled or not)."""
    members = list(judges)
    shared = [rid for rid in judges[members[0]][1] if all(rid in judges[m][1] for m in members)]
    odds = {rid: [preference_log_odds(judges[m][1][rid].verdict, judges[m][1][rid].distribution) for m in members] for rid in shared}
    leaned = [rid for rid in shared if None not in odds[rid]]
    labelled = [rid for rid in leaned if rid in people and people[rid].reference in ("A", "B")]
    verdicts = np.array([[judges[m][1][rid].verdict or "none" for m in members] for rid in labelled]).reshape(len(labelled), len(members))
    panel, found, held_out = fit_panel(members, np.array([odds[rid] for rid in labelled]).reshape(len(labelled), len(members)), verdicts,
                                       np.array([people[rid].reference == "A" for rid in labelled], dtype=bool), selection.folds, seed)
    if panel is None:
        return found, None, []
    # The threshold reads held-out probabilities: the panel's own fit would make its labelled pairs look surer than new ones.
    distributions = [{"A": float(p), "B": float(1 - p), "tie": 0.0} for p in held_out]
    confidence = np.array([pair_confidence("A" if p >= 0.5 else "B", d, selection.uncertainty) for p, d in zip(held_out, distributions)])
    correct = (held_out >= 0.5) == np.array([people[rid].reference == "A" for rid in labelled])
    fit = fit_threshold(confidence, correct, selection.max_error)
    calibrator = PairCalibrator(panel=panel, selective=Selective(uncertainty=selection.uncertainty, max_error=selection.max_error,
                                                                 error_rate=SELECTIVE_ERROR_RATE, threshold=fit.threshold, n=len(labelled)),
                                fitted_on=FittedOn(judge="panel of " + ", ".join(members), human=human_path, n=len(labelled)))
    applied = panel.verdicts({m: {rid: (j.verdict, j.distribution) for rid, j in judges[m][1].items()} for m in members})
    records = [calibrator.apply({"id": rid, **applied[rid]}) for rid in leaned if rid in applied]
    return found, calibrator, records


def analyse(predictions: list[str], names: list[str], human_path: str, group_by: str, resamples: int, seed: int,
            selection: Selection = Selection(), judge_family: str | None = None, family_max_gap: float = FAMILY_MAX_GAP) -> PreferenceReport:
    """Every file read (one InputError for every problem of every file), then the report; with `judge_family`, the first
    judge's family preference (calibration/probes.py)."""
    try:
        people, problems = read_people(human_path)
    except InputError as err:
        people, problems = {}, err.problems
    judges = {}
    for name, path in zip(names, predictions):
        try:
            judged, found = read_judge(path)
        except InputError as err:
            problems += err.problems
            continue
        problems += found
        if people and judged and not set(judged) & set(people):
            problems.append(Problem(path, f"no pair id in common with {human_path} (first here: {sorted(judged)[:SHOWN_IDS]}; "
                                          f"there: {sorted(people)[:SHOWN_IDS]})"))
        judges[name] = (path, judged)
    if problems:
        raise InputError(problems)
    battles = _battles((p, p.reference, None) for p in people.values())
    people_ranking = ranking(battles, resamples, seed)
    report = {name: judge_agreement(path, judged, people, group_by, resamples, seed, people_ranking) for name, (path, judged) in judges.items()}
    calibrators = {}
    for name, (path, judged) in judges.items():
        report[name].selective, calibrator = selective_fit(name, path, human_path, judged, people, selection, seed)
        if report[name].selective.n:  # a file of verdicts without distributions (an OpenING battle file) has nothing to abstain by
            calibrators[name] = calibrator
    panel, panel_calibrator, panel_verdicts = panel_fit(judges, people, human_path, selection, seed) if selection.panel else (None, None, [])
    notes = []
    for name, agreement in report.items():
        c = agreement.coverage
        if c.only_in_predictions or c.only_in_human:
            notes.append(f"{name}: {c.only_in_predictions} pair(s) only in {c.predictions} and {c.only_in_human} only in {human_path}, left out "
                         f"(first: {', '.join(c.first_ids_left_out)})")
        if c.no_verdict:
            notes.append(f"{name}: {c.no_verdict} shared pair(s) without a verdict (the judge's output did not parse), left out")
    first = next(iter(judges), None)
    family = (pair_family_preference(judges[first][1], people, judge_family, family_max_gap, resamples, seed)
              if judge_family and first is not None else None)
    return PreferenceReport(human_file=human_path, human_pairs=len(people), most_annotators=max((len(p.verdicts) for p in people.values()), default=0),
                            group_by=group_by, bootstrap=resamples, seed=seed, notes=notes,
                            people_win_rates={rule: win_rates(battles, rule) for rule in TIE_RULES}, people_ranking=people_ranking, judges=report,
                            panel=panel, family_preference=family, family_of=first if family else None, calibrators=calibrators, panel_calibrator=panel_calibrator, panel_verdicts=panel_verdicts)
