"""The right calibrator, or a refusal: judge-score stamps each record with its judge's and rubric's fingerprints,
judge-calibrate writes them into calibrator.json, and judge-score --calibrator refuses a map fitted on another
judge or rubric (before the model loads) unless told --allow_calibrator_mismatch."""

import json
import shutil
from pathlib import Path

import pytest
from safetensors.numpy import load_file, save_file

from mmjudge.calibration.cli import main as calibrate_main
from mmjudge.configs import CONFIG_DIR
from mmjudge.infer.cli import main as score_main
from mmjudge.judge.calibrator import Calibrator, FittedOn
from mmjudge.judge.identity import rubric_fingerprint, weights_fingerprint
from mmjudge.judge.model import weight_files
from mmjudge.judge.prompts import load_rubrics
from mmjudge.judge.testing import write_dataset, write_original_checkpoint

FAST = ["--mode", "logits", "--max_tiles", "1", "--workers", "1"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("data"), 9, seed=3, annotated=True).parent


@pytest.fixture(scope="module")
def other(tmp_path_factory):
    """A judge of the same architecture with other weights: a stand-in for the trained judge."""
    return write_original_checkpoint(tmp_path_factory.mktemp("other"), seed=1)


def score(model, data, out, *extra):
    return score_main(["--model_path", str(model), "--input_dir", str(data), "--input_file", "data.json", "--output_dir", str(out), *FAST, *extra])


def test_the_fingerprint_follows_the_weights_not_the_files(checkpoint, other, tmp_path):
    fingerprint = weights_fingerprint(weight_files(checkpoint))
    assert weights_fingerprint(weight_files(other)) != fingerprint
    shutil.copytree(checkpoint, tmp_path / "moved")  # a copy elsewhere, other file times
    assert weights_fingerprint(weight_files(tmp_path / "moved")) == fingerprint
    resharded = write_original_checkpoint(tmp_path / "sharded", seed=0, shards=3)
    assert len(list(resharded.glob("*.safetensors"))) == 3 and weights_fingerprint(weight_files(resharded)) == fingerprint
    # one tensor changed in its middle, as training changes it throughout
    weights = load_file(tmp_path / "moved" / "model.safetensors")
    name = max(weights, key=lambda k: weights[k].size)
    weights[name] = weights[name].copy()
    weights[name].flat[weights[name].size // 2:] += 0.01
    save_file(weights, tmp_path / "moved" / "model.safetensors")
    assert weights_fingerprint(weight_files(tmp_path / "moved")) != fingerprint


def test_an_adapters_fingerprint_is_its_weights_and_its_bases(checkpoint, other, tmp_path):
    from peft import LoraConfig, get_peft_model

    from mmjudge.judge.model import load_judge

    model = get_peft_model(load_judge(checkpoint).model, LoraConfig(r=2, target_modules=r".*language_model.*\.(qkv_proj|o_proj)"))
    model.save_pretrained(tmp_path / "adapter")
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    for base in (checkpoint, other):  # the same adapter file over two bases
        (tmp_path / "adapter" / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": str(base)}))
        assert weight_files(tmp_path / "adapter") == [tmp_path / "adapter" / "adapter_model.safetensors", base / "model.safetensors"]
    over_other = weights_fingerprint(weight_files(tmp_path / "adapter"))
    (tmp_path / "adapter" / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": str(checkpoint)}))
    over_checkpoint = weights_fingerprint(weight_files(tmp_path / "adapter"))
    assert len({over_other, over_checkpoint, weights_fingerprint(weight_files(checkpoint))}) == 3


def test_records_name_their_judge_and_rubric_and_calibrate_writes_them_into_the_calibrator(checkpoint, data, tmp_path):
    assert score(checkpoint, data, tmp_path / "scores") == 0
    records = json.loads((tmp_path / "scores" / "eval_result.json").read_text())
    rubrics = load_rubrics()
    assert {r["judge_fingerprint"] for r in records} == {weights_fingerprint(weight_files(checkpoint))}
    assert all(r["rubric_fingerprint"] == rubric_fingerprint(rubrics[r["category"]]) for r in records)
    assert calibrate_main(["--predictions", str(tmp_path / "scores" / "eval_result.json"), "--human", str(data / "data.json"), "--overall",
                           "expected_score", "--bootstrap", "0", "--output_dir", str(tmp_path / "report")]) == 0
    fitted = Calibrator.load(tmp_path / "report" / "calibrator.json").fitted_on
    assert fitted.judge_fingerprint == weights_fingerprint(weight_files(checkpoint))
    assert fitted.rubric_fingerprints == {c: rubric_fingerprint(rubrics[c]) for c in sorted({r["category"] for r in records})}


@pytest.fixture
def calibrator(checkpoint, tmp_path):
    """A map fitted on `checkpoint`'s scores with MMIE's rubrics, as judge-calibrate writes it."""
    rubrics = load_rubrics()
    fitted = FittedOn(n=9, predictions="scores-before/eval_result.json", judge_fingerprint=weights_fingerprint(weight_files(checkpoint)),
                      rubric_fingerprints={c: rubric_fingerprint(r) for c, r in rubrics.items()})
    Calibrator(method="linear", source="expected_score", x=[0, 6], y=[1, 5], scale=(0, 6), fitted_on=fitted).save(tmp_path / "calibrator.json")
    return tmp_path / "calibrator.json"


def test_a_calibrator_of_another_judge_is_refused_before_the_model_loads(other, data, calibrator, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("mmjudge.judge.model.load_judge", lambda *_: pytest.fail("the model loaded"))
    assert score(other, data, tmp_path / "out", "--calibrator", str(calibrator)) == 2
    err = capsys.readouterr().err
    assert f"--calibrator {calibrator} does not fit --model_path {other}: it was fitted on another judge's scores: weights " in err
    assert f"{weights_fingerprint(weight_files(other))}" in err and "(the judge of scores-before/eval_result.json)" in err
    assert "--allow_calibrator_mismatch" in err and not (tmp_path / "out" / "eval_result.json").exists()


def test_a_calibrator_of_another_rubric_is_refused(checkpoint, data, calibrator, tmp_path, capsys):
    rubric = (CONFIG_DIR / "rubrics" / "sa.yaml").read_text().replace("Text quality", "Quality of the text")
    (tmp_path / "rubrics").mkdir()
    (tmp_path / "rubrics" / "sa.yaml").write_text(rubric)
    for name in ("pbl.yaml", "msr.yaml"):
        shutil.copy(CONFIG_DIR / "rubrics" / name, tmp_path / "rubrics" / name)
    assert score(checkpoint, data, tmp_path / "out", "--calibrator", str(calibrator), "--rubric", str(tmp_path / "rubrics")) == 2
    assert "rubric 'SA' is not the one it was fitted on" in capsys.readouterr().err


def test_a_mismatch_allowed_is_applied_and_said_and_the_right_judge_is_silent(checkpoint, other, data, calibrator, tmp_path, capsys):
    assert score(other, data, tmp_path / "allowed", "--calibrator", str(calibrator), "--allow_calibrator_mismatch") == 0
    warning = "applied although it was fitted on another judge's scores"
    assert warning in capsys.readouterr().err
    assert any(warning in w for w in json.loads((tmp_path / "allowed" / "summary.json").read_text())["warnings"])
    assert all(r["calibrated_score"] is not None for r in json.loads((tmp_path / "allowed" / "eval_result.json").read_text()))
    assert score(checkpoint, data, tmp_path / "right", "--calibrator", str(calibrator)) == 0
    assert "--calibrator" not in capsys.readouterr().err and json.loads((tmp_path / "right" / "summary.json").read_text())["warnings"] == []


def test_a_calibrator_that_names_no_judge_is_applied_with_a_warning(checkpoint, data, tmp_path, capsys):
    Calibrator(method="linear", source="expected_score", x=[0, 6], y=[1, 5], scale=(0, 6)).save(tmp_path / "old.json")
    assert score(checkpoint, data, tmp_path / "out", "--calibrator", str(tmp_path / "old.json")) == 0
    assert "applied unchecked: it does not say which judge it was fitted on" in capsys.readouterr().err


def test_the_python_api_stamps_its_records_and_refuses_another_judges_calibrator(other, data, calibrator):
    import mmjudge
    from mmjudge.judge.data import UsageError

    judge = mmjudge.Judge.load(other, mode="logits", max_tiles=1)
    assert judge.fingerprint == weights_fingerprint(weight_files(other))
    with pytest.raises(UsageError, match=f"does not fit the judge {other}: it was fitted on another judge's scores"):
        judge.score(data / "data.json", calibrator=calibrator, progress=False)
    with pytest.warns(UserWarning, match="applied although it was fitted on another judge's scores"):
        records = judge.score(data / "data.json", calibrator=calibrator, allow_calibrator_mismatch=True, progress=False)
    assert {r["judge_fingerprint"] for r in records} == {judge.fingerprint} and all(r["calibrated_score"] is not None for r in records)
