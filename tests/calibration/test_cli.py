import json
import subprocess
import sys
from collections import Counter
from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as sps
from sklearn.metrics import cohen_kappa_score

from mmjudge.calibration.cli import main
from mmjudge.calibration.inputs import read_predictions
from mmjudge.judge.parsing import ScoreScale
from mmjudge.judge.calibrator import Calibrator

CATEGORIES, MODELS = ["SA", "PBL", "MSR"], ["m1", "m2", "m3"]


def write(path, records):
    path.write_text(json.dumps(records))
    return str(path)


def report_md(out: Path) -> str:
    """report.md with every run of white space as one space: its tables are padded and its paragraphs wrapped
    for plain-text reading."""
    return " ".join((out / "report.md").read_text().split())


def no_nan(constant):
    raise AssertionError(f"{constant} in report.json")


@pytest.fixture
def files(tmp_path):
    """90 judge-score records (one more that failed to parse, one the people did not rate) and annotation
    records for them, half of the ids rated twice."""
    rng = np.random.default_rng(0)
    human = rng.integers(0, 7, 90)
    judge = np.clip(np.rint(6 * (human / 6) ** 2 + rng.normal(0, 0.7, 90)), 0, 6).astype(int)
    preds = [{"id": f"{CATEGORIES[i % 3]}_{i}", "model": MODELS[i % 3], "category": CATEGORIES[i % 3], "score": int(judge[i]),
              "criteria": {"text_quality": int(judge[i])}, "expected_score": float(judge[i]), "n_images": i % 4, "parse_error": None}
             for i in range(90)]
    preds.append({"id": "SA_900", "model": "m1", "category": "SA", "score": None, "criteria": {}, "expected_score": None, "parse_error": "no heading"})
    preds.append({"id": "SA_901", "model": "m1", "category": "SA", "score": 3, "criteria": {}, "expected_score": 3.0, "parse_error": None})
    annotations = []
    for i in range(90):
        base = {"id": f"{CATEGORIES[i % 3]}_{i}", "model": MODELS[i % 3], "question": [{"text": "q"}], "answer": "a" * (10 + i)}
        annotations.append({**base, "human_scores": {"overall": int(human[i]), "text_quality": int(human[i])}, "annotator": "x"})
        if i % 2:
            annotations.append({**base, "human_scores": {"overall": int(np.clip(human[i] + 1, 0, 6))}, "annotator": "y"})
    annotations.append({"id": "PBL_999", "question": "q", "answer": "a", "human_scores": {"overall": 3}})  # human side only
    return write(tmp_path / "preds.json", preds), write(tmp_path / "human.json", annotations), tmp_path


@pytest.mark.slow
def test_reports_and_calibrator_are_written_with_their_content(files, capsys):
    preds, human, tmp = files
    out = tmp / "report"
    assert main(["--predictions", preds, "--human", human, "--output_dir", str(out), "--names", "judge", "--bootstrap", "200"]) == 0
    report = json.loads((out / "report.json").read_text(), parse_constant=no_nan)
    assert report["criteria"] == ["overall", "text_quality"]  # the criteria both sides scored
    judge = report["judges"]["judge"]
    overall = judge["criteria"]["overall"]
    assert overall["all"]["n"]["value"] == 90
    pearson = overall["all"]["pearson"]
    assert pearson["fisher_95"]["low"] < pearson["value"] < pearson["fisher_95"]["high"]
    assert pearson["bootstrap_95"]["low"] < pearson["value"] < pearson["bootstrap_95"]["high"]
    assert set(overall["groups"]) == {"SA", "PBL", "MSR"} and sum(g["n"]["value"] for g in overall["groups"].values()) == 90
    assert set(overall["system_level"]["models"]) == set(MODELS) and overall["system_level"]["kendall_tau_b"]["value"] is not None
    assert sum(overall["histogram"]["judge"]) == sum(overall["histogram"]["human"]) == 90
    assert overall["bias"]["residual_vs_answer_chars"]["n"] == 90
    ceiling = overall["ceiling"]
    assert ceiling["ids"] == ceiling["agreement"]["n"]["value"] == 45  # one pair per id rated twice, not each annotator vs the other
    assert judge["criteria"]["text_quality"]["ceiling"]["ids"] == 0
    coverage = judge["coverage"]
    assert (coverage["only_in_predictions"], coverage["only_in_predictions_first"]) == (2, ["SA_900", "SA_901"])
    assert (coverage["only_in_human"], coverage["only_in_human_first"], coverage["parse_failures"]) == (1, ["PBL_999"], 1)
    cal = judge["calibration"]
    assert cal["source"] == "expected_score" and cal["mse_after"]["value"] < cal["mse_before"]["value"]

    md = report_md(out)
    assert "| Pearson r [95% Fisher z] |" in md and "Cosine similarity is reported because MMIE reports it" in md
    assert "#### overall by category" in md and "| MSR |" in md and "## Calibration of the overall score" in md
    assert "1 record(s) with a null score (parse failures)" in md and "PBL_999" in md  # markdown shows ids literally
    assert "| statistic | judge | human ceiling |" in md and "human ceiling: 45 ids with two or more annotators (up to 2)" in md
    assert "human ceiling: no id compared with the judge has two annotators on this criterion" in md
    page = (out / "report.html").read_text()
    pngs = sorted(p.name for p in (out / "plots").glob("*.png"))
    assert pngs == ["groups.png", "judge_benchmark.png", "judge_confusion.png", "judge_histograms.png", "judge_reliability.png", "judge_scatter.png"]
    assert page.count("data:image/png;base64,") == len(pngs) and "<table>" in page and "src='plots" not in page
    assert all((out / "plots" / p).read_bytes().startswith(b"\x89PNG") for p in pngs)

    calibrator = Calibrator.load(out / "calibrator.json")
    assert calibrator.source == "expected_score" and calibrator.fitted_on.n == 90
    assert calibrator.apply(0) <= calibrator.apply(3) <= calibrator.apply(6)
    assert calibrator.x == cal["calibrator"]["x"]
    assert "judge overall: n 90, Pearson" in capsys.readouterr().out


@pytest.mark.slow
def test_flat_human_file_two_judges_linear_fit_and_a_collapsed_judge(files, tmp_path):
    preds, _, _ = files
    records = json.loads(Path(preds).read_text())
    flat = [{"id": r["id"], "overall": r["score"]} for r in records if r["score"] is not None]
    collapsed = [{"id": r["id"], "overall": 4} for r in records]
    human, other = write(tmp_path / "flat.json", flat), write(tmp_path / "collapsed.json", collapsed)
    out = tmp_path / "r"
    args = ["--predictions", preds, other, "--names", "a", "b", "--human", human, "--output_dir", str(out), "--bootstrap", "0", "--by", "none", "--fit", "linear"]
    assert main(args) == 0
    report = json.loads((out / "report.json").read_text(), parse_constant=no_nan)
    a, b = report["judges"]["a"]["criteria"]["overall"], report["judges"]["b"]["criteria"]["overall"]
    assert a["all"]["pearson"]["value"] == pytest.approx(1.0) and a["groups"] == {}
    assert a["bias"]["residual_vs_answer_chars"]["pearson"]["reason"].startswith("answer length unknown")
    assert a["bias"]["residual_vs_n_images"]["n"] == 90  # from the predictions' n_images
    assert b["collapse"] == "score collapse: standard deviation 0.000 < 0.1"
    assert b["all"]["pearson"] == {"value": None, "reason": "the judge's scores are constant", "fisher_95": None, "bootstrap_95": None}
    assert "Warning, b: score collapse" in report_md(out)
    assert Calibrator.load(out / "calibrator_a.json").method == "linear"
    assert Calibrator.load(out / "calibrator_b.json").y[0] == Calibrator.load(out / "calibrator_b.json").y[1]  # flat: no information
    assert Calibrator.load(out / "calibrator.json") == Calibrator.load(out / "calibrator_a.json")


@pytest.mark.slow
def test_ratings_without_their_samples_report_answer_diagnostics_undefined(files, tmp_path):
    """Annotation records as rating tools export them ({id, human_scores, annotator}): the same figures as
    the full annotations, except what needs the answer."""
    preds, human, _ = files
    ratings = [{k: v for k, v in r.items() if k not in ("question", "answer")} for r in json.loads(Path(human).read_text())]
    reports = {}
    for name, path in (("full", human), ("ratings", write(tmp_path / "ratings.json", ratings))):
        assert main(["--predictions", preds, "--human", path, "--output_dir", str(tmp_path / name), "--names", "judge", "--bootstrap", "0"]) == 0
        reports[name] = json.loads((tmp_path / name / "report.json").read_text(), parse_constant=no_nan)["judges"]["judge"]
    full, rated = reports["full"]["criteria"]["overall"], reports["ratings"]["criteria"]["overall"]
    assert rated["all"] == full["all"] and rated["ceiling"] == full["ceiling"] and rated["system_level"] == full["system_level"]
    assert reports["ratings"]["coverage"] == reports["full"]["coverage"]
    assert full["bias"]["residual_vs_answer_chars"]["n"] == 90
    assert rated["bias"]["residual_vs_answer_chars"]["n"] == 0
    assert rated["bias"]["residual_vs_answer_chars"]["pearson"]["reason"].startswith("answer length unknown")
    # Image counts come from the predictions' n_images then, as for flat records (the full annotations' answers have none).
    assert rated["bias"]["residual_vs_n_images"]["n"] == 90 and rated["bias"]["residual_vs_n_images"]["pearson"]["value"] is not None
    assert full["bias"]["residual_vs_n_images"]["pearson"]["value"] is None


def test_another_scale(tmp_path):
    rng = np.random.default_rng(1)
    human = rng.integers(1, 6, 40)
    preds = write(tmp_path / "p.json", [{"id": str(i), "overall": int(np.clip(h + rng.integers(-1, 2), 1, 5))} for i, h in enumerate(human)])
    flat = write(tmp_path / "h.json", [{"id": str(i), "overall": int(h)} for i, h in enumerate(human)])
    assert main(["--predictions", preds, "--human", flat, "--output_dir", str(tmp_path / "r"), "--scale", "1", "5", "--bootstrap", "0"]) == 0
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert report["judges"]["p"]["criteria"]["overall"]["histogram"]["levels"] == [1, 2, 3, 4, 5]
    assert report["judges"]["p"]["criteria"]["overall"]["all"]["quadratic_kappa"]["value"] > 0.5
    assert main(["--predictions", preds, "--human", flat, "--output_dir", str(tmp_path / "r"), "--scale", "1", "4"]) == 2


PRED = {"id": "SA_0", "score": 3}
ANNOTATED = {"id": "SA_0", "question": "q", "answer": "a", "human_scores": {"overall": 2}, "annotator": "x"}


@pytest.mark.parametrize(
    "side, records, message",
    [
        ("human", [{"id": "SA_0", "overall": 9}], "bad.json: record 0 (id 'SA_0'): overall: 9 is outside the scale 0-6"),
        ("human", [{"id": "SA_0", "overall": "good"}], "bad.json: record 0 (id 'SA_0'): overall: 'good' is not a number"),
        ("human", [{"id": "SA_0", "overall": 2}, {"id": "SA_0", "overall": 3}], "bad.json: record 1 (id 'SA_0'): duplicate id with different scores"),
        ("human", [{"id": "SA_0", "question": "q", "answer": "a", "human_scores": {"overall": 7}}],
         "bad.json: record 0 (id 'SA_0'): human_scores.overall: 7 is outside the scale 0-6"),
        ("human", [{"id": "SA_0", "text": "no score"}], "bad.json: record 0 (id 'SA_0'): no score"),
        ("human", [], "bad.json: no records"),
        ("human", [{"id": "elsewhere", "overall": 2}], "no id in common with"),
        ("predictions", [{"id": "SA_0", "score": 7}], "bad.json: record 0 (id 'SA_0'): score: 7 is outside the scale 0-6"),
        ("predictions", [{"id": "SA_0", "overall": 7}], "bad.json: record 0 (id 'SA_0'): overall: 7 is outside the scale 0-6"),
        ("predictions", [{"id": "SA_0", "score": 3, "criteria": {"text_quality": "high"}}],
         "bad.json: record 0 (id 'SA_0'): criteria.text_quality: 'high' is not a number"),
        ("predictions", [{"id": "SA_0", "score": 3, "overall": 4}], "bad.json: record 0 (id 'SA_0'): score: 3 disagrees with overall = 4"),
        ("predictions", [PRED, {"id": "SA_1", "verdict": 3}], "bad.json: record 1 (id 'SA_1'): no score: expected judge-score's 'score'"),
        ("predictions", [{**PRED, "expected_score": 3.2}, {**PRED, "expected_score": 2.9}],
         "bad.json: record 1 (id 'SA_0'): duplicate id with different scores than record 0"),
        ("predictions", [{**PRED, "model": 3}], "bad.json: record 0 (id 'SA_0'): model: must be a string, got 3"),
        ("human", [{"id": "SA_0", "overall": 2, "annotator": ["x"]}], "bad.json: record 0 (id 'SA_0'): annotator: must be a string, got ['x']"),
        ("human", [{"id": "SA_0", "overall": 2, "model": 1}], "bad.json: record 0 (id 'SA_0'): model: must be a string, got 1"),
        ("human", [{"id": "SA_0", "overall": 2, "annotator": "x"}, {"id": "SA_0", "overall": 3, "annotator": "x"}],
         "bad.json: record 1 (id 'SA_0'): duplicate id and annotator 'x' with different scores than record 0"),
        ("human", [ANNOTATED, {**ANNOTATED, "human_scores": {"overall": 3}}],
         "bad.json: record 1 (id 'SA_0'): duplicate id and annotator 'x' with different scores than record 0"),
        ("human", [{**ANNOTATED, "annotator": None}, {**ANNOTATED, "annotator": None, "human_scores": {"overall": 3}}],
         "bad.json: record 1 (id 'SA_0'): duplicate id with different scores than record 0; if these are two annotators, give each record an 'annotator'"),
        ("human", [{"id": "SA_0", "human_scores": {"overall": 7}, "annotator": "x"}], "bad.json: record 0 (id 'SA_0'): human_scores.overall: 7 is outside the scale 0-6"),
        ("human", [{"id": "SA_0", "human_scores": {"overal": 2}}], "bad.json: record 0 (id 'SA_0'): human_scores: no score: give at least one of overall"),
        ("human", [{"id": "SA_0", "human_scores": {"overall": 2, "clarity": 3}}], "bad.json: record 0 (id 'SA_0'): human_scores: unknown criterion 'clarity'"),
        ("human", [{"id": "SA_0", "human_scores": 2}], "bad.json: record 0 (id 'SA_0'): human_scores: must be an object of criterion: score, got int"),
        ("human", [{"human_scores": {"overall": 2}}], "bad.json: record 0: a record needs an 'id'"),
        ("human", [{"id": "SA_0", "question": "q", "human_scores": {"overall": 2}}], "bad.json: record 0 (id 'SA_0'): answer: Field required"),
        ("human", [{"id": "SA_0", "human_scores": {"overall": 2}, "annotator": "x"}, {**ANNOTATED, "human_scores": {"overall": 3}}],
         "bad.json: record 1 (id 'SA_0'): duplicate id and annotator 'x' with different scores than record 0"),
        ("predictions", [{"id": "SA_0", "score": 3, "expected_score": 6.5}], "bad.json: record 0 (id 'SA_0'): expected_score: 6.5 is outside"),
        ("predictions", [PRED, {"id": "SA_0", "score": 4}], "bad.json: record 1 (id 'SA_0'): duplicate id with different scores than record 0"),
        ("predictions", [{"id": "SA_0", "verdict": 3}], "bad.json: no scores found"),
        ("predictions", [{"score": 3}], "bad.json: record 0: a record needs an 'id'"),
        ("predictions", [{"id": "SA_0", "score": 3, "score_distribution": [0.5, 0.5]}],
         "bad.json: record 0 (id 'SA_0'): score_distribution: must be an object of level: probability, got list"),
        ("predictions", [{"id": "SA_0", "score": 3, "score_distribution": {"3": 0.5, "seven": 0.5}}],
         "bad.json: record 0 (id 'SA_0'): score_distribution: 'seven' is no level of the scale 0-6"),
        ("predictions", [{"id": "SA_0", "score": 3, "score_distribution": {"3": 1.5, "4": -0.5}}],
         "bad.json: record 0 (id 'SA_0'): score_distribution: the probability of '3' must be a number in 0-1, got 1.5"),
        ("predictions", [{"id": "SA_0", "score": 3, "score_distribution": {"3": True}}],
         "bad.json: record 0 (id 'SA_0'): score_distribution: the probability of '3' must be a number in 0-1, got True"),
        ("predictions", [{"id": "SA_0", "score": 3, "score_distribution": {"3": 0.5, "4": 0.4}}],
         "bad.json: record 0 (id 'SA_0'): score_distribution: the probabilities add up to 0.9, not 1 (within 0.00035, the rounding of 7 levels to 4 decimals)"),
        ("predictions", [{"id": "SA_0", "score": 3, "score_distribution": {"3": 0.4996, "4": 0.4999}}],
         "bad.json: record 0 (id 'SA_0'): score_distribution: the probabilities add up to 0.9995, not 1"),
    ],
)
def test_input_errors_exit_2_naming_file_and_id(files, tmp_path, capsys, side, records, message):
    preds, human, _ = files
    bad = write(tmp_path / "bad.json", records)
    paths = {"predictions": bad, "human": human} if side == "predictions" else {"predictions": preds, "human": bad}
    assert main(["--predictions", paths["predictions"], "--human", paths["human"], "--output_dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "r").exists()


def test_empty_files_and_every_problem_at_once(files, tmp_path, capsys):
    _, human, _ = files
    (tmp_path / "empty.json").write_text("")
    assert main(["--predictions", str(tmp_path / "empty.json"), "--human", human, "--output_dir", str(tmp_path / "r")]) == 2
    assert "empty.json: file is empty" in capsys.readouterr().err
    bad_human = write(tmp_path / "h.json", [{"id": "SA_0", "overall": -1}])
    bad_preds = write(tmp_path / "p.json", [{"id": "SA_0", "score": "x"}])
    assert main(["--predictions", bad_preds, "--human", bad_human, "--output_dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "h.json: record 0 (id 'SA_0'): overall: -1 is outside" in err and "p.json: record 0 (id 'SA_0'): score: 'x' is not a number" in err


@pytest.mark.slow
def test_identical_repeats_count_once_in_every_kind_of_file(files, tmp_path):
    preds, _, _ = files
    flat = [{"id": f"SA_{i}", "overall": i % 7} for i in (0, 3, 6, 9)]
    annotated = [{**ANNOTATED, "id": r["id"], "human_scores": {"overall": r["overall"]}} for r in flat]
    failed = {"id": "SA_3", "score": None}
    records = [r for r in json.loads(Path(preds).read_text()) if r["id"] != "SA_3"]
    judge = write(tmp_path / "p.json", records + [failed, failed])  # SA_3 failed to parse, written twice
    for name, human in (("flat", flat), ("annotated", annotated)):
        human = write(tmp_path / f"{name}.json", human * 2)
        assert main(["--predictions", judge, "--human", human, "--output_dir", str(tmp_path / name), "--bootstrap", "0", "--fit", "none"]) == 0
        overall = json.loads((tmp_path / name / "report.json").read_text())["judges"]["p"]
        assert overall["criteria"]["overall"]["all"]["n"]["value"] == 3 and overall["coverage"]["parse_failures"] == 2  # SA_900 and SA_3
        assert overall["criteria"]["overall"]["ceiling"]["ids"] == 0  # a repeat is not a second annotator


@pytest.mark.parametrize(
    "flags, message",
    [(["--names", "a", "b"], "--names has 2 name(s) for 1 predictions file(s)"), (["--scale", "6", "0"], "low < high"),
     (["--folds", "1"], "--folds must be at least 2"), (["--bootstrap", "-1"], "--bootstrap must be 0 or more")],
)
def test_bad_flags_exit_2(files, tmp_path, capsys, flags, message):
    preds, human, _ = files
    assert main(["--predictions", preds, "--human", human, "--output_dir", str(tmp_path / "r"), *flags]) == 2
    assert message in capsys.readouterr().err


def test_judge_names_that_give_one_file_name_are_a_usage_error(files, tmp_path, capsys):
    preds, human, _ = files
    assert main(["--predictions", preds, preds, "--names", "a b", "a_b", "--human", human, "--output_dir", str(tmp_path / "r")]) == 2
    assert "judge names ['a b', 'a_b'] give the same file names ['a_b', 'a_b']" in capsys.readouterr().err


def test_a_judge_without_any_overall_score_gets_undefined_figures_and_no_plots(files, tmp_path):
    preds, human, _ = files
    failed = write(tmp_path / "failed.json", [{"id": r["id"], "score": None} for r in json.loads(Path(preds).read_text())])
    out = tmp_path / "r"
    assert main(["--predictions", preds, failed, "--names", "good", "failed", "--human", human, "--output_dir", str(out), "--bootstrap", "0"]) == 0
    report = json.loads((out / "report.json").read_text(), parse_constant=no_nan)
    overall = report["judges"]["failed"]["criteria"]["overall"]
    assert overall["all"]["n"]["value"] == 0 and overall["all"]["pearson"]["reason"] == "n = 0 < 3"
    assert report["judges"]["failed"]["calibration"] is None
    assert sorted(p.name for p in (out / "plots").glob("*.png")) == [
        "good_benchmark.png", "good_confusion.png", "good_histograms.png", "good_reliability.png", "good_scatter.png", "groups.png"]
    assert "Intervals are 95%, Fisher z (no bootstrap: --bootstrap 0)." in report_md(out)


def test_a_criterion_asked_for_that_no_shared_id_has_is_an_error(files, tmp_path, capsys):
    preds, _, _ = files
    human = write(tmp_path / "h.json", [{"id": r["id"], "overall": r["score"]} for r in json.loads(Path(preds).read_text())])
    assert main(["--predictions", preds, "--human", human, "--output_dir", str(tmp_path / "r"), "--criteria", "overall", "text_quality"]) == 2
    assert "h.json: --criteria text_quality: no shared id is scored on it both here and in the predictions" in capsys.readouterr().err


def test_an_input_in_the_output_dir_under_an_outputs_name_is_never_overwritten(files, capsys):
    preds, human, tmp = files
    (tmp / "out").mkdir()
    (tmp / "out" / "report.json").write_text(Path(human).read_text())  # the human scores, saved where the report goes
    before = (tmp / "out" / "report.json").read_bytes()
    assert main(["--predictions", preds, "--human", str(tmp / "out" / "report.json"), "--output_dir", str(tmp / "out")]) == 2
    assert f"--human {tmp / 'out' / 'report.json'}: this run would overwrite" in capsys.readouterr().err
    assert (tmp / "out" / "report.json").read_bytes() == before and sorted(p.name for p in (tmp / "out").iterdir()) == ["report.json"]


@pytest.mark.slow
def test_every_calibration_module_imports_and_runs_without_torch(files):
    # A finder that refuses torch, so importing it fails as on a machine without it. (Setting
    # sys.modules["torch"] = None trips scipy's array-API check, which looks the module up by name.)
    preds, human, tmp = files
    code = (
        "import sys, importlib.abc\n"
        "class NoTorch(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name.split('.')[0] == 'torch': raise ImportError('torch is blocked')\n"
        "sys.meta_path.insert(0, NoTorch())\n"
        "import mmjudge.calibration, mmjudge.calibration.stats, mmjudge.calibration.fit, mmjudge.calibration.inputs, mmjudge.calibration.analysis, mmjudge.calibration.preferences\n"
        "import mmjudge.calibration.plots, mmjudge.calibration.report, mmjudge.calibration.cli, mmjudge.calibration.benchmark, mmjudge.calibration.conformal, mmjudge.judge.calibrator\n"
        f"assert mmjudge.calibration.cli.main(['--predictions', {preds!r}, '--human', {human!r}, '--output_dir', {str(tmp / 'r')!r}]) == 0\n"
        "assert 'torch' not in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp / "r" / "report.html").is_file()


def inst_it_log(path, scores: dict, invalid: set, split_of) -> str:
    """An Inst-It evaluate log (evaluate.py's layout, its misspelt key included) of question id -> score."""
    items = [{"question_id": q, "question": "q", "model_prediction": "a", "ground_truth": "g", "split": split_of(q),
              "score": 0 if q in invalid else s, "valid": q not in invalid, "error_in_gpt_eval": "Error" if q in invalid else "No Error."}
             for q, s in scores.items()]
    return write(path, {"accuracy": 48.5, "total_num": len(items), "valid_num": len(items) - len(invalid), "timestamp": "2025-01-02 03:04:05",
                        "gpt_prompt": "Score the response from 0 to 1.", "model_predictons": items})


def tenth(value: float) -> int:
    """The level index of a score on 0-1 in steps of 0.1, in decimal arithmetic: no float error to guard against."""
    return int((Decimal(repr(float(value))) * 10).to_integral_value(ROUND_HALF_EVEN))


def test_a_local_judge_against_gpt4o_on_inst_it_logs(tmp_path):
    rng = np.random.default_rng(5)
    ids = [f"{v:03d}-{q:02d}" for v in range(1, 13) for q in range(1, 5)] + [7, 101, 2000]  # video-style ids, then integers
    gpt = {q: round(float(k) * 0.1, 1) for q, k in zip(ids, rng.integers(0, 11, len(ids)))}
    local = {q: float(np.clip(s + rng.choice([-0.2, -0.1, 0, 0, 0.1, 0.3]), 0, 1)) for q, s in gpt.items()}  # float error kept: 0.30000000000000004
    gpt |= {"001-02": 0.85, "001-03": 0.33, "002-01": 0.05, "002-02": 0.35}  # GPT-4o's scores are not always on a level
    split_of = lambda q: "video" if isinstance(q, str) and q < "007" else "image"
    local_ids, gpt_ids = ids[:-1] + ["local-only"], list(reversed(ids[1:]))  # each side has an id the other lacks, in its own order
    local["local-only"] = 0.5
    local_log = inst_it_log(tmp_path / "local_log.json", {q: local[q] for q in local_ids}, {"003-02", "010-04"}, split_of)
    gpt_log = inst_it_log(tmp_path / "gpt4o_log.json", {q: gpt[q] for q in gpt_ids}, {"003-02", "005-01", 101}, split_of)
    out = tmp_path / "report"
    assert main(["--predictions", local_log, "--names", "local", "--human", gpt_log, "--output_dir", str(out),
                 "--scale", "0", "1", "--step", "0.1", "--bootstrap", "0"]) == 0

    report = json.loads((out / "report.json").read_text(), parse_constant=no_nan)
    assert (report["scale"], report["step"], report["criteria"]) == ([0, 1], 0.1, ["overall"])
    compared = [q for q in ids[1:-1] if q not in ("003-02", "010-04", "005-01", 101)]
    x, y = np.array([local[q] for q in compared]), np.array([gpt[q] for q in compared])
    kx, ky = np.array([tenth(v) for v in x]), np.array([tenth(v) for v in y])
    overall = report["judges"]["local"]["criteria"]["overall"]
    table = {name: stat["value"] for name, stat in overall["all"].items()}
    assert table["n"] == len(compared) == 45
    assert table["pearson"] == pytest.approx(sps.pearsonr(x, y).statistic)
    assert table["spearman"] == pytest.approx(sps.spearmanr(x, y).statistic)
    assert table["kendall_tau_b"] == pytest.approx(sps.kendalltau(x, y).statistic)
    assert (table["mse"], table["mae"]) == pytest.approx((np.mean((x - y) ** 2), np.mean(np.abs(x - y))))
    assert table["exact_agreement"] == pytest.approx(np.mean(kx == ky))
    assert table["within_1_agreement"] == pytest.approx(np.mean(np.abs(kx - ky) <= 1))
    assert table["quadratic_kappa"] == pytest.approx(cohen_kappa_score(kx, ky, weights="quadratic", labels=range(11)))
    assert overall["histogram"] == {"levels": pytest.approx([k / 10 for k in range(11)]),
                                    "judge": np.bincount(kx, minlength=11).tolist(), "human": np.bincount(ky, minlength=11).tolist()}
    assert {g: t["n"]["value"] for g, t in overall["groups"].items()} == Counter(split_of(q) for q in compared)
    assert overall["collapse"] is None
    reliability = report["judges"]["local"]["calibration"]["reliability_before"]
    assert [(v["judge_level"], v["n"]) for v in reliability] == [(k / 10, int((kx == k).sum())) for k in np.unique(kx)]
    assert overall["ceiling"]["agreement"]["pearson"]["reason"] == "n = 0 < 3"  # one annotator: GPT-4o

    coverage = report["judges"]["local"]["coverage"]
    assert (coverage["invalid"], coverage["invalid_first"]) == (2, ["003-02", "010-04"])
    assert (coverage["only_in_predictions_first"], coverage["only_in_human_first"]) == (["001-01", "local-only"], ["2000"])
    notes = "\n".join(report["notes"])
    assert f"3 item(s) of {gpt_log} marked valid: false" in notes and "left out: 003-02, 005-01, 101" in notes
    assert f"local: 2 item(s) of {local_log} marked valid: false" in notes
    assert "scale 0-1 in steps of 0.1" in report_md(out)
    pngs = sorted(p.name for p in (out / "plots").glob("*.png"))
    assert pngs == ["groups.png", "local_benchmark.png", "local_confusion.png", "local_histograms.png", "local_reliability.png", "local_scatter.png"]
    calibrator = Calibrator.load(out / "calibrator.json")
    assert calibrator.scale == (0, 1) and 0 <= calibrator.apply(0) <= calibrator.apply(0.5) <= calibrator.apply(1) <= 1


@pytest.mark.parametrize(
    "flags, message",
    [(["--scale", "0", "1", "--step", "0.3"], "--scale LOW HIGH, --step STEP: step 0.3 does not divide the scale 0-1 into whole steps"),
     (["--step", "0"], "a scale needs low < high and step > 0"), (["--scale", "0", "nan"], "a scale needs finite numbers"),
     # 60,000 levels: their confusion counts once asked for 26.8 GiB
     (["--step", "0.0001"], "--scale LOW HIGH, --step STEP: 0-6 in steps of 0.0001 is 60,000 steps; a scale has at most 1,000")],
)
def test_a_step_that_does_not_fit_the_scale_is_a_usage_error(files, tmp_path, capsys, flags, message):
    preds, human, _ = files
    assert main(["--predictions", preds, "--human", human, "--output_dir", str(tmp_path / "r"), *flags]) == 2
    assert message in capsys.readouterr().err and not (tmp_path / "r").exists()


def test_a_scale_of_tenths_that_float_division_gets_wrong_is_accepted(tmp_path):
    # 0.7 / 0.1 = 6.999999999999999: still 8 levels
    scores = [{"id": str(k), "overall": round(k * 0.1, 1)} for k in range(8)] * 2
    preds, human = write(tmp_path / "p.json", scores[:8]), write(tmp_path / "h.json", scores[8:])
    assert main(["--predictions", preds, "--human", human, "--output_dir", str(tmp_path / "r"), "--scale", "0", "0.7", "--step", "0.1", "--fit", "none"]) == 0
    overall = json.loads((tmp_path / "r" / "report.json").read_text())["judges"]["p"]["criteria"]["overall"]
    assert overall["histogram"]["judge"] == [1] * 8 and overall["all"]["exact_agreement"]["value"] == 1


def test_expected_scores_compare_where_no_written_score_parsed(tmp_path, capsys):
    """judge-score gives every generated record an expected score, read after a forced score heading where
    the judge's text did not parse: --overall expected_score compares those."""
    rng = np.random.default_rng(3)
    human = rng.integers(0, 7, 40)
    expected = np.clip(human + rng.normal(0, 1.0, 40), 0, 6)
    preds = [{"id": f"SA_{i}", "score": None, "criteria": {}, "expected_score": float(expected[i]), "parse_error": "no heading"} for i in range(40)]
    flat = [{"id": f"SA_{i}", "overall": int(human[i])} for i in range(40)]
    (tmp_path / "p.json").write_text(json.dumps(preds))
    (tmp_path / "h.json").write_text(json.dumps(flat))
    args = ["--predictions", str(tmp_path / "p.json"), "--human", str(tmp_path / "h.json"), "--bootstrap", "0"]
    assert main([*args, "--output_dir", str(tmp_path / "written")]) == 2  # no written score to compare, and the message says why
    err = capsys.readouterr().err
    assert "no criterion is scored both here and in the predictions" in err
    assert "every one of the 40 record(s) of " in err and "has a null score" in err and "--overall expected_score" in err
    assert main([*args, "--output_dir", str(tmp_path / "r"), "--overall", "expected_score"]) == 0
    assert "null" not in capsys.readouterr().err  # each record has its expected score: none is left out
    report = json.loads((tmp_path / "r" / "report.json").read_text(), parse_constant=no_nan)
    assert report["overall"] == "expected_score"
    overall = report["judges"]["p"]["criteria"]["overall"]["all"]
    assert overall["n"]["value"] == 40
    assert overall["pearson"]["value"] == pytest.approx(sps.pearsonr(expected, human).statistic)
    assert report["judges"]["p"]["calibration"]["source"] == "expected_score"
    assert "The judge's overall value is its expected score" in report_md(tmp_path / "r")


def megabench_scored(path, tasks: dict[str, list[float]]) -> str:
    """A MEGA-Bench scored file as its evaluator writes it: per query, the judged field's N/10, its info, and
    the query's score (the same N/10: one field)."""
    query = lambda s: {"response": "r", "scores": {"field": {"reference": s}, "info": {"reference": f"Score: {round(s * 10)}; Explanation: ok"},  # noqa: E731
                                                   "query": s}}
    data = [{"task_name": name, "eval_type": "llm", "query_response": [query(s) for s in scores]} for name, scores in tasks.items()]
    path.write_text(json.dumps({"data": data}))
    return str(path)


def test_a_local_judge_against_gpt4o_on_megabench(tmp_path, capsys):
    rng = np.random.default_rng(9)
    gpt = {name: [int(v) / 10 for v in rng.integers(0, 11, 6)] for name in ("poetry", "meme_explain", "story")}
    records = [{"id": f"{name}/{k}", "score": int(np.clip(round(s * 10) + rng.choice([-1, 0, 0, 1]), 0, 10)), "category": f"megabench/{name}"}
               for name, scores in gpt.items() for k, s in enumerate(scores)]
    (tmp_path / "eval_result.json").write_text(json.dumps(records))
    human = megabench_scored(tmp_path / "data_with_scores_open.json", gpt)
    out = tmp_path / "report"
    args = ["--predictions", str(tmp_path / "eval_result.json"), "--human", human, "--bootstrap", "0", "--fit", "none"]
    assert main([*args, "--output_dir", str(out), "--scale", "0", "10"]) == 0
    overall = json.loads((out / "report.json").read_text(), parse_constant=no_nan)["judges"]["eval_result"]["criteria"]["overall"]["all"]
    x = np.array([r["score"] for r in records], dtype=float)
    y = np.array([s * 10 for scores in gpt.values() for s in scores])
    assert overall["n"]["value"] == 18 and overall["pearson"]["value"] == pytest.approx(sps.pearsonr(x, y).statistic)
    assert overall["exact_agreement"]["value"] == pytest.approx(np.mean(x == y))
    # the 0-1 query scores read on the judge's 0-10: on MMIE's default 0-6 most are out of scale
    assert main([*args, "--output_dir", str(tmp_path / "r6")]) == 2
    assert "scores.field.reference x 10" in capsys.readouterr().err
    broken = megabench_scored(tmp_path / "unscored.json", {"poetry": [0.5]})
    content = json.loads(Path(broken).read_text())
    del content["data"][0]["query_response"][0]["scores"]
    Path(broken).write_text(json.dumps(content))
    assert main(["--predictions", str(tmp_path / "eval_result.json"), "--human", broken, "--output_dir", str(tmp_path / "r"), "--scale", "0", "10"]) == 2
    assert "data[0].query_response[0]: no scores.query number" in capsys.readouterr().err


def test_a_rerun_that_fits_no_map_removes_the_earlier_calibrator_and_says_none_applies(files):
    preds, human, tmp = files
    out = tmp / "rerun"
    base = ["--predictions", preds, "--human", human, "--output_dir", str(out), "--names", "judge", "--bootstrap", "0", "--by", "none"]
    assert main(base) == 0
    assert (out / "calibrator.json").exists()
    assert main([*base, "--fit", "none"]) == 0
    assert not (out / "calibrator.json").exists()
    text = report_md(out)
    assert "is what judge-score --calibrator applies" not in text
    assert "No calibrator.json was written (--fit none). An earlier run's calibrator.json in this directory was removed." in text


def test_judge_names_reach_the_markdown_and_the_html_escaped(files):
    preds, human, tmp = files
    name = "<img src=x onerror=alert(1)>|*j*"
    out = tmp / "names"
    assert main(["--predictions", preds, "--human", human, "--output_dir", str(out), "--names", name, "--bootstrap", "0", "--by", "none"]) == 0
    md, page = report_md(out), (out / "report.html").read_text()
    assert "<img src=x" not in md and "&lt;img src=x onerror=alert(1)>\\|\\*j\\*" in md
    assert "<img src=x" not in page and "&lt;img src=x onerror=alert(1)&gt;|*j*" in page


MODEL_MEANS = {"strong": 4.5, "middling": 3.2, "weak": 2.0}


def leaderboard_files(tmp_path, per_model=400, labelled=60, bias=0.8, seed=5):
    """judge-score records of three models, every id judged with a score distribution, and people's scores
    for a random `labelled` of each model's ids: the predictions cover far more ids than the human file."""
    rng = np.random.default_rng(seed)
    preds, human = [], []
    for model, mean in MODEL_MEANS.items():
        truth = np.clip(np.rint(rng.normal(mean, 1.1, per_model)), 0, 6)
        centre = truth + bias + rng.normal(0, 0.6, per_model)
        logits = -1.5 * (np.arange(7)[None, :] - centre[:, None]) ** 2
        p = np.exp(logits - logits.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        for i in range(per_model):
            rid = f"{model}_{i}"
            distribution = {str(k): float(v) for k, v in enumerate(p[i])}
            preds.append({"id": rid, "model": model, "category": "SA", "score": int(p[i].argmax()), "criteria": {},
                          "score_distribution": distribution, "expected_score": float(p[i] @ np.arange(7))})
        for i in rng.choice(per_model, labelled, replace=False):
            human.append({"id": f"{model}_{i}", "model": model, "overall": int(truth[i])})
    return write(tmp_path / "eval_result.json", preds), write(tmp_path / "human.json", human)


def test_benchmark_scores_score_sets_and_escalation_from_a_predictions_file_far_larger_than_the_human_file(tmp_path):
    preds, human = leaderboard_files(tmp_path)
    out = tmp_path / "r"
    args = ["--predictions", preds, "--human", human, "--output_dir", str(out), "--names", "j", "--bootstrap", "300", "--by", "none"]
    assert main(args) == 0
    judge = json.loads((out / "report.json").read_text(), parse_constant=no_nan)["judges"]["j"]
    benchmark = judge["benchmark"]
    assert list(benchmark["models"]) == sorted(MODEL_MEANS) and benchmark["ranking"]["order"] == ["strong", "middling", "weak"]
    assert 0.9 < benchmark["ranking"]["holds"] <= 1 and len(benchmark["ranking"]["above_next"]) == 2
    for model, s in benchmark["models"].items():
        assert (s["human_scored"], s["judge_only_ids"]) == (60, 340)
        ppi, human_only, judge_only = s["ppi"], s["human_only"], s["judge_only"]
        assert ppi["high"] - ppi["low"] < human_only["high"] - human_only["low"]  # the judge's ids narrow it
        assert judge_only["value"] > ppi["value"] + 0.4  # the judge is 0.8 too generous; PPI++ is not
        assert s["effective_labels"] > 60 and 0 < s["lam"] <= 1
    sets, escalation = judge["calibration"]["score_sets"], judge["calibration"]["escalation"]
    assert sets["n"] == 180 and sets["held_out"]["coverage"] == pytest.approx(0.9, abs=0.06) and 1 <= sets["held_out"]["mean_size"] < 7
    assert escalation["agreement"] == "within_1" and escalation["judged"] == 1200
    calibrator = Calibrator.load(out / "calibrator.json")
    assert calibrator.score_sets.threshold == sets["threshold"] and calibrator.score_sets.coverage == 0.9
    assert calibrator.escalation.threshold == escalation["fit"]["threshold"]
    records = json.loads(Path(preds).read_text())
    assert sum(calibrator.escalate(r["score"], r["score_distribution"]) for r in records) == escalation["escalated"]
    md = report_md(out)
    assert "## Benchmark scores per evaluated model" in md and "ranking by PPI++: strong > middling > weak" in md
    assert "## Score sets and escalation" in md and "PPI++" in md
    assert (out / "plots" / "j_benchmark.png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize("decimals", [6, 5, 4])
def test_score_distributions_rounded_as_people_write_them_are_read_renormalised(tmp_path, decimals):
    """Seven levels rounded to 6 decimals add up to 1 within 3.5e-6, which a tolerance of 1e-6 refused: 247 of
    600 records ('the probabilities add up to 1, not 1'), in either --overall."""
    preds, human = leaderboard_files(tmp_path, per_model=200)
    records = json.loads(Path(preds).read_text())
    for r in records:
        r["score_distribution"] = {level: round(p, decimals) for level, p in r["score_distribution"].items()}
    rounded = write(tmp_path / "rounded.json", records)
    assert sum(abs(sum(r["score_distribution"].values()) - 1) > 1e-6 for r in records) > 100
    for flags in ([], ["--overall", "expected_score", "--agreement", "exact"]):
        out = tmp_path / f"r{len(flags)}"
        assert main(["--predictions", rounded, "--human", human, "--output_dir", str(out), "--names", "j", "--bootstrap", "0", "--by", "none", *flags]) == 0
        assert json.loads((out / "report.json").read_text())["judges"]["j"]["calibration"]["escalation"]["judged"] == 600
    read = read_predictions(rounded, ScoreScale()).records
    assert all(abs(sum(r.score_distribution.values()) - 1) < 1e-12 for r in read.values())


def test_coverage_and_target_agreement_are_checked(files, tmp_path, capsys):
    preds, human, _ = files
    for flags in (["--coverage", "1"], ["--target_agreement", "0"]):
        assert main(["--predictions", preds, "--human", human, "--output_dir", str(tmp_path / "x"), *flags]) == 2
        assert f"{flags[0]} must lie between 0 and 1 (exclusive), got {float(flags[1])}" in capsys.readouterr().err


def test_a_judge_close_to_people_is_trusted_on_most_records_and_the_calibrator_marks_the_same_ones(tmp_path):
    preds, human = leaderboard_files(tmp_path, bias=0.3)
    out = tmp_path / "r"
    assert main(["--predictions", preds, "--human", human, "--output_dir", str(out), "--names", "j", "--bootstrap", "0", "--by", "none"]) == 0
    escalation = json.loads((out / "report.json").read_text())["judges"]["j"]["calibration"]["escalation"]
    fit = escalation["fit"]
    assert fit["threshold"] is not None and fit["trusted"] >= 30 and fit["agreement_lower_bound"] >= 0.9
    calibrator = Calibrator.load(out / "calibrator.json")
    decisions = [calibrator.escalate(r["score"], r["score_distribution"]) for r in json.loads(Path(preds).read_text())]
    assert sum(decisions) == escalation["escalated"] < len(decisions) / 2
    assert f"| {fit['threshold']:.3f} | {fit['trusted']} of {fit['n']} |" in report_md(out)


def test_a_score_distribution_on_a_scale_of_tenths_is_named_not_misread(tmp_path, capsys):
    preds = write(tmp_path / "p.json", [{"id": "a", "score": 0.3, "score_distribution": {"0": 0.5, "1": 0.5}}])
    human = write(tmp_path / "h.json", [{"id": "a", "overall": 0.3}])
    assert main(["--predictions", preds, "--human", human, "--output_dir", str(tmp_path / "r"), "--scale", "0", "1", "--step", "0.1"]) == 2
    assert ("p.json: record 0 (id 'a'): score_distribution: a score distribution is read on a scale of whole numbers in steps of 1, "
            "not 0-1 in steps of 0.1") in capsys.readouterr().err


def test_calibrator_of_names_the_judge_whose_map_is_calibrator_json(files, tmp_path, capsys):
    preds, human, _ = files
    records = json.loads(Path(preds).read_text())
    trained = write(tmp_path / "trained.json", [{**r, "score": None if r["score"] is None else min(6, r["score"] + 1), "expected_score": None}
                                                for r in records])
    out = tmp_path / "r"
    base = ["--predictions", preds, trained, "--names", "before", "after", "--human", human, "--bootstrap", "0", "--by", "none"]
    assert main([*base, "--output_dir", str(out), "--calibrator_of", "after"]) == 0
    assert Calibrator.load(out / "calibrator.json") == Calibrator.load(out / "calibrator_after.json") != Calibrator.load(out / "calibrator_before.json")
    assert "calibrator.json (after's map" in report_md(out)
    assert main([*base, "--output_dir", str(tmp_path / "r2"), "--calibrator_of", "trained"]) == 2
    assert "--calibrator_of trained: no judge of that name; the judges are before, after" in capsys.readouterr().err


def test_a_score_of_hundreds_of_digits_is_outside_the_scale_not_a_crash(tmp_path, capsys):
    """An integer no float holds (10**400) crashed the finiteness check with OverflowError."""
    (tmp_path / "p.json").write_text('[{"id": "SA_1", "score": 1' + "0" * 400 + '}, {"id": "SA_2", "score": 3}]')
    (tmp_path / "h.json").write_text(json.dumps([{"id": "SA_1", "overall": 3}, {"id": "SA_2", "overall": 3}]))
    assert main(["--predictions", str(tmp_path / "p.json"), "--human", str(tmp_path / "h.json"), "--output_dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "record 0 (id 'SA_1'): score: 1000" in err and "is outside the scale 0-6" in err and "internal failure" not in err
