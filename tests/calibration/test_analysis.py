import numpy as np
import pytest
from scipy import stats as sps

from calibration.analysis import Options, analyse, human_ceiling
from calibration.inputs import Coverage, HumanRecord, JudgeRecord, Ratings
from judge.parsing import ScoreScale


def ratings(judge: dict[str, JudgeRecord], human: dict[str, HumanRecord]) -> Ratings:
    coverage = Coverage(predictions="p.json", records=len(judge), shared_ids=len(judge), only_in_predictions=0, only_in_predictions_first=[],
                        only_in_human=0, only_in_human_first=[], parse_failures=0)
    return Ratings({"j": judge}, human, {"j": coverage})


def options(**changes) -> Options:
    return Options(**{"criteria": ["overall"], "group_by": "category", "bootstrap": 0, "seed": 0, "fit": "isotonic", "folds": 5, "scale": ScoreScale(0, 6), **changes})


def synthetic(n=240, models=("a", "b", "c", "d"), seed=0):
    rng = np.random.default_rng(seed)
    judge, human = {}, {}
    for i in range(n):
        quality, chars = rng.uniform(0, 6), int(rng.integers(10, 1000))
        # the judge rewards length: its residual grows with answer length
        score = float(np.clip(np.rint(quality + (chars - 500) / 250 + rng.normal(0, 0.5)), 0, 6))
        cat, model = ("SA", "PBL", "MSR")[i % 3], models[i % len(models)]
        judge[str(i)] = JudgeRecord({"overall": score}, None, model, cat, None)
        human[str(i)] = HumanRecord({"overall": [float(np.clip(np.rint(quality), 0, 6))]}, model, cat, chars, i % 3)
    return ratings(judge, human)


def test_bias_finds_the_length_preference_and_not_the_image_count():
    report, _ = analyse(synthetic(), options(), "h.json", [])
    bias = report.judges["j"].criteria["overall"].bias
    assert bias.residual_vs_answer_chars.spearman.value > 0.6
    assert abs(bias.residual_vs_n_images.spearman.value) < 0.2
    assert set(bias.residual_by_category) == {"SA", "PBL", "MSR"} and sum(g.n for g in bias.residual_by_category.values()) == 240


def test_system_level_correlates_per_model_means():
    r = synthetic()
    report, _ = analyse(r, options(), "h.json", [])
    system = report.judges["j"].criteria["overall"].system_level
    judge_means = [np.mean([r.judges["j"][i].scores["overall"] for i in r.judges["j"] if r.judges["j"][i].model == m]) for m in "abcd"]
    human_means = [np.mean([r.human[i].ratings["overall"][0] for i in r.human if r.human[i].model == m]) for m in "abcd"]
    assert [system.models[m].judge_mean for m in "abcd"] == pytest.approx(judge_means)
    assert system.pearson.value == pytest.approx(sps.pearsonr(judge_means, human_means).statistic)
    assert system.kendall_tau_b.value == pytest.approx(sps.kendalltau(judge_means, human_means).statistic)


def test_system_level_needs_three_models():
    report, _ = analyse(synthetic(models=("a", "b")), options(), "h.json", [])
    system = report.judges["j"].criteria["overall"].system_level
    assert system.pearson.value is None and "2 evaluated model(s)" in system.pearson.reason


def test_human_ceiling_pairs_each_annotator_with_the_mean_of_the_others():
    human = {"1": HumanRecord({"overall": [1.0, 2.0, 3.0]}, None, "SA"), "2": HumanRecord({"overall": [4.0, 4.0]}, None, "SA"),
             "3": HumanRecord({"overall": [5.0, 6.0]}, None, "SA"), "4": HumanRecord({"overall": [0.0]}, None, "SA")}
    ceiling = human_ceiling(ratings({}, human), "overall", ScoreScale(0, 6), bootstrap=0, seed=0)
    one = [1, 2, 3, 4, 4, 5, 6]
    others = [2.5, 2, 1.5, 4, 4, 6, 5]
    assert ceiling.ids_rated_more_than_once == 3 and ceiling.most_annotators == 3
    assert ceiling.agreement["n"].value == 7
    assert ceiling.agreement["pearson"].value == pytest.approx(sps.pearsonr(one, others).statistic)
    assert ceiling.agreement["mae"].value == pytest.approx(np.mean(np.abs(np.subtract(one, others))))


def test_human_ceiling_without_repeated_annotators_is_undefined_not_a_crash():
    human = {str(i): HumanRecord({"overall": [float(i % 7)]}, None, "SA") for i in range(10)}
    ceiling = human_ceiling(ratings({}, human), "overall", ScoreScale(0, 6), bootstrap=100, seed=0)
    assert ceiling.ids_rated_more_than_once == 0
    assert ceiling.agreement["pearson"].reason == "n = 0 < 3" and ceiling.agreement["krippendorff_interval"].reason == "no unit was rated twice"


def test_calibration_uses_the_expected_score_when_every_record_has_one():
    r = synthetic()
    for record in r.judges["j"].values():
        record.expected_score = min(6.0, record.scores["overall"] + 0.3)
    calibration = analyse(r, options(), "h.json", [])[0].judges["j"].calibration
    assert calibration.source == "expected_score" and calibration.calibrator.source == "expected_score"
    assert calibration.mse_after.value < calibration.mse_before.value
    assert calibration.calibrator.fitted_on.n == 240
