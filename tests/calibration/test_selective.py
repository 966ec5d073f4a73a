"""Selective pairwise judging and judge panels (calibration/selective.py, calibration/panel.py): the guarantee
held over random calibration/test splits of synthetic pairs with known labels, a naive threshold that does
not hold it, a panel at least as good as its best judge, and judge-calibrate end to end on pairs."""

import json

import numpy as np
import pytest
from scipy import stats as sps

from mmjudge.calibration.cli import main
from mmjudge.calibration.panel import fit_panel
from mmjudge.calibration.selective import fit, kept
from mmjudge.judge.calibrator import PairCalibrator, Panel, Selective, load_calibrator, pair_confidence, preference_log_odds
from mmjudge.judge.data import UsageError

ALPHAS = (0.05, 0.1, 0.2)
SPLITS = 200
CALIBRATION = 500
DELTA = 0.1


def synthetic_pairs(n: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """(confidence, correct) of an overconfident pairwise judge: the chance q that people prefer A is known per
    pair, the judge reports log-odds 2.5 times q's, plus noise; its verdict is the likelier answer, right when
    people's label (drawn from q) is that answer."""
    q = rng.beta(0.7, 0.7, n)
    logit = np.log(q / (1 - q)) * 2.5 + rng.normal(0, 1.0, n)
    p_a = 1 / (1 + np.exp(-np.clip(logit, -30, 30)))
    verdict_a = p_a >= 0.5
    people_a = rng.random(n) < q
    confidence = np.array([pair_confidence("A" if a else "B", {"A": p, "B": 1 - p, "tie": 0.0}, "verdict_probability")
                           for a, p in zip(verdict_a, p_a)])
    return confidence, verdict_a == people_a


def naive_threshold(confidence, correct, alpha):
    """The lowest threshold whose calibration pairs kept are wrong at most at alpha, no bound: what the guarantee is for."""
    order = np.argsort(-confidence)
    error = np.cumsum(~correct[order]) / np.arange(1, len(order) + 1)
    fine = np.flatnonzero(error <= alpha)
    return None if not len(fine) else confidence[order][fine[-1]]


@pytest.mark.slow
def test_error_among_kept_pairs_is_at_most_alpha_in_the_promised_share_of_splits():
    """The guarantee: with probability 1 - delta over the calibration pairs, the error among kept verdicts is at most
    alpha. Over 200 random calibration/test splits of a pool of synthetic pairs with known labels, the count of splits
    whose kept test pairs are wrong at most at alpha is one that a share of 1 - delta gives (a one-sided binomial test
    at 1%: the procedure is tight, at about 0.92-0.94 measured over 2,000 splits, so 200 splits see 0.9 +- 0.02); a
    threshold fitted without the bound does not reach it."""
    least = sps.binom.ppf(0.01, SPLITS, 1 - DELTA)  # 170 of 200
    rng = np.random.default_rng(55)
    confidence, correct = synthetic_pairs(CALIBRATION + 20_000, rng)
    assert 0.15 < 1 - correct.mean() < 0.4  # a judge worth abstaining on: keeping all misses every alpha
    for alpha in ALPHAS:
        held, naive_held, coverages = [], [], []
        for _ in range(SPLITS):
            order = rng.permutation(len(confidence))
            cal, test = order[:CALIBRATION], order[CALIBRATION:]
            threshold = fit(confidence[cal], correct[cal], alpha, DELTA).threshold
            keep = kept(confidence[test], threshold)
            held.append(not keep.any() or 1 - correct[test][keep].mean() <= alpha)
            coverages.append(keep.mean())
            naive = kept(confidence[test], naive_threshold(confidence[cal], correct[cal], alpha))
            naive_held.append(not naive.any() or 1 - correct[test][naive].mean() <= alpha)
        assert sum(held) >= least, alpha
        assert np.mean(coverages) > 0.05, alpha  # it keeps pairs: abstaining on all would hold trivially
        assert sum(naive_held) < least, alpha  # the test can fail: a threshold without the bound misses alpha too often


def test_confidence_from_the_order_averaged_distribution():
    sure, unsure = {"A": 0.9, "B": 0.05, "tie": 0.05}, {"A": 0.4, "B": 0.35, "tie": 0.25}
    assert pair_confidence("A", sure, "verdict_probability") == pytest.approx(0.9)
    assert pair_confidence("tie", sure, "verdict_probability") == pytest.approx(0.05)  # a verdict the judge thinks unlikely
    entropy = -(0.9 * np.log(0.9) + 2 * 0.05 * np.log(0.05)) / np.log(3)
    assert pair_confidence("A", sure, "entropy") == pytest.approx(1 - entropy)
    assert pair_confidence("A", sure, "entropy") > pair_confidence("A", unsure, "entropy")
    assert pair_confidence("A", {"A": 1 / 3, "B": 1 / 3, "tie": 1 / 3}, "entropy") == pytest.approx(0, abs=1e-12)
    assert pair_confidence("A", None, "entropy") is None and pair_confidence(None, sure, "entropy") is None
    selective = Selective(uncertainty="verdict_probability", max_error=0.1, error_rate=0.1, threshold=0.6, n=100)
    assert selective.abstains("A", sure) == (False, pytest.approx(0.1))
    assert selective.abstains("A", unsure) == (True, pytest.approx(0.6))
    assert selective.abstains("A", None) == (True, None)  # nothing to read a confidence from: abstained
    assert Selective(**{**selective.model_dump(), "threshold": None}).abstains("A", sure)[0]  # no threshold met alpha


def test_a_panel_of_three_judges_agrees_at_least_as_well_as_the_best_one_held_out():
    """Three synthetic judges of different quality on the same pairs (noisy views of a known preference); the
    cross-fitted panel's agreement with people is at least the best judge's, and it weights the best judge most."""
    rng = np.random.default_rng(3)
    n = 1500
    truth = rng.normal(0, 1.5, n)
    people_a = rng.random(n) < 1 / (1 + np.exp(-3 * truth))
    noise = (0.6, 1.2, 2.0)
    odds = np.stack([2 * truth + rng.normal(0, s, n) for s in noise], axis=1)
    verdicts = np.where(odds > 0, "A", "B")
    panel, report, held_out = fit_panel(["good", "fair", "poor"], odds, verdicts, people_a, 5, 0)
    best = max(report.member_agreement.values())
    assert report.member_agreement["good"] == best > report.member_agreement["poor"]
    assert report.held_out_agreement >= best
    assert panel.weights[0] > panel.weights[1] > panel.weights[2] > 0
    assert len(held_out) == n
    applied = panel.verdicts({name: {str(i): ("A" if o > 0 else "B", None) for i, o in enumerate(odds[:, k])} for k, name in enumerate(panel.members)})
    assert len(applied) == n and applied["0"]["verdict"] in ("A", "B")  # no distribution: each judge's verdict as +-1 log-odds
    with pytest.raises(UsageError, match="none given for poor"):
        panel.verdicts({"good": {}, "fair": {}})


def test_log_odds_are_finite_and_fall_back_to_the_verdict():
    assert preference_log_odds("A", {"A": 1.0, "B": 0.0, "tie": 0.0}) == 10.0
    assert preference_log_odds("B", {"A": 0.2, "B": 0.6, "tie": 0.2}) == pytest.approx(np.log(0.2 / 0.6))
    assert preference_log_odds("tie", None) == 0.0 and preference_log_odds(None, None) is None


def _pair_record(pid, p_a, people_a, rng, model_pair=("m1", "m2")):
    distribution = {"A": p_a * 0.95, "B": (1 - p_a) * 0.95, "tie": 0.05}
    verdict = "A" if p_a >= 0.5 else "B"
    judge = {"id": pid, "verdict": verdict, "verdict_distribution": distribution, "model_a": model_pair[0], "model_b": model_pair[1]}
    return judge, {"id": pid, "preference": "A" if people_a else "B", "annotator": "x"}


@pytest.fixture
def pair_files(tmp_path):
    """Two judges' verdicts with distributions on 400 pairs, and people's preferences."""
    rng = np.random.default_rng(7)
    q = rng.beta(0.6, 0.6, 400)
    people_a = rng.random(400) < q
    files = {}
    for name, noise in (("sharp", 0.5), ("blunt", 2.0)):
        p_a = 1 / (1 + np.exp(-(np.log(q / (1 - q)) * 1.5 + rng.normal(0, noise, 400))))
        records, people = zip(*[_pair_record(f"p{k}", p, a, rng) for k, (p, a) in enumerate(zip(p_a, people_a))])
        files[name] = tmp_path / f"{name}.json"
        files[name].write_text(json.dumps(list(records)))
    (tmp_path / "people.json").write_text(json.dumps(list(people)))
    return files, tmp_path / "people.json", tmp_path


def test_judge_calibrate_fits_abstention_and_a_panel_on_pairs(pair_files, capsys):
    files, people, tmp_path = pair_files
    out = tmp_path / "report"
    args = ["--predictions", str(files["sharp"]), str(files["blunt"]), "--human", str(people), "--output_dir", str(out), "--bootstrap", "0",
            "--max_error", "0.15", "--panel"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "sharp: selective at max error 0.15: threshold" in printed and "panel: held-out accuracy" in printed
    report = json.loads((out / "report.json").read_text())
    points = {p["alpha"]: p for p in report["judges"]["sharp"]["selective"]["points"]}
    assert set(points) == {0.05, 0.1, 0.15, 0.2, 0.3}
    coverages = [points[a]["held_out_coverage"] for a in sorted(points)]
    assert coverages == sorted(coverages) and coverages[-1] > coverages[0]  # a looser alpha keeps more
    calibrator = load_calibrator(out / "calibrator.json", [], pairs=True)
    assert calibrator.selective.threshold == points[0.15]["threshold"] and calibrator.fitted_on.judge == "sharp"
    assert (out / "calibrator_blunt.json").exists() and (out / "plots" / "selective.png").exists()
    assert "Selective judging" in (out / "report.md").read_text() and "selective.png" in (out / "report.html").read_text()
    assert report["panel"]["held_out_agreement"] >= max(report["panel"]["member_agreement"].values()) - 0.01
    verdicts = json.loads((out / "panel_verdicts.json").read_text())
    assert len(verdicts) == 400 and {"abstained", "uncertainty", "verdict"} <= set(verdicts[0])
    with pytest.raises(UsageError, match="is a panel of sharp, blunt"):
        load_calibrator(out / "panel.json", [], pairs=True)
    with pytest.raises(UsageError, match="fitted on verdicts on pairs"):
        load_calibrator(out / "calibrator.json", [], pairs=False)
    # a run without --panel leaves no panel of an earlier run behind for judge-score to apply
    assert main(args[:-1]) == 0
    assert not (out / "panel.json").exists() and not (out / "panel_verdicts.json").exists()


def test_pair_flags_are_refused_for_scores_and_bad_values_named(pair_files, tmp_path, capsys):
    files, people, _ = pair_files
    base = ["--predictions", str(files["sharp"]), "--human", str(people), "--output_dir", str(tmp_path / "o")]
    assert main([*base, "--max_error", "1.5"]) == 2 and "--max_error must lie between 0 and 1" in capsys.readouterr().err
    assert main([*base, "--panel"]) == 2 and "--panel combines several judges" in capsys.readouterr().err
    assert main([*base, "--judge_family", "model-a", "--family_max_gap", "1"]) == 2 and "--family_max_gap must lie between 0" in capsys.readouterr().err
    scores = tmp_path / "scores.json"
    scores.write_text(json.dumps([{"id": "a", "score": 3}]))
    assert main(["--predictions", str(scores), "--human", str(scores), "--output_dir", str(tmp_path / "s"), "--panel"]) == 2
    assert "--panel: for verdicts on pairs" in capsys.readouterr().err
    assert main(["--predictions", str(scores), "--human", str(scores), "--output_dir", str(tmp_path / "s"), "--family_max_gap", "0.2"]) == 2
    assert "--family_max_gap: for verdicts on pairs" in capsys.readouterr().err


def test_a_pair_calibrator_file_is_checked():
    with pytest.raises(ValueError):
        PairCalibrator.model_validate({"kind": "pairs", "selective": {"uncertainty": "entropy", "max_error": 1.5, "error_rate": 0.1,
                                                                      "threshold": 0.5, "n": 3}})
    with pytest.raises(ValueError):
        Panel(members=["a", "b"], weights=[1.0], intercept=0.0, n=3)
