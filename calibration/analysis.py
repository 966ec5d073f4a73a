"""Everything judge-calibrate measures, as one `Report`: for each judge and criterion, agreement overall
and per group, score collapse, system-level (per-model) agreement, score histograms and bias
diagnostics, and, where ids have several annotators, the human-human ceiling on the same ids; for each
judge the cross-fitted calibration of its overall score, with conformal score sets and the escalation
threshold where its records carry score distributions, and its benchmark scores per evaluated model
(PPI++, on every id it scored)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from pydantic import BaseModel

from mmjudge.calibration.benchmark import BenchmarkScores, ModelData, benchmark_scores
from mmjudge.calibration.conformal import (
    ESCALATION_ERROR_RATE,
    EscalationFit,
    HeldOutSets,
    escalation_threshold,
    fitted_threshold,
    held_out_sets,
    written_agreement,
)
from mmjudge.calibration.fit import Level, cross_fit, fit_map, reliability
from mmjudge.calibration.inputs import Coverage, HumanRecord, Ratings, fitted_identity
from mmjudge.calibration.probes import FamilyPreference
from mmjudge.judge.probes import ProbeEffect
from mmjudge.judge.parsing import ScoreScale
from mmjudge.calibration.stats import (
    Agreement,
    Stat,
    agreement_table,
    collapse_warning,
    correlation_ratio,
    kendall,
    krippendorff_alpha,
    mean_error,
    pearson,
    spearman,
    undefined,
)
from mmjudge.judge.calibrator import Calibrator, Escalation, FittedOn, ScoreSets, level_probabilities

REFERENCE = "the mean of the annotators' scores of each id"
CEILING = ("one pair per id that two or more annotators rated, among the ids the judge is compared on: one of its "
           "annotators, drawn at random (seeded), against the mean of the others. Each id counts once, so n and the "
           "intervals are those of independent pairs. The judge is compared with the mean of all annotators, a less noisy "
           "reference than the mean of the others, so a judge as good as one annotator scores somewhat above this ceiling")
MIN_MODELS = 3


@dataclass
class Options:
    """judge-calibrate's settings, each declared once, here, with its default: the keywords of
    `mmjudge.calibrate` and, under the same names (`--by` for group_by), judge-calibrate's flags."""

    criteria: list[str] | None = None  # None: every criterion some judge and the human file both scored on a shared id
    group_by: str = "category"  # "category", "model" or "none"
    bootstrap: int = 1000  # resamples for the intervals; 0: none
    seed: int = 0  # of the bootstrap, the calibration folds and the plot jitter
    fit: str = "isotonic"  # "isotonic", "linear" or "none"
    folds: int = 5  # cross-fitting folds for the held-out calibration errors
    scale: ScoreScale = field(default_factory=ScoreScale)  # MMIE's 0-6
    overall: str = "score"  # or "expected_score": which judge value the overall criterion compares
    coverage: float = 0.9  # of the conformal score sets
    target_agreement: float = 0.9  # of the records the judge may score alone
    agreement: str = "within_1"  # or "exact": what agreeing with people means for escalation


@dataclass
class Paired:
    """One judge x criterion, aligned on the ids both sides scored."""

    ids: list[str]
    judge: np.ndarray
    human: np.ndarray
    categories: list[str]
    models: list[str]
    answer_chars: list[int | None]
    n_images: list[int | None]

    def groups(self, group_by: str) -> dict[str, np.ndarray]:
        labels = {"category": self.categories, "model": self.models}.get(group_by, ["all"] * len(self.ids))
        return {g: np.array([i for i, x in enumerate(labels) if x == g], dtype=int) for g in sorted(set(labels))}


def paired(ratings: Ratings, judge: str, criterion: str, source: str = "score") -> Paired:
    """Pairs of (judge value, human reference); `source="expected_score"` reads the judge's expected score."""
    rows = []
    for rid, record in ratings.judges[judge].items():
        human = ratings.human.get(rid)
        value = record.expected_score if source == "expected_score" else record.scores.get(criterion)
        if human is None or value is None or human.mean(criterion) is None:
            continue
        n_images = human.n_images if human.n_images is not None else record.n_images
        rows.append((rid, value, human.mean(criterion), record.category or human.category or "unknown",
                     record.model or human.model or "unknown", human.answer_chars, n_images))
    ids, judge_values, human_values, categories, models, chars, images = map(list, zip(*rows)) if rows else ([],) * 7
    return Paired(ids, np.array(judge_values, dtype=float), np.array(human_values, dtype=float), categories, models, chars, images)


class ModelMeans(BaseModel):
    n: int
    judge_mean: float
    human_mean: float


class SystemLevel(BaseModel):
    """Per evaluated model, mean judge score vs mean human score: how a leaderboard would rank them."""

    models: dict[str, ModelMeans]
    pearson: Stat
    kendall_tau_b: Stat


def system_level(p: Paired) -> SystemLevel:
    names = sorted({m for m in p.models if m != "unknown"})
    models = {}
    for name in names:
        rows = np.array([i for i, m in enumerate(p.models) if m == name])
        models[name] = ModelMeans(n=len(rows), judge_mean=float(p.judge[rows].mean()), human_mean=float(p.human[rows].mean()))
    if len(names) < MIN_MODELS:
        reason = f"{len(names)} evaluated model(s) named in the inputs; system-level agreement needs {MIN_MODELS}"
        return SystemLevel(models=models, pearson=undefined(reason), kendall_tau_b=undefined(reason))
    j = np.array([m.judge_mean for m in models.values()])
    h = np.array([m.human_mean for m in models.values()])
    return SystemLevel(models=models, pearson=pearson(j, h), kendall_tau_b=kendall(j, h))


class Histogram(BaseModel):
    levels: list[float]
    judge: list[int]  # judge scores per level (each at its nearest level)
    human: list[int]  # human reference per level (mean of annotators, at its nearest level)


def histogram(p: Paired, scale: ScoreScale) -> Histogram:
    count = lambda v: [int(c) for c in np.bincount(scale.index(v), minlength=scale.n_levels)]
    return Histogram(levels=scale.levels, judge=count(p.judge), human=count(p.human))


class Correlation(BaseModel):
    n: int
    pearson: Stat
    spearman: Stat


class GroupResidual(BaseModel):
    n: int
    mean_residual: float


class Bias(BaseModel):
    """Does the judge's error (judge - human) follow answer length, image count or category?"""

    mean_residual: Stat
    residual_vs_answer_chars: Correlation
    residual_vs_n_images: Correlation
    residual_vs_category: Stat  # correlation ratio eta
    residual_by_category: dict[str, GroupResidual]


RESIDUALS = "the residuals (judge - human)"


def _residual_correlation(residual: np.ndarray, feature: list[int | None], name: str, missing: str) -> Correlation:
    """The residual's correlation with a feature of the answers (`name`: what its values are, for the reason a
    correlation is undefined)."""
    known = np.array([v is not None for v in feature], dtype=bool)
    if not known.any():
        return Correlation(n=0, pearson=undefined(missing), spearman=undefined(missing))
    values, sides = np.array([v for v in feature if v is not None], dtype=float), (name, RESIDUALS)
    return Correlation(n=int(known.sum()), pearson=pearson(values, residual[known], sides=sides), spearman=spearman(values, residual[known], sides=sides))


def bias(p: Paired) -> Bias:
    residual = p.judge - p.human
    by_category = {c: GroupResidual(n=len(i), mean_residual=float(residual[i].mean())) for c, i in p.groups("category").items()}
    return Bias(
        mean_residual=Stat(value=float(residual.mean())) if len(residual) else undefined("no pairs"),
        residual_vs_answer_chars=_residual_correlation(residual, p.answer_chars, "the answer lengths", "answer length unknown: the human file is not annotation records with answers"),
        residual_vs_n_images=_residual_correlation(residual, p.n_images, "the image counts", "image count unknown: neither the human file's answers nor the predictions' n_images give it"),
        residual_vs_category=correlation_ratio(residual, p.categories),
        residual_by_category=by_category,
    )


class Ceiling(BaseModel):
    """People against people on the ids the judge is compared on: the most a judge can be expected to reach."""

    ids: int  # ids compared with the judge that two or more annotators rated: one pair each
    most_annotators: int
    agreement: Agreement  # one annotator drawn per id against the mean of the others
    alpha_interval_all_annotators: Stat  # Krippendorff's alpha among every annotator of those ids, the usual inter-rater figure
    alpha_ordinal_all_annotators: Stat


DrawnPairs = dict[str, tuple[float, float]]  # id -> (one annotator's score, mean of the others)


def drawn_pairs(human: dict[str, HumanRecord], criterion: str, seed: int) -> DrawnPairs:
    """For each id rated two or more times, one annotator drawn at random against the mean of the others.
    Drawn once over every id (in sorted order), so an id's pair is the same whichever judge it is
    compared with; the generator is its own stream of the seed, not the bootstrap's."""
    rng = np.random.default_rng([seed, 1])
    pairs = {}
    for rid in sorted(human):
        values = human[rid].ratings.get(criterion, [])
        if len(values) >= 2:
            k = int(rng.integers(len(values)))
            pairs[rid] = (values[k], float(np.mean(values[:k] + values[k + 1:])))
    return pairs


def human_ceiling(ratings: Ratings, ids: list[str], pairs: DrawnPairs, criterion: str, scale: ScoreScale, bootstrap: int, seed: int) -> Ceiling:
    """The judge's statistics for the drawn pairs of the ids the judge is compared on."""
    shared = [rid for rid in ids if rid in pairs]
    one, others = [pairs[rid][0] for rid in shared], [pairs[rid][1] for rid in shared]
    rated = [ratings.human[rid].ratings[criterion] for rid in shared]
    most = max((len(v) for v in rated), default=0)
    matrix = np.full((max(most, 1), len(rated)), np.nan)  # annotator slot x id; alpha ignores who the coder is
    for unit, values in enumerate(rated):
        matrix[: len(values), unit] = values
    return Ceiling(ids=len(shared), most_annotators=most, agreement=agreement_table(one, others, scale, bootstrap, seed),
                   alpha_interval_all_annotators=krippendorff_alpha(matrix, "interval"),
                   alpha_ordinal_all_annotators=krippendorff_alpha(matrix, "ordinal"))


class CriterionResult(BaseModel):
    all: Agreement
    groups: dict[str, Agreement]
    collapse: str | None  # a warning when the judge's scores collapse onto one value
    system_level: SystemLevel
    histogram: Histogram
    bias: Bias
    ceiling: Ceiling


def criterion_result(p: Paired, opts: Options, ceiling: Ceiling) -> CriterionResult:
    stats = lambda rows: agreement_table(p.judge[rows], p.human[rows], opts.scale, opts.bootstrap, opts.seed)
    return CriterionResult(
        all=stats(np.arange(len(p.ids))),
        groups={g: stats(rows) for g, rows in p.groups(opts.group_by).items()} if opts.group_by != "none" else {},
        collapse=collapse_warning(p.judge, opts.scale),
        system_level=system_level(p),
        histogram=histogram(p, opts.scale),
        bias=bias(p),
        ceiling=ceiling,
    )


class ScoreSetsResult(BaseModel):
    """Conformal sets of score levels for the overall score, from the judge's score distributions."""

    coverage: float  # asked for
    n: int  # human-scored records with a distribution
    threshold: float | None  # fitted on all of them; what calibrator.json carries
    held_out: HeldOutSets | None  # fitted on K - 1 folds, measured on the remaining one
    reason: str | None = None  # why there is no threshold or no held-out figure


class EscalationResult(BaseModel):
    """The confidence above which the judge's written score may be trusted; the rest go to people."""

    agreement: str
    target_agreement: float
    error_rate: float
    fit: EscalationFit | None
    judged: int  # records of the predictions file with a score distribution
    escalated: int  # of them, below the threshold or unparsed
    reason: str | None = None


class Calibration(BaseModel):
    """The overall score mapped onto the human scale; errors before and after on held-out folds."""

    method: str
    source: str  # "expected_score" when every record has one (finer than the integer score), else "score"
    folds: int
    n: int
    mse_before: Stat
    mse_after: Stat
    mae_before: Stat
    mae_after: Stat
    reliability_before: list[Level]
    reliability_after: list[Level]  # of the held-out calibrated scores
    calibrator: Calibrator | None  # fitted on all pairs; also saved as calibrator.json
    score_sets: ScoreSetsResult | None = None
    escalation: EscalationResult | None = None


def _with_distributions(ratings: Ratings, judge: str, scale: ScoreScale) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The human-scored records with a score distribution: probabilities (records x levels), human level, written level
    (-1 for a null score)."""
    rows = [(r.score_distribution, ratings.human[rid].mean("overall"), r.written_score) for rid, r in ratings.judges[judge].items()
            if r.score_distribution is not None and rid in ratings.human and ratings.human[rid].mean("overall") is not None]
    if not rows:
        return np.zeros((0, scale.n_levels)), np.zeros(0, dtype=int), np.zeros(0, dtype=int)
    distributions, human, written = zip(*rows)
    written_levels = np.array([-1 if w is None else scale.index(np.array([w]))[0] for w in written])
    return np.array([level_probabilities(d, *scale.bounds) for d in distributions]), scale.index(np.array(human)), written_levels


def score_sets(probabilities: np.ndarray, human_levels: np.ndarray, opts: Options) -> ScoreSetsResult:
    if len(human_levels) == 0:
        return ScoreSetsResult(coverage=opts.coverage, n=0, threshold=None, held_out=None,
                               reason="no human-scored record has a score_distribution (judge-score writes one on scales of whole numbers)")
    held_out = held_out_sets(probabilities, human_levels, opts.coverage, opts.folds, opts.seed)
    return ScoreSetsResult(coverage=opts.coverage, n=len(human_levels), threshold=fitted_threshold(probabilities, human_levels, opts.coverage),
                           held_out=held_out, reason=None if held_out else f"n = {len(human_levels)} is too small for {opts.folds} folds")


def escalation(probabilities: np.ndarray, human_levels: np.ndarray, written_levels: np.ndarray, opts: Options) -> EscalationResult:
    """Fitted on the human-scored records with a written score (a null one is always escalated)."""
    scored = written_levels >= 0
    result = EscalationResult(agreement=opts.agreement, target_agreement=opts.target_agreement, error_rate=ESCALATION_ERROR_RATE, fit=None,
                              judged=0, escalated=0)
    if not scored.any():
        result.reason = "no human-scored record has both a written score and a score_distribution"
        return result
    result.fit = escalation_threshold(*written_agreement(probabilities[scored], written_levels[scored], human_levels[scored], opts.agreement),
                                      opts.target_agreement, ESCALATION_ERROR_RATE)
    return result


def calibrate(ratings: Ratings, judge: str, opts: Options, human_path: str) -> Calibration:
    scored = [r for r in ratings.judges[judge].values() if "overall" in r.scores]
    source = "expected_score" if scored and all(r.expected_score is not None for r in scored) else "score"
    p = paired(ratings, judge, "overall", source)
    held_out = cross_fit(p.judge, p.human, opts.fit, opts.folds, opts.seed, opts.scale.bounds)
    after = (lambda kind: mean_error(held_out.calibrated, p.human, kind)) if held_out.reason is None else (lambda kind: undefined(held_out.reason))
    calibrator = None
    if len(p.ids) >= 2:
        xs, ys = fit_map(p.judge, p.human, opts.fit, opts.scale.bounds)
        judge_fingerprint, rubric_fingerprints = fitted_identity(ratings.judges[judge])
        fitted_on = FittedOn(judge=judge, predictions=ratings.coverage[judge].predictions, human=human_path, n=len(p.ids), folds=opts.folds,
                             mse_before=mean_error(p.judge, p.human, "mse").value, held_out_mse_after=after("mse").value,
                             judge_fingerprint=judge_fingerprint, rubric_fingerprints=rubric_fingerprints)
        calibrator = Calibrator(method=opts.fit, source=source, x=xs, y=ys, scale=opts.scale.bounds, fitted_on=fitted_on)
    probabilities, human_levels, written_levels = _with_distributions(ratings, judge, opts.scale)
    sets, escalating = score_sets(probabilities, human_levels, opts), escalation(probabilities, human_levels, written_levels, opts)
    if calibrator is not None and sets.threshold is not None:
        calibrator.score_sets = ScoreSets(coverage=opts.coverage, threshold=sets.threshold, n=sets.n,
                                          held_out_coverage=sets.held_out.coverage if sets.held_out else None,
                                          held_out_mean_size=sets.held_out.mean_size if sets.held_out else None)
    if calibrator is not None and escalating.fit is not None:
        calibrator.escalation = Escalation(agreement=opts.agreement, target_agreement=opts.target_agreement, error_rate=ESCALATION_ERROR_RATE,
                                           threshold=escalating.fit.threshold, n=escalating.fit.n)
        # what judge-score --calibrator would do with this predictions file's records
        decisions = [calibrator.escalate(r.written_score, r.score_distribution) for r in ratings.judges[judge].values() if r.score_distribution]
        escalating.judged, escalating.escalated = len(decisions), sum(decisions)
    return Calibration(
        method=opts.fit, source=source, folds=opts.folds, n=len(p.ids),
        mse_before=mean_error(p.judge, p.human, "mse"), mse_after=after("mse"),
        mae_before=mean_error(p.judge, p.human, "mae"), mae_after=after("mae"),
        reliability_before=reliability(p.judge, p.human, opts.scale),
        reliability_after=reliability(held_out.calibrated, p.human, opts.scale) if held_out.reason is None else [],
        calibrator=calibrator,
        score_sets=sets,
        escalation=escalating,
    )


class JudgeReport(BaseModel):
    coverage: Coverage
    criteria: dict[str, CriterionResult]
    calibration: Calibration | None  # None with --fit none or without an overall score
    benchmark: BenchmarkScores | None = None  # None without the overall criterion


def model_data(ratings: Ratings, judge: str) -> ModelData:
    """Per evaluated model, (human, judge) of the ids with both overall scores and the judge's overall score of the
    ids with no human one: every id the judge scored counts."""
    rows: dict[str, tuple[list, list, list]] = {}
    for rid, record in ratings.judges[judge].items():
        value = record.scores.get("overall")
        if value is None:
            continue
        human = ratings.human.get(rid)
        model = record.model or (human.model if human else None) or "unknown"
        human_value = human.mean("overall") if human else None
        labelled, judged, judge_only = rows.setdefault(model, ([], [], []))
        if human_value is None:
            judge_only.append(value)
        else:
            labelled.append(human_value)
            judged.append(value)
    return {m: tuple(np.array(v, dtype=float) for v in values) for m, values in rows.items()}


class Report(BaseModel):
    """Everything judge-calibrate measured (the module docstring), as report.json holds it and
    `mmjudge.calibrate` returns it: per judge (`judges[name]`), its coverage of the human ids, per criterion
    the agreement tables (`criteria[c].all`, and per group), its calibration and benchmark scores."""

    scale: tuple[float, float]  # [low, high], as before --step existed, so that readers of report.json keep working
    step: float
    criteria: list[str]
    group_by: str
    bootstrap: int
    seed: int
    human_file: str
    human_ids: int
    overall: str  # the judge's value for the overall criterion: "score" (as written) or "expected_score"
    reference: str = REFERENCE
    ceiling_method: str = CEILING
    notes: list[str]
    judges: dict[str, JudgeReport]
    fit: str  # --fit
    calibrator_of: str | None = None  # the judge whose map is calibrator.json; None: no calibrator.json was written
    removed_calibrators: list[str] = []  # calibrator files of an earlier run in --output_dir, removed
    probes: dict[str, ProbeEffect] = {}  # --probes: the bias suite's effects on the first judge, by probe
    probes_of: str | None = None  # that judge
    family_preference: FamilyPreference | None = None  # --judge_family, of the first judge

    @property
    def score_scale(self) -> ScoreScale:
        return ScoreScale(*self.scale, self.step)


def analyse(ratings: Ratings, opts: Options, human_path: str, notes: list[str]) -> tuple[Report, dict[str, Paired]]:
    """The report, and each judge's overall pairs for the plots."""
    judges, plotted = {}, {}
    drawn = {c: drawn_pairs(ratings.human, c, opts.seed) for c in opts.criteria}
    for name in ratings.judges:
        pairs = {c: paired(ratings, name, c) for c in opts.criteria}
        calibration = calibrate(ratings, name, opts, human_path) if opts.fit != "none" and "overall" in pairs and pairs["overall"].ids else None
        if "overall" in pairs and pairs["overall"].ids:  # a judge without an overall score on a shared id has nothing to draw
            plotted[name] = pairs["overall"]
        criteria = {c: criterion_result(p, opts, human_ceiling(ratings, p.ids, drawn[c], c, opts.scale, opts.bootstrap, opts.seed))
                    for c, p in pairs.items()}
        benchmark = benchmark_scores(model_data(ratings, name), "overall", opts.bootstrap, opts.seed) if "overall" in opts.criteria else None
        judges[name] = JudgeReport(coverage=ratings.coverage[name], criteria=criteria, calibration=calibration, benchmark=benchmark)
    report = Report(
        scale=opts.scale.bounds, step=opts.scale.step, criteria=opts.criteria, group_by=opts.group_by, bootstrap=opts.bootstrap, seed=opts.seed,
        human_file=human_path, human_ids=len(ratings.human), overall=opts.overall, notes=notes, judges=judges, fit=opts.fit,
    )
    return report, plotted
