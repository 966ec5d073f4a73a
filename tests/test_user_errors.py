"""The user errors a red-team pass found ending in a traceback (issue 17, item 12), each through its command
as the console script runs it: exit 2 and one line naming the file, found before a model is used. (A full
disk and a directory that cannot be written: tests/judge/test_outputs.py and tests/infer/test_score.py,
which simulate them, since root writes anywhere.)"""

import json
import shutil

import pytest
import yaml

from mmjudge.calibration.cli import main as calibrate_main
from mmjudge.infer.cli import main as score_main
from mmjudge.configs import CONFIG_DIR
from mmjudge.judge.testing import write_dataset
from mmjudge.train.cli import main as train_main


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("data"), 2, seed=0).parent


@pytest.fixture(scope="module")
def annotations(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("annotations"), 2, seed=0, annotated=True)


def truncated(ckpt):
    weights = ckpt / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    return weights


def emptied(ckpt):
    (ckpt / "model.safetensors").write_bytes(b"")
    return ckpt / "model.safetensors"


def mistyped(ckpt):
    config = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps({**config, "max_dynamic_patch": "six"}))
    return ckpt / "config.json"


def own_base(ckpt):
    adapter = ckpt.parent / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "base_model_name_or_path": str(adapter)}))
    return adapter


@pytest.mark.parametrize("damage", [truncated, emptied, mistyped, own_base])
def test_a_damaged_checkpoint_is_one_line(checkpoint, dataset, tmp_path, capsys, damage):
    ckpt = shutil.copytree(checkpoint, tmp_path / "ckpt")
    named = damage(ckpt)
    code = score_main(["--model_path", str(named if named.is_dir() else ckpt), "--input_dir", str(dataset), "--input_file", "data.json",
                       "--output_dir", str(tmp_path / "out")])
    assert_one_line(code, capsys.readouterr().err, named)


def nested(path):
    path.write_text("[" * 100_000 + "]" * 100_000)


def long_id(path):
    records = json.loads(path.read_text())
    path.write_text(json.dumps(records).replace(json.dumps(records[0]["id"]), "7" * 5000, 1))


@pytest.mark.parametrize("damage", [nested, long_id])
def test_a_hostile_input_file_is_one_line(dataset, tmp_path, capsys, damage):
    data = tmp_path / "data.json"
    shutil.copy(dataset / "data.json", data)
    damage(data)
    code = score_main(["--model_path", str(tmp_path / "no-model"), "--input_dir", str(dataset), "--input_file", str(data),
                       "--output_dir", str(tmp_path / "out")])
    assert_one_line(code, capsys.readouterr().err, data)


def alias_bomb(path):
    path.write_text("a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
                                                                      for p, c in zip("abcdefgh", "bcdefghi")))
    return "--config"


def huge_rubric(path):
    rubric = yaml.safe_load((CONFIG_DIR / "rubrics" / "sa.yaml").read_text())
    path.write_text(yaml.safe_dump(rubric) + "# " + "x" * 30_000_000 + "\n")
    return "--rubric"


@pytest.mark.parametrize("damage", [alias_bomb, huge_rubric])
def test_a_hostile_yaml_file_is_one_line(dataset, tmp_path, capsys, damage):
    path = tmp_path / "file.yaml"
    flag = damage(path)
    code = score_main(["--model_path", str(tmp_path / "no-model"), "--input_dir", str(dataset), "--input_file", "data.json",
                       "--output_dir", str(tmp_path / "out"), flag, str(path)])
    err = capsys.readouterr().err
    assert_one_line(code, err, path)
    assert len(err) < 500


def test_a_mistyped_training_setting_is_one_line(annotations, tmp_path, capsys):
    config = yaml.safe_load((CONFIG_DIR / "train" / "tiny.yaml").read_text())
    (tmp_path / "train.yaml").write_text(yaml.safe_dump({**config, "lora_r": "four"}))
    code = train_main(["--model_path", str(tmp_path), "--train_file", str(annotations), "--input_dir", str(annotations.parent),  # a folder: refused first
                       "--output_dir", str(tmp_path / "out"), "--config", str(tmp_path / "train.yaml")])
    assert_one_line(code, capsys.readouterr().err, tmp_path / "train.yaml")


def test_a_step_finer_than_any_rating_scale_is_one_line(annotations, tmp_path, capsys):
    scores = [{"id": s["id"], "score": 3} for s in json.loads(annotations.read_text())]
    (tmp_path / "pred.json").write_text(json.dumps(scores))
    code = calibrate_main(["--predictions", str(tmp_path / "pred.json"), "--human", str(annotations),
                           "--output_dir", str(tmp_path / "out"), "--step", "0.0001"])
    assert_one_line(code, capsys.readouterr().err, "--step")


def assert_one_line(code, err, named):
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: ") and str(named) in err, err[-2000:]


def test_replicas_without_ray_are_refused_naming_the_extra(monkeypatch, tmp_path, capsys):
    """judge-serve --replicas without the ray extra: exit 2 naming what to install, before the judge loads."""
    import sys

    from mmjudge.serve.cli import main as serve_main
    from mmjudge.serve.process import free_port

    monkeypatch.setitem(sys.modules, "mmjudge.ray.serve", None)  # as where ray is not installed
    assert serve_main(["--model_path", str(tmp_path), "--replicas", "2", "--port", str(free_port())]) == 2
    assert "pip install 'mmjudge[ray]'" in capsys.readouterr().err
