"""Bundled files by name (issue 27, item 4): `--config tiny`, `--deepspeed zero2`, `--rubric tiny` and every other
bundled preset name the package's own file from any working directory (these tests run in a folder under
/tmp, outside the checkout); a path still works; a name that is also a file here is the bundled one, with a
note; --help lists the names; judge-rubric import -o makes the folders it needs."""

import subprocess
import sys
from pathlib import Path

import pytest

from mmjudge.configs import CONFIG_DIR, KINDS, bundled
from mmjudge.infer.cli import build_parser as score_parser
from mmjudge.infer.cli import main as score_main
from mmjudge.judge.rubric_cli import main as rubric_main
from mmjudge.judge.testing import HANG_S, write_dataset
from mmjudge.serve.cli import build_parser as serve_parser
from mmjudge.train.cli import build_parser as train_parser
from mmjudge.train.cli import main as train_main

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

# The flags that take a bundled file, by command: (parser, the flag, the kind of file, the arguments it needs besides).
FLAGS = [(score_parser, "--config", "score"), (score_parser, "--rubric", "rubrics"), (train_parser, "--config", "train"),
         (train_parser, "--rubric", "rubrics"), (train_parser, "--deepspeed", "deepspeed"), (serve_parser, "--config", "score"),
         (serve_parser, "--rubric", "rubrics")]


@pytest.fixture
def elsewhere(tmp_path, monkeypatch):
    """A working directory under /tmp, outside the checkout, holding an annotation file and its image folder."""
    assert not tmp_path.is_relative_to(ROOT)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data.json").write_text("[]")
    return tmp_path


def required(parser) -> list[str]:
    return {"judge-score": ["--model_path", "m", "--input_dir", ".", "--input_file", "data.json"],
            "judge-train": ["--model_path", "m", "--train_file", "data.json", "--input_dir", ".", "--output_dir", "out"],
            "judge-serve": ["--model_path", "m"]}[parser.prog]


def test_every_bundled_kind_has_files():
    for kind in KINDS:
        assert bundled(kind), kind
    assert sorted(bundled("deepspeed")) == ["zero2", "zero3", "zero3_offload"]
    assert bundled("rubrics")["tiny"] == CONFIG_DIR / "rubrics" / "tiny" and bundled("train")["tiny"] == CONFIG_DIR / "train" / "tiny.yaml"


@pytest.mark.parametrize("build, flag, kind", FLAGS, ids=[f"{b.__module__.split('.')[1]} {f}" for b, f, _ in FLAGS])
def test_each_bundled_name_is_the_packages_file_from_any_folder(elsewhere, build, flag, kind):
    parser = build()
    for name, path in bundled(kind).items():
        args = parser.parse_args([*required(parser), flag, name])
        value = getattr(args, flag.lstrip("-"))
        assert value == ([str(path)] if flag == "--rubric" else str(path)), name
        assert path.is_relative_to(CONFIG_DIR) and path.exists()
    assert f"bundled by name: {', '.join(bundled(kind))}" in " ".join(parser.format_help().split())


def test_a_path_still_works_and_a_name_here_too_is_the_bundled_one(elsewhere, capsys):
    (elsewhere / "mine.yaml").write_text("max_new_tokens: 7\n")
    (elsewhere / "tiny").mkdir()  # a folder of the user's that a bundled rubric set is also called
    args = score_parser().parse_args([*required(score_parser()), "--config", "mine.yaml", "--rubric", "tiny", "./tiny", "sa"])
    assert args.config == "mine.yaml"
    assert args.rubric == [str(CONFIG_DIR / "rubrics" / "tiny"), "./tiny", str(CONFIG_DIR / "rubrics" / "sa.yaml")]
    assert "note: --rubric tiny is the bundled tiny; for the tiny here, write ./tiny" in capsys.readouterr().err


def test_a_missing_name_lists_the_bundled_ones(elsewhere, capsys):
    assert score_main([*required(score_parser()), "--config", "configs/score/milebench.yaml"]) == 2
    assert capsys.readouterr().err == ("error: --config configs/score/milebench.yaml: file not found; "
                                       "bundled by name: instit, megabench, milebench, mmrb2, opening, vlrewardbench\n")


def test_judge_train_runs_on_bundled_presets_from_another_folder(elsewhere, capsys):
    """Everything resolved and read (the preset, the DeepSpeed config, the rubrics, the annotations): the run
    stops only at the base judge, which is not there."""
    write_dataset(elsewhere, 4, seed=0, annotated=True)  # ./data.json and ./images/
    args = ["--model_path", "./no/model", *required(train_parser())[2:], "--config", "tiny", "--deepspeed", "zero2", "--rubric", "tiny"]
    assert train_main(args) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == "error: --model_path ./no/model: not a local directory, nor a Hugging Face Hub id (org/name)"


def test_rubric_import_makes_the_folders_of_its_output(elsewhere):
    (elsewhere / "prompts.py").write_text('SA_PROMPT = """Rate it."""\n\ndef get_prompt(data_id):\n'
                                          '    if "SA" in data_id:\n        return SA_PROMPT + "{question}{answer}"\n')
    assert rubric_main(["import", "prompts.py", "-o", "configs/rubrics/mmie.yaml"]) == 0
    assert "category: SA" in (elsewhere / "configs" / "rubrics" / "mmie.yaml").read_text()


@pytest.mark.slow
def test_the_installed_command_reads_a_preset_by_name_in_a_folder_under_tmp(tmp_path):
    """As a user types it, from a folder with no configs/ in it: the console script shows the values of the
    bundled preset it was given by name."""
    done = subprocess.run([str(BIN / "judge-score"), "--config", "milebench", "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=HANG_S)
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    assert "longest feedback in tokens (default: 512)" in text and "bundled by name: instit, megabench, milebench" in text
