"""One convention for flags and paths in every command (issue 27, item 5): each snake_case flag also takes its
kebab-case spelling (as vLLM and VLMEvalKit users type them), every flag that names a file or folder is
declared as one and read the same way, and a file or folder that is not there is refused naming its flag,
before anything runs. MMIE-Eval's own `--input_dir D --input_file F` keeps working (tests/infer/test_score.py)."""

import argparse

import pytest

from mmjudge.calibration.cli import build_parser as calibrate_parser
from mmjudge.demo.cli import build_parser as demo_parser
from mmjudge.infer.cli import build_parser as score_parser
from mmjudge.judge.cli import CommandParser
from mmjudge.judge.data import UsageError
from mmjudge.judge.rubric_cli import build_parser as rubric_parser
from mmjudge.judge.testing.__main__ import build_parser as synthetic_parser
from mmjudge.serve.cli import build_parser as serve_parser
from mmjudge.train.cli import build_parser as train_parser
from mmjudge.train.cli import main as train_main
from mmjudge.train.cli import merge_parser


def commands(tmp_path) -> dict[str, tuple[CommandParser, list[str]]]:
    """Every command's parser (a subcommand's own), and arguments it accepts: the files and folders they name exist."""
    (tmp_path / "data.json").write_text("[]")
    (tmp_path / "prompts.py").write_text("")
    data, folder = str(tmp_path / "data.json"), str(tmp_path)
    return {
        "judge-score": (score_parser(), ["--model_path", "m", "--input_dir", folder, "--input_file", "data.json", "--output_dir", "out"]),
        "judge-train": (train_parser(), ["--model_path", "m", "--train_file", data, "--input_dir", folder, "--output_dir", "out"]),
        "judge-train merge": (merge_parser(), ["--adapter", "a", "--output_dir", "out"]),
        "judge-calibrate": (calibrate_parser(), ["--predictions", data, "--human", data, "--output_dir", "out"]),
        "judge-serve": (serve_parser(), ["--model_path", "m"]),
        "judge-rubric import": (subcommand(rubric_parser(), "import"), [str(tmp_path / "prompts.py"), "-o", "out.yaml"]),
        "judge-demo": (demo_parser(), ["--output_dir", "out"]),
        "judge.testing checkpoint": (subcommand(synthetic_parser(), "checkpoint"), ["out"]),
        "judge.testing dataset": (subcommand(synthetic_parser(), "dataset"), ["out"]),
        "judge.testing pairs": (subcommand(synthetic_parser(), "pairs"), ["out"]),
    }


def subcommand(parser: argparse.ArgumentParser, name: str) -> CommandParser:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[name]


NAMES = ["judge-score", "judge-train", "judge-train merge", "judge-calibrate", "judge-serve", "judge-rubric import", "judge-demo",
         "judge.testing checkpoint", "judge.testing dataset", "judge.testing pairs"]
# Flags that name something other than a file or folder to check: a checkpoint, a local folder or a Hub id, whose
# errors name the flag where it is resolved (mmjudge.infer.loaded.find_checkpoint); a file name inside --output_dir.
NOT_PATHS = {"model_path", "adapter", "output_file"}
PATH_LIKE = ("_file", "_dir", "_root", "config", "rubric", "deepspeed", "calibrator", "predictions", "human", "output", "path")


@pytest.mark.parametrize("name", NAMES)
def test_every_flag_takes_its_kebab_spelling(tmp_path, name):
    parser, args = commands(tmp_path)[name]
    for action in parser._actions:
        for option in action.option_strings:
            if option.startswith("--") and "_" in option:
                assert "--" + option[2:].replace("_", "-") in action.option_strings, option
    kebab = [a.replace("_", "-") if a.startswith("--") else a for a in args]
    assert vars(parser.parse_args(kebab)) == vars(parser.parse_args(args))


def test_the_flags_vllm_users_type_work_in_judge_train(tmp_path):
    """--model-path and --output-dir were refused by judge-train, judge-calibrate and judge-demo."""
    parser, _ = commands(tmp_path)["judge-train"]
    args = parser.parse_args(["--model-path", "m", "--train-file", str(tmp_path / "data.json"), "--input-dir", str(tmp_path),
                              "--output-dir", "out", "--learning-rate", "1e-4", "--no-full-finetune"])
    assert (args.model_path, args.output_dir, args.learning_rate, args.full_finetune) == ("m", "out", 1e-4, False)
    assert demo_parser().parse_args(["--output-dir", "elsewhere"]).output_dir == "elsewhere"


@pytest.mark.parametrize("name", NAMES)
def test_every_file_flag_is_declared_and_its_error_names_it(tmp_path, name):
    parser, args = commands(tmp_path)[name]
    declared = parser.path_flags
    for action in parser._actions:
        if action.dest not in NOT_PATHS and action.dest.endswith(PATH_LIKE):
            assert action.dest in declared, f"{name}: {action.option_strings or action.dest} names a file or folder but is not declared as one"
    (tmp_path / "a-file").write_text("")
    for dest, flag in declared.items():
        bad = {"file": tmp_path / "missing.json", "file_or_dir": tmp_path / "missing.yaml", "dir": tmp_path / "missing-dir",
               "output_dir": tmp_path / "a-file", "output_file": tmp_path / "a-file" / "r.yaml"}[flag.kind]
        given = [str(bad)] if flag.name == "" else [flag.name, str(bad)]
        positional = flag.name == "" and args and not args[0].startswith("-")
        argv = given + args[1:] if positional else args + given
        with pytest.raises(UsageError) as info:
            parser.parse_args(argv)
        message = str(info.value)
        assert (f"{flag.name} {bad}: " if flag.name else f"{bad}: ") in message, message


def test_a_missing_file_is_named_by_its_flag_and_every_one_is_listed(tmp_path, capsys, monkeypatch):
    """judge-train's --train_file is read in the working directory and judge-score's --input_file in --input_dir;
    both said only `data.json: file not found`."""
    monkeypatch.chdir(tmp_path)
    args = ["--model_path", "m", "--train_file", "data.json", "--eval_file", "heldout.json", "--input_dir", str(tmp_path / "images"),
            "--output_dir", str(tmp_path / "out")]
    assert train_main(args) == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: 3 problems with the files and folders named:",
        "  --train_file data.json: file not found",
        f"  --input_dir {tmp_path / 'images'}: folder not found",
        "  --eval_file heldout.json: file not found",
    ]
    with pytest.raises(UsageError) as info:
        score_parser().parse_args(["--model_path", "m", "--input_dir", str(tmp_path), "--input_file", "data.json"])
    assert str(info.value) == f"--input_file data.json: {tmp_path / 'data.json'}: file not found (--input_file is read in --input_dir)"


def test_help_says_how_paths_are_read(tmp_path):
    for name, (parser, _) in commands(tmp_path).items():
        text = " ".join(parser.format_help().split())
        assert "Paths are relative to the working directory unless a flag's help says otherwise" in text, name
        assert "also accepted with hyphens" in text, name
    score_help = " ".join(score_parser().format_help().split())
    assert "read in --input_dir as MMIE-Eval reads it (--input_dir D --input_file F is D/F" in score_help
