import json
import subprocess
import sys

import pytest

from judge.calibrator import Calibrator
from judge.data import InputError


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
    code = "import sys, judge.calibrator; assert not [m for m in sys.modules if m.split('.')[0] in ('calibration', 'torch')], sorted(sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
