"""Judge panels: several judges' verdicts on the same pairs combined by a stacked logistic model fitted on people's
preferences. Pure numpy/scikit-learn; no torch.

Each judge gives each pair its log-odds for answer A (judge.calibrator.preference_log_odds: from its verdict
distribution, averaged over both orders, else its verdict as +1 / -1 / 0). On the pairs where people prefer one
answer, an L2-regularised logistic regression of people's choice on the judges' log-odds gives each judge a weight
(a weak or redundant judge gets little; a judge that leans the wrong way, a negative one) and an intercept (a
shared lean towards A or B). The panel's held-out agreement is cross-fitted: its weights fitted on K - 1 folds,
its verdicts read on the fold left out, pooled; each judge's agreement is read on the same pairs. The weights
written to the panel file are those fitted on every pair. A panel of judges that calibrate one another is the
idea of arXiv 2605.09702; a logistic stack (Wolpert 1992's stacking) is the plainest form of it.
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedKFold

from mmjudge.judge.calibrator import Panel

REGULARISATION = 1.0  # sklearn's C: an L2 penalty that keeps a panel of few pairs from extreme weights
MIN_PAIRS_PER_FOLD = 5


class PanelReport(BaseModel):
    members: list[str]
    n: int  # pairs where every member has a lean and people prefer one answer
    folds: int
    held_out_agreement: float | None  # the panel's, cross-fitted
    member_agreement: dict[str, float]  # each judge's on the same pairs (its verdict, a tie never agreeing)
    weights: dict[str, float]
    intercept: float
    reason: str | None = None  # why no panel was fitted


def _model() -> LogisticRegression:
    return LogisticRegression(C=REGULARISATION)


def fit_panel(members: list[str], log_odds: np.ndarray, verdicts: np.ndarray, people_a: np.ndarray, folds: int,
              seed: int) -> tuple[Panel | None, PanelReport, np.ndarray | None]:
    """`log_odds`: pairs x members; `verdicts`: each member's verdict per pair ("A", "B" or "tie"); `people_a`: whether
    people prefer A (pairs where they prefer one answer only). Returns the panel fitted on every pair, the report,
    and the cross-fitted P(A) of each pair (None where no panel could be fitted)."""
    n = len(people_a)
    member_agreement = {m: float(np.mean(verdicts[:, k] == np.where(people_a, "A", "B"))) if n else 0.0 for k, m in enumerate(members)}
    empty = dict(members=members, n=n, folds=folds, held_out_agreement=None, member_agreement=member_agreement, weights={}, intercept=0.0)
    smaller = min(int(people_a.sum()), int((~people_a).sum()))
    if smaller < folds or n < folds * MIN_PAIRS_PER_FOLD:
        return None, PanelReport(**empty, reason=f"{n} pairs every judge leans on and people prefer one answer of ({smaller} the rarer way); "
                                                 f"a panel needs {folds * MIN_PAIRS_PER_FOLD}, {folds} each way"), None
    held_out = np.empty(n)
    for train, test in StratifiedKFold(folds, shuffle=True, random_state=seed).split(log_odds, people_a):
        held_out[test] = _model().fit(log_odds[train], people_a[train]).predict_proba(log_odds[test])[:, 1]
    model = _model().fit(log_odds, people_a)
    panel = Panel(members=members, weights=[float(w) for w in model.coef_[0]], intercept=float(model.intercept_[0]), n=n)
    report = PanelReport(**{**empty, "held_out_agreement": float(np.mean((held_out >= 0.5) == people_a)),
                            "weights": dict(zip(members, panel.weights)), "intercept": panel.intercept})
    return panel, report, held_out
