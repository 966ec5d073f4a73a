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
    with pytest.raises(InputError, match="calibrator file not found"):
        Calibrator.load(tmp_path / "nope.json")
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(InputError, match="invalid JSON"):
        Calibrator.load(tmp_path / "broken.json")


def test_judge_calibrator_imports_nothing_from_calibration():
    code = "import sys, judge.calibrator; assert not [m for m in sys.modules if m.split('.')[0] in ('calibration', 'torch')], sorted(sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
