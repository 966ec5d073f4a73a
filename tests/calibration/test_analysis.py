import krippendorff
import numpy as np
import pytest
from scipy import stats as sps

from mmjudge.calibration.analysis import Options, analyse, drawn_pairs, human_ceiling
from mmjudge.calibration.report import markdown, sections
from mmjudge.calibration.inputs import Coverage, HumanRecord, JudgeRecord, Ratings
from mmjudge.judge.parsing import ScoreScale


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


def two_annotators(n: int, rho: float, rng) -> dict[str, HumanRecord]:
    """Two annotators per id whose scores correlate at rho: a shared latent quality plus independent noise."""
    latent = rng.normal(0, np.sqrt(rho), n)
    a, b = (3 + latent + rng.normal(0, np.sqrt(1 - rho), n) for _ in range(2))
    return {f"SA_{i}": HumanRecord({"overall": [float(a[i]), float(b[i])]}, None, "SA") for i in range(n)}


def judged(human: dict[str, HumanRecord], ids) -> dict[str, JudgeRecord]:
    return {i: JudgeRecord({"overall": 3.0 + k % 3}, None, None, "SA", None) for k, i in enumerate(ids) if i in human}


def test_ceiling_counts_each_id_once_so_n_and_the_interval_are_those_of_the_ids():
    # annotator b gives one point more than a on every id: a mirrored pair (a, b), (b, a) per id would double n
    human = {f"SA_{i}": HumanRecord({"overall": [float(i % 6), float(i % 6 + 1)]}, None, "SA") for i in range(50)}
    pairs = drawn_pairs(human, "overall", seed=0)
    assert set(pairs) == set(human)  # one pair per id
    assert all(sorted(pairs[i]) == human[i].ratings["overall"] for i in human)
    assert 10 < sum(one > other for one, other in pairs.values()) < 40  # the drawn annotator varies
    ceiling = human_ceiling(ratings({}, human), list(human), pairs, "overall", ScoreScale(0, 6), bootstrap=0, seed=0)
    one, other = np.array(list(pairs.values())).T
    assert (ceiling.ids, ceiling.most_annotators, ceiling.agreement["n"].value) == (50, 2, 50)
    assert (ceiling.agreement["mae"].value, ceiling.agreement["exact_agreement"].value, ceiling.agreement["within_1_agreement"].value) == (1, 0, 1)
    pearson = ceiling.agreement["pearson"]
    expected = sps.pearsonr(one, other)
    assert pearson.value == pytest.approx(expected.statistic)
    assert (pearson.fisher_95.low, pearson.fisher_95.high) == pytest.approx(tuple(expected.confidence_interval(0.95)))  # n = 50
    matrix = np.array([human[i].ratings["overall"] for i in sorted(human)]).T
    assert ceiling.alpha_interval_all_annotators.value == pytest.approx(krippendorff.alpha(reliability_data=matrix, level_of_measurement="interval"))


@pytest.mark.slow
def test_ceiling_intervals_cover_the_annotators_correlation_at_about_the_nominal_rate():
    # Pooling each annotator against the other counted 100 pairs for 50 ids: in this simulation its intervals
    # covered 87% (Fisher) and 84% (bootstrap).
    rng, rho, trials = np.random.default_rng(11), 0.6, 300
    fisher = boot = 0
    for t in range(trials):
        human = two_annotators(50, rho, rng)
        c = human_ceiling(ratings({}, human), list(human), drawn_pairs(human, "overall", t), "overall", ScoreScale(0, 6), bootstrap=300, seed=t)
        r = c.agreement["pearson"]
        fisher += r.fisher_95.low <= rho <= r.fisher_95.high
        boot += r.bootstrap_95.low <= rho <= r.bootstrap_95.high
    # nominal 0.95, binomial sd 0.013 at 300 trials; the percentile bootstrap runs a little narrow at n = 50
    assert 0.91 <= fisher / trials <= 0.99
    assert 0.88 <= boot / trials <= 0.98


def test_ceiling_is_computed_on_the_ids_each_judge_is_compared_on():
    human = two_annotators(60, 0.6, np.random.default_rng(0)) | {"SA_once": HumanRecord({"overall": [2.0]}, None, "SA")}
    ids = sorted(human)
    r = ratings(judged(human, ids[:40] + ["SA_once"]), human)
    r.judges["k"], r.coverage["k"] = judged(human, ids[20:]), r.coverage["j"]
    report, _ = analyse(r, options(), "h.json", [])
    j, k = (report.judges[name].criteria["overall"].ceiling for name in "jk")
    assert (j.ids, k.ids) == (40, 40)  # SA_once has one annotator: no pair
    pairs, scale = drawn_pairs(human, "overall", seed=0), ScoreScale(0, 6)
    assert j == human_ceiling(r, ids[:40], pairs, "overall", scale, 0, 0) and k == human_ceiling(r, ids[20:], pairs, "overall", scale, 0, 0)
    assert human_ceiling(r, ids, pairs, "overall", scale, 0, 0).ids == 60 and j != k
    md = " ".join(markdown(sections(report)).split())  # tables padded and paragraphs wrapped for plain text: one space each
    assert "| statistic | j | k | human ceiling, ids of j | human ceiling, ids of k |" in md
    assert "human ceiling, ids of k: 40 ids with two or more annotators (up to 2)" in md


def test_human_ceiling_without_repeated_annotators_is_undefined_not_a_crash():
    human = {str(i): HumanRecord({"overall": [float(i % 7)]}, None, "SA") for i in range(10)}
    ceiling = human_ceiling(ratings({}, human), list(human), drawn_pairs(human, "overall", 0), "overall", ScoreScale(0, 6), bootstrap=100, seed=0)
    assert ceiling.ids == 0 and ceiling.most_annotators == 0
    assert ceiling.agreement["pearson"].reason == "n = 0 < 3" and ceiling.alpha_interval_all_annotators.reason == "no unit was rated twice"


def test_calibration_uses_the_expected_score_when_every_record_has_one():
    r = synthetic()
    for record in r.judges["j"].values():
        record.expected_score = min(6.0, record.scores["overall"] + 0.3)
    calibration = analyse(r, options(), "h.json", [])[0].judges["j"].calibration
    assert calibration.source == "expected_score" and calibration.calibrator.source == "expected_score"
    assert calibration.mse_after.value < calibration.mse_before.value
    assert calibration.calibrator.fitted_on.n == 240
