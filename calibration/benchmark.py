"""Benchmark scores per evaluated model from a few human scores and many judge scores: prediction-powered
inference with power tuning (PPI++; Angelopoulos, Duchi & Zrnic 2023, "PPI++: Efficient Prediction-Powered
Inference"). Pure numpy; no torch.

For one model, n ids have a human score Y and a judge score f; N more have a judge score only. The estimate
of the model's mean human score is

    theta = lam * mean(f over the N) + mean(Y - lam * f over the n)

which is unbiased for any lam whatever the judge's errors, provided the n human-scored ids are a random
draw from the model's ids. Its variance is lam^2 Var(f) / N + Var(Y - lam f) / n; the lam that minimises
it, Cov(Y, f) / ((1 + n / N) Var(f)), is estimated from the data and kept in [0, 1] (0 is the human-only
mean, 1 plain PPI), as the authors' ppi_py does. The 95% interval is normal. Beside it: the judge-only mean
(all the model's judged ids; its interval is narrow, and centred on the judge's bias) and the human-only
mean (the n ids; valid and wide).

The ranking of the models by their PPI++ estimates is checked by a bootstrap that redraws each model's
human-scored and judge-only ids (lam estimated again each time): how often the whole order holds, and how
often each model stays above the next.
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel

from mmjudge.calibration.stats import BOOTSTRAP_CELLS, Z95


class Estimate(BaseModel):
    """A mean with its 95% interval, or none and the reason."""

    value: float | None
    low: float | None = None
    high: float | None = None
    reason: str | None = None


def _estimate(value: float, se: float) -> Estimate:
    return Estimate(value=value, low=value - Z95 * se, high=value + Z95 * se)


def ppi_mean(human: np.ndarray, judged: np.ndarray, judge_only: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """PPI++ (estimate, standard error, lam) of each row: human and judged are the n human-scored ids'
    scores (rows x n), judge_only the judge's scores of the N other ids (rows x N, N may be 0)."""
    n, big_n = human.shape[1], judge_only.shape[1]
    if big_n == 0:  # nothing to add: the human-only mean
        lam = np.zeros(len(human))
    else:
        everything = np.concatenate([judged, judge_only], axis=1)
        variance = everything.var(axis=1, ddof=1)
        covariance = ((human - human.mean(1, keepdims=True)) * (judged - judged.mean(1, keepdims=True))).mean(1)
        with np.errstate(divide="ignore", invalid="ignore"):  # a constant judge: no covariance to use
            lam = np.where(variance > 0, covariance / ((1 + n / big_n) * variance), 0.0)
        lam = np.clip(lam, 0, 1)
    rectifier = human - lam[:, None] * judged
    value = rectifier.mean(1) + (lam * judge_only.mean(1) if big_n else 0)
    variance = rectifier.var(1) / n + (lam**2 * judge_only.var(1) / big_n if big_n else 0)
    return value, np.sqrt(variance), lam


def mean_estimate(values: np.ndarray, who: str) -> Estimate:
    if len(values) < 2:
        return Estimate(value=None, reason=f"{len(values)} {who} score(s); need 2")
    return _estimate(float(values.mean()), float(values.std() / np.sqrt(len(values))))


class ModelScore(BaseModel):
    human_scored: int  # ids with a human and a judge score
    judge_only_ids: int  # ids with a judge score only
    ppi: Estimate
    lam: float | None  # the power tuning: 0 is the human-only mean, 1 plain PPI
    judge_only: Estimate  # the judge's mean over all the model's judged ids
    human_only: Estimate  # the human mean over the human-scored ids
    # Human labels alone that would give an interval as narrow as PPI++'s (Var(Y) / its variance)
    effective_labels: float | None


def model_score(human: np.ndarray, judged: np.ndarray, judge_only: np.ndarray) -> ModelScore:
    everything = np.concatenate([judged, judge_only])
    score = ModelScore(human_scored=len(human), judge_only_ids=len(judge_only), ppi=Estimate(value=None), lam=None,
                       judge_only=mean_estimate(everything, "judge"), human_only=mean_estimate(human, "human"), effective_labels=None)
    if len(human) < 2:
        score.ppi = Estimate(value=None, reason=f"{len(human)} human-scored id(s); PPI++ needs 2")
        return score
    value, se, lam = (float(v[0]) for v in ppi_mean(human[None], judged[None], judge_only[None]))
    score.ppi, score.lam = _estimate(value, se), lam
    score.effective_labels = float(human.var() / se**2) if se > 0 else None
    return score


class Ranking(BaseModel):
    order: list[str]  # best first, by the PPI++ estimate
    resamples: int
    holds: float | None  # share of bootstrap resamples with the same whole order
    above_next: list[float]  # share in which each model stays above the one after it
    reason: str | None = None


def _resampled_estimates(human, judged, judge_only, resamples: int, rng: np.random.Generator) -> np.ndarray:
    n, big_n = len(human), len(judge_only)
    chunk = max(1, BOOTSTRAP_CELLS // (n + big_n))
    out = []
    for start in range(0, resamples, chunk):
        rows = min(chunk, resamples - start)
        labelled = rng.integers(0, n, size=(rows, n))
        others = rng.integers(0, big_n, size=(rows, big_n)) if big_n else np.zeros((rows, 0), dtype=int)
        out.append(ppi_mean(human[labelled], judged[labelled], judge_only[others])[0])
    return np.concatenate(out)


def ranking(data: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]], scores: dict[str, ModelScore], resamples: int, seed: int) -> Ranking:
    ranked = [m for m in scores if scores[m].ppi.value is not None]
    order = sorted(ranked, key=lambda m: -scores[m].ppi.value)
    if len(order) < 2:
        return Ranking(order=order, resamples=0, holds=None, above_next=[], reason=f"{len(order)} model(s) with an estimate; a ranking needs 2")
    if resamples == 0:
        return Ranking(order=order, resamples=0, holds=None, above_next=[], reason="no bootstrap (--bootstrap 0)")
    rng = np.random.default_rng([seed, 2])  # its own stream of the seed
    drawn = np.stack([_resampled_estimates(*data[m], resamples, rng) for m in order])  # models x resamples
    above = drawn[:-1] > drawn[1:]
    return Ranking(order=order, resamples=resamples, holds=float(above.all(0).mean()), above_next=[float(v) for v in above.mean(1)])


class BenchmarkScores(BaseModel):
    """Per evaluated model, its mean human score estimated three ways, and their ranking."""

    criterion: str
    models: dict[str, ModelScore]
    ranking: Ranking


ModelData = dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]  # model -> (human, judged, judge_only)


def benchmark_scores(data: ModelData, criterion: str, resamples: int, seed: int) -> BenchmarkScores:
    scores = {m: model_score(*data[m]) for m in sorted(data)}
    return BenchmarkScores(criterion=criterion, models=scores, ranking=ranking(data, scores, resamples, seed))


def _interval(e: dict) -> str:
    return "undefined" if e.get("value") is None else f"{e['value']:.2f} [{e['low']:.2f}, {e['high']:.2f}]"


def summary_lines(report: dict) -> list[str]:
    """One line per judge and model from judge-calibrate's report.json (as read by json.load), for the demo."""
    lines = []
    for name, judge in report["judges"].items():
        benchmark = judge.get("benchmark")
        if not benchmark:
            continue
        for model, s in benchmark["models"].items():
            lines.append(f"{name} {model}: PPI++ {_interval(s['ppi'])} | judge only {_interval(s['judge_only'])} | "
                         f"human only {_interval(s['human_only'])} (n {s['human_scored']} human + {s['judge_only_ids']} judge only)")
    return lines
