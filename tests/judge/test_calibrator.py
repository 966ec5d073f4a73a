import json
import subprocess
import sys

import pytest

import numpy as np

from mmjudge.judge.calibrator import Calibrator, mass_before
from mmjudge.judge.data import InputError


def test_apply_interpolates_clips_and_passes_none_through():
    c = Calibrator(method="isotonic", source="score", x=[1, 3, 5], y=[0.5, 2, 5.5], scale=(0, 6))
    assert c.apply(2) == pytest.approx(1.25)
    assert c.apply(-3) == 0.5 and c.apply(9) == 5.5  # flat beyond the end knots
    assert c.apply(None) is None


def test_linear_map_is_clipped_to_the_scale():
    c = Calibrator(method="linear", source="expected_score", x=[0, 6], y=[1, 5], scale=(0, 6))
    assert c.apply(3) == 3 and c.apply(0) == 1


def test_save_and_load_round_trip(tmp_path):
    c = Calibrator(method="linear", source="score", x=[0, 6], y=[1, 5], scale=(0, 6), fitted_on={"n": 40, "judge": "mine"})
    c.save(tmp_path / "c.json")
    assert Calibrator.load(tmp_path / "c.json") == c


@pytest.mark.parametrize(
    "content, message",
    [
        ({"method": "linear", "source": "score", "x": [0, 6], "y": [5, 1], "scale": [0, 6]}, "knots must be non-decreasing"),
        ({"method": "linear", "source": "score", "x": [0], "y": [1], "scale": [0, 6]}, "at least 2"),
        ({"method": "linear", "source": "score", "x": [0, 6], "y": [1, 9], "scale": [0, 6]}, "within the scale"),
        ({"method": "spline", "source": "score", "x": [0, 6], "y": [1, 5], "scale": [0, 6]}, "method"),
        ({"method": "linear", "source": "score", "x": [0, 6], "y": [1, 5], "scale": [6, 0]}, "low < high"),
    ],
)
def test_bad_files_name_the_file_and_the_problem(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(content))
    with pytest.raises(InputError, match=message) as err:
        Calibrator.load(path)
    assert str(path) in str(err.value)


FITTED = {"method": "linear", "source": "score", "x": [0, 6], "y": [1, 5], "scale": [0, 6], "fitted_on": {"n": 40, "folds": 5},
          "score_sets": {"coverage": 0.9, "threshold": 0.7, "n": 40},
          "escalation": {"agreement": "exact", "target_agreement": 0.8, "error_rate": 0.1, "threshold": 0.6, "n": 40}}


@pytest.mark.parametrize("part, field, value, message", [
    # judge-score failed on every record with "internal failure: IndexError": no level is at or below a negative threshold
    ("score_sets", "threshold", -0.5, "score_sets.threshold: Input should be greater than or equal to 0"),
    ("score_sets", "coverage", 2.0, "score_sets.coverage: Input should be less than 1"),  # was accepted, and reported
    ("score_sets", "coverage", 0, "score_sets.coverage: Input should be greater than 0"),
    ("score_sets", "n", -3, "score_sets.n: Input should be greater than or equal to 0"),
    ("escalation", "threshold", 1.5, "escalation.threshold: Input should be less than or equal to 1"),
    ("escalation", "error_rate", 1.0, "escalation.error_rate: Input should be less than 1"),
    ("escalation", "target_agreement", float("nan"), "escalation.target_agreement"),
    ("fitted_on", "folds", 1, "fitted_on.folds: Input should be greater than or equal to 2"),
    ("fitted_on", "mse_before", -1, "fitted_on.mse_before: Input should be greater than or equal to 0"),
])
def test_a_calibrators_numbers_out_of_their_range_are_named_before_it_is_used(tmp_path, part, field, value, message):
    path = tmp_path / "c.json"
    path.write_text(json.dumps(FITTED))
    Calibrator.load(path).score_set(distribution(0.1, 0.2, 0.4, 0.3))
    path.write_text(json.dumps({**FITTED, part: {**FITTED[part], field: value}}))
    with pytest.raises(InputError) as err:
        Calibrator.load(path)
    [problem] = err.value.problems
    assert str(problem).startswith(f"{path}: ") and message in str(problem)


def test_a_calibrator_larger_than_any_fitted_one_is_refused_unread(tmp_path):
    path = tmp_path / "c.json"
    with path.open("wb") as f:
        f.truncate(17 * 2**20)  # 17 MiB of nothing, on disk as a hole
    with pytest.raises(InputError, match=r"c.json: 17,825,792 bytes; a file of this kind holds a few kilobytes, and more than 16,777,216 is refused unread"):
        Calibrator.load(path)


def test_missing_and_broken_files(tmp_path):
    with pytest.raises(InputError, match="nope.json: file not found"):
        Calibrator.load(tmp_path / "nope.json")
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(InputError, match="broken.json: invalid JSON at line 1, column 2"):
        Calibrator.load(tmp_path / "broken.json")


OLD = {"method": "isotonic", "source": "score", "criterion": "overall", "x": [1, 5], "y": [2, 4], "scale": [0, 6],
       "fitted_on": {"judge": "mine", "n": 90}}  # as judge-calibrate wrote calibrator.json before 'criterion' was dropped


def test_an_old_file_of_the_overall_score_loads_and_is_written_without_criterion(tmp_path):
    (tmp_path / "old.json").write_text(json.dumps(OLD))
    c = Calibrator.load(tmp_path / "old.json")
    assert c.apply(3) == 3 and c.fitted_on.n == 90
    c.save(tmp_path / "new.json")
    assert "criterion" not in json.loads((tmp_path / "new.json").read_text())


def test_a_map_of_another_criterion_is_refused_rather_than_applied_to_the_overall_score(tmp_path):
    (tmp_path / "tq.json").write_text(json.dumps({**OLD, "criterion": "text_quality"}))
    with pytest.raises(InputError) as err:
        Calibrator.load(tmp_path / "tq.json")
    assert str(err.value).endswith(f"{tmp_path / 'tq.json'}: a map of criterion 'text_quality': judge-score calibrates the overall score only "
                                   "(the record's score or expected_score)")


def test_judge_calibrator_imports_nothing_from_calibration():
    code = "import sys, mmjudge.judge.calibrator; assert not [m for m in sys.modules if m.split('.')[0] == 'torch' or m.startswith('mmjudge.calibration')], sorted(sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


MAP = {"method": "linear", "source": "score", "x": [0, 6], "y": [0, 6], "scale": (0, 6)}


def distribution(*probabilities: float) -> dict[str, float]:
    return {str(level): p for level, p in enumerate(probabilities)}


def test_mass_before_grows_an_interval_from_the_mode_by_the_more_probable_neighbour():
    p = np.array([[0.05, 0.1, 0.5, 0.3, 0.05, 0, 0], [1 / 7] * 7])
    before = mass_before(p)
    assert before[0].tolist() == pytest.approx([0.9, 0.8, 0, 0.5, 0.95, 1, 1])
    # all tied: start at the lowest level, grow to the right (the left neighbour does not exist), in order
    assert before[1].tolist() == pytest.approx([k / 7 for k in range(7)])


@pytest.mark.parametrize("threshold, expected", [(0.0, [2, 2]), (0.49, [2, 2]), (0.5, [2, 3]), (0.8, [1, 3]), (0.85, [1, 3]),
                                                 (0.9, [0, 3]), (1.0, [0, 6])])
def test_score_set_is_the_interval_of_levels_joined_at_or_below_the_threshold(threshold, expected):
    c = Calibrator(**MAP, score_sets={"coverage": 0.9, "threshold": threshold, "n": 100})
    assert c.score_set(distribution(0.05, 0.1, 0.5, 0.3, 0.05, 0, 0)) == expected


def test_score_set_on_a_scale_from_one_names_the_levels_themselves():
    c = Calibrator(method="linear", source="score", x=[1, 5], y=[1, 5], scale=(1, 5), score_sets={"coverage": 0.9, "threshold": 0.6, "n": 100})
    assert c.score_set({"1": 0.1, "2": 0.2, "3": 0.6, "4": 0.1, "5": 0.0}) == [2, 3]


def test_no_score_sets_or_no_distribution_gives_none():
    assert Calibrator(**MAP).score_set(distribution(0, 0, 1, 0, 0, 0, 0)) is None
    assert Calibrator(**MAP, score_sets={"coverage": 0.9, "threshold": 0.5, "n": 100}).score_set(None) is None


ESCALATION = {"agreement": "exact", "target_agreement": 0.8, "error_rate": 0.1, "threshold": 0.6, "n": 200}


@pytest.mark.parametrize("score, probabilities, expected", [
    (2, (0, 0, 0.6, 0.4, 0, 0, 0), False),  # at the threshold: trusted
    (2, (0, 0, 0.59, 0.41, 0, 0, 0), True),  # below it
    (3, (0, 0, 0.6, 0.4, 0, 0, 0), True),  # the judge wrote a level it was less sure of
    (None, (0, 0, 1, 0, 0, 0, 0), True),  # a parse failure: nothing to trust
])
def test_escalate_compares_the_judges_confidence_in_its_written_score_with_the_threshold(score, probabilities, expected):
    assert Calibrator(**MAP, escalation=ESCALATION).escalate(score, distribution(*probabilities)) is expected


def test_escalate_within_one_level_counts_the_neighbours():
    c = Calibrator(**MAP, escalation={**ESCALATION, "agreement": "within_1", "threshold": 0.9})
    assert c.escalate(3, distribution(0, 0, 0.25, 0.5, 0.2, 0.05, 0)) is False  # 0.95
    assert c.escalate(2, distribution(0, 0, 0.25, 0.5, 0.2, 0.05, 0)) is True  # 0.75


def test_escalate_without_a_threshold_sends_everything_to_people_and_without_escalation_says_nothing():
    assert Calibrator(**MAP, escalation={**ESCALATION, "threshold": None}).escalate(4, distribution(0, 0, 0, 0, 1, 0, 0)) is True
    assert Calibrator(**MAP).escalate(4, distribution(0, 0, 0, 0, 1, 0, 0)) is None
    assert Calibrator(**MAP, escalation=ESCALATION).escalate(4, None) is None
