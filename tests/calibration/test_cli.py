import json
import subprocess
import sys

import numpy as np
import pytest

from calibration.cli import main
from judge.calibrator import Calibrator


def write(path, records):
    path.write_text(json.dumps(records))
    return str(path)


@pytest.fixture
def files(tmp_path):
    rng = np.random.default_rng(0)
    human = rng.integers(0, 7, 90)
    judge = np.clip(np.rint(6 * (human / 6) ** 2 + rng.normal(0, 0.7, 90)), 0, 6).astype(int)
    cats, models = ["SA", "PBL", "MSR"], ["m1", "m2", "m3"]
    preds = [{"id": f"{cats[i % 3]}_{i}", "model": models[i % 3], "category": cats[i % 3], "score": int(judge[i]),
              "criteria": {"text_quality": int(judge[i])}, "expected_score": float(judge[i]), "n_images": i % 4, "parse_error": None}
             for i in range(90)]
    preds.append({"id": "SA_900", "model": "m1", "category": "SA", "score": None, "criteria": {}, "expected_score": None, "parse_error": "no heading"})
    annotations = []
    for i in range(90):
        base = {"id": f"{cats[i % 3]}_{i}", "model": models[i % 3], "question": [{"text": "q"}], "answer": "a" * (10 + i)}
        annotations.append({**base, "human_scores": {"overall": int(human[i]), "text_quality": int(human[i])}, "annotator": "x"})
        if i % 2:
            annotations.append({**base, "human_scores": {"overall": int(np.clip(human[i] + 1, 0, 6))}, "annotator": "y"})
    annotations.append({"id": "PBL_999", "question": "q", "answer": "a", "human_scores": {"overall": 3}})  # human side only
    return write(tmp_path / "preds.json", preds), write(tmp_path / "human.json", annotations), tmp_path


def test_reports_and_calibrator_are_written_with_content(files, capsys):
    preds, human, tmp = files
    out = tmp / "report"
    assert main(["--predictions", preds, "--human", human, "--output_dir", str(out), "--names", "judge", "--bootstrap", "200"]) == 0
    report = json.loads((out / "report.json").read_text())
    overall = report["judges"]["judge"]["criteria"]["overall"]
    assert overall["all"]["n"]["value"] == 90
    assert {"boot_low", "boot_high", "low", "high"} <= set(overall["all"]["pearson"])
    assert set(overall["groups"]) == {"SA", "PBL", "MSR"}
    assert len(report["judges"]["judge"]["system_level"]["models"]) == 3
    assert report["judges"]["judge"]["bias"]["residual_vs_answer_chars"]["value"] is not None
    assert report["human_ceiling"]["overall"]["n"]["value"] == 45  # ids with a second annotator
    cal = report["judges"]["judge"]["calibration"]
    assert cal["source"] == "expected_score" and cal["mse_after"] < cal["mse_before"]
    assert any("1 id(s) only in" in n and "PBL_999" in n for n in report["notes"])
    assert any("1 parse failure" in n for n in report["notes"])
    md = (out / "report.md").read_text()
    assert "| Pearson r |" in md and "Cosine similarity is reported because MMIE reports it" in md
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 5 and "<table>" in html
    assert len(list((out / "plots").glob("*.png"))) == 5
    calibrator = Calibrator.load(out / "calibrator.json")
    assert calibrator.source == "expected_score" and calibrator.apply(0) <= calibrator.apply(3) <= calibrator.apply(6)
    assert "judge: overall Pearson" in capsys.readouterr().out


def test_flat_human_file_and_two_judges(files, tmp_path):
    preds, _, _ = files
    flat = [{"id": r["id"], "overall": r["score"] if r["score"] is not None else 3} for r in json.loads(open(preds).read())]
    human = write(tmp_path / "flat.json", flat)
    assert main(["--predictions", preds, preds, "--names", "a", "b", "--human", human, "--output_dir", str(tmp_path / "r"), "--bootstrap", "0", "--by", "none"]) == 0
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert report["judges"]["a"]["criteria"]["overall"]["all"]["pearson"]["value"] == pytest.approx(1.0)
    assert (tmp_path / "r" / "calibrator_a.json").exists() and (tmp_path / "r" / "calibrator_b.json").exists()
    assert report["judges"]["a"]["bias"]["residual_vs_answer_chars"]["reason"].startswith("answer_chars is unknown")


@pytest.mark.parametrize(
    "human_records, message",
    [
        ([{"id": "SA_0", "overall": 9}], "record 0 (id 'SA_0'): overall: 9 is outside the scale 0-6"),
        ([{"id": "SA_0", "overall": "good"}], "record 0 (id 'SA_0'): overall: 'good' is not a number"),
        ([{"id": "SA_0", "overall": 2}, {"id": "SA_0", "overall": 3}], "record 1 (id 'SA_0'): duplicate id"),
        ([{"id": "nothing_shared", "overall": 2}], "no id in common"),
    ],
)
def test_input_errors_name_file_and_id(files, tmp_path, capsys, human_records, message):
    preds, _, _ = files
    human = write(tmp_path / "bad.json", human_records)
    assert main(["--predictions", preds, "--human", human, "--output_dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_empty_and_conflicting_prediction_files(files, tmp_path, capsys):
    _, human, _ = files
    (tmp_path / "empty.json").write_text("")
    assert main(["--predictions", str(tmp_path / "empty.json"), "--human", human, "--output_dir", str(tmp_path / "r")]) == 2
    assert "empty.json: file is empty" in capsys.readouterr().err
    conflict = write(tmp_path / "c.json", [{"id": "SA_0", "score": 1}, {"id": "SA_0", "score": 4}])
    assert main(["--predictions", conflict, "--human", human, "--output_dir", str(tmp_path / "r")]) == 2
    assert "record 1 (id 'SA_0'): duplicate id with different scores" in capsys.readouterr().err


def test_calibration_package_imports_without_torch():
    code = (
        "import sys, importlib.abc\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name.split('.')[0] == 'torch': raise ImportError('torch is blocked')\n"
        "sys.meta_path.insert(0, Block())\n"
        "import calibration.cli, calibration.analysis, calibration.plots, calibration.report, judge.calibrator\n"
        "assert 'torch' not in sys.modules\n"
        "print('ok')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_calibrator_file_validation(tmp_path):
    good = Calibrator(method="linear", source="score", x=[0, 6], y=[1, 5], scale=(0, 6))
    assert good.apply(3) == 3 and good.apply(-5) == 1 and good.apply(None) is None
    (tmp_path / "bad.json").write_text(json.dumps({"method": "linear", "source": "score", "x": [0, 6], "y": [5, 1], "scale": [0, 6]}))
    with pytest.raises(Exception, match="knots must be non-decreasing"):
        Calibrator.load(tmp_path / "bad.json")
