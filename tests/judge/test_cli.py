"""The commands' error contract: a user's mistake is one line naming the file (and the record or field)
and exit code 2, found before any model loads; anything else is an internal failure, exit code 1."""

import argparse
import json

import pytest

from mmjudge.infer.cli import main as score_main
from mmjudge.infer.options import ScoreOptions
from mmjudge.judge.cli import run, settings_from_config
from mmjudge.judge.data import InputError, UsageError
from mmjudge.configs import CONFIG_DIR
from mmjudge.judge.rubric_cli import main as rubric_main
from mmjudge.judge.testing import write_dataset
from mmjudge.judge.yamlfile import read_yaml
from mmjudge.train.cli import main as train_main
from mmjudge.train.config import TrainConfig, config_problems

MMIE_LIKE_PROMPTS = 'SA_PROMPT = """Rate it."""\n\ndef get_prompt(data_id):\n    if "SA" in data_id:\n        return SA_PROMPT + "{question}{answer}"\n'


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("data"), 3, seed=0).parent


def score(data, model_path, *extra):
    return score_main(["--model_path", str(model_path), "--input_dir", str(data), "--input_file", "data.json",
                       "--output_dir", str(data / "out"), *extra])


def the_error(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def the_problems(capsys) -> list[str]:
    """The problems an error names, each on its line (one problem: the line after "error: ")."""
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[0].startswith("error: "), lines
    return [lines[0][len("error: "):]] if len(lines) == 1 else [line.strip() for line in lines[1:]]


def test_a_missing_model_path_is_a_user_error(data, tmp_path, capsys):
    assert score(data, tmp_path / "nowhere") == 2
    assert the_error(capsys) == f"error: --model_path {tmp_path / 'nowhere'}: not a local directory, nor a Hugging Face Hub id (org/name)"


def test_a_checkpoint_config_that_is_not_json_is_named(data, tmp_path, capsys):
    (tmp_path / "config.json").write_text('{"architectures": ["InternVLChatModel"],\n "template": }')
    assert score(data, tmp_path) == 2
    assert the_error(capsys) == f"error: {tmp_path / 'config.json'}: invalid JSON at line 2, column 14: Expecting value"


def test_a_rubric_error_is_found_before_the_model_loads(data, tmp_path, capsys):
    (tmp_path / "sa.yaml").write_text("category: SA\ninstructions: x\ntemplate: '{question} {bogus}'\n")
    assert score(data, tmp_path / "no-model-needed", "--rubric", str(tmp_path / "sa.yaml")) == 2
    assert f"{tmp_path / 'sa.yaml'}: record 0: template: unknown field(s) {{bogus}}" in the_error(capsys)


@pytest.mark.parametrize("text, kind", [("- mode: logits\n", "list"), ("512\n", "int")])
def test_a_config_that_is_not_a_mapping_is_a_user_error(tmp_path, text, kind):
    (tmp_path / "c.yaml").write_text(text)
    with pytest.raises(UsageError, match=f"c.yaml: expected a mapping of setting: value, got a YAML {kind}"):
        settings_from_config(ScoreOptions, tmp_path / "c.yaml", argparse.Namespace())


def test_config_values_are_checked_against_the_settings_types(tmp_path):
    (tmp_path / "ok.yaml").write_text("learning_rate: 1e-4\nscale: [1, 5]\n")  # YAML 1.1 reads 1e-4 as a string
    cfg = settings_from_config(TrainConfig, tmp_path / "ok.yaml", argparse.Namespace(lora_r=4))
    assert (cfg.learning_rate, cfg.scale, cfg.lora_r) == (1e-4, (1, 5), 4)
    (tmp_path / "bad.yaml").write_text("learning_rate: fast\nscale: [0, 1, 2]\n")
    with pytest.raises(InputError) as info:
        settings_from_config(TrainConfig, tmp_path / "bad.yaml", argparse.Namespace())
    assert f"{tmp_path / 'bad.yaml'}: " in str(info.value)
    assert "scale: Tuple should have at most 2 items" in str(info.value) and "learning_rate: Input should be a valid number" in str(info.value)


def test_train_scale_takes_exactly_two_values(tmp_path, capsys):
    args = ["--model_path", "m", "--train_file", "t.json", "--input_dir", ".", "--output_dir", str(tmp_path)]
    with pytest.raises(SystemExit) as info:
        train_main([*args, "--scale", "0", "1", "2"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and err == "judge-train: error: unrecognized arguments: 2 (judge-train --help lists the flags)\n"  # one line, no usage block


def test_lora_settings_given_for_a_full_fine_tune_are_refused_not_ignored(tmp_path, capsys):
    # --config tiny trains in full: --lora_r 8 and --lora_targets were dropped without a word.
    args = ["--model_path", str(tmp_path / "no-model"), "--train_file", annotations_file(tmp_path), "--input_dir", ".", "--output_dir", str(tmp_path / "out"),
            "--config", "tiny"]
    assert train_main([*args, "--lora_r", "8", "--lora_targets", "qkv_proj", "o_proj"]) == 2
    err = capsys.readouterr().err
    assert "\n  --lora_r 8: a LoRA setting, but this run trains every language-model weight (full_finetune); drop it, or give --no-full_finetune" in err
    assert "\n  --lora_targets qkv_proj o_proj: a LoRA setting" in err and not (tmp_path / "out").exists()
    assert train_main([*args, "--no-full_finetune", "--lora_r", "8"]) == 2  # refused for the missing model alone: with LoRA they apply
    assert "LoRA setting" not in capsys.readouterr().err


def annotations_file(tmp_path):
    (tmp_path / "t.json").write_text("[]")  # judge-train reads it only after the settings are checked
    return str(tmp_path / "t.json")


def test_every_training_setting_that_cannot_work_is_reported_at_once_before_loading(tmp_path, capsys):
    args = ["--model_path", str(tmp_path / "no-model"), "--train_file", annotations_file(tmp_path), "--input_dir", ".", "--output_dir", str(tmp_path / "out")]
    code = train_main([*args, "--save_steps", "0", "--per_device_batch_size", "0", "--lora_r", "0", "--gradient_accumulation_steps", "0",
                       "--max_length", "0", "--learning_rate=-1e-4", "--warmup_ratio", "1.5", "--lr_scheduler", "cosin", "--scale", "3", "3"])
    err = capsys.readouterr().err
    assert code == 2 and "problems with the inputs and settings:" in err  # and the missing model's, in the same error
    for problem in ("save_steps must be a whole number of at least 1, got 0", "per_device_batch_size must be a whole number of at least 1, got 0",
                    "lora_r must be a whole number of at least 1, got 0", "gradient_accumulation_steps must be a whole number of at least 1, got 0",
                    "max_length must be a whole number of at least 1, got 0", "learning_rate must be a finite number of at least 0, got -0.0001",
                    "warmup_ratio must be a finite number of at least 0 and below 1, got 1.5",  # 1.5 would silently mean 1 warmup step
                    "lr_scheduler must be one of linear, cosine, ", "scale: a scale needs low < high and step > 0, got 3-3 step 1"):
        assert f"\n  {problem}" in err  # from the flags: no config was given
    assert not (tmp_path / "out").exists()


def test_judge_train_names_a_missing_model_with_a_bad_record(tmp_path, capsys):
    """issue 56: the missing model was named only once the records were fixed."""
    (tmp_path / "pairs.json").write_text(json.dumps([{"id": "p1", "question": "q", "answer_a": "a", "preference": "A"}]))
    assert train_main(["--model_path", str(tmp_path / "no-model"), "--train_file", str(tmp_path / "pairs.json"), "--input_dir", str(tmp_path),
                       "--output_dir", str(tmp_path / "out"), "--config", "tiny"]) == 2
    assert capsys.readouterr().err.splitlines() == ["error: 2 problems with the inputs and settings:",
                                                    f"  --model_path {tmp_path / 'no-model'}: not a local directory, nor a Hugging Face Hub id (org/name)",
                                                    f"  {tmp_path / 'pairs.json'}: record 0 (id 'p1'): answer_b: Field required"]


def test_output_dir_resume_and_deepspeed_are_checked_before_loading(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "adapter_config.json").write_text("{}")  # an earlier LoRA run's, which judge-score would load
    args = ["--model_path", str(tmp_path / "no-model"), "--train_file", annotations_file(tmp_path), "--input_dir", ".", "--output_dir", str(out)]
    assert train_main(args) == 2
    assert (f"--output_dir {out} is not empty (an earlier run?); "
            "give a new or empty directory, or --resume to continue that run") in the_problems(capsys)
    assert (out / "adapter_config.json").exists()  # refused, not cleared
    assert train_main([*args, "--resume"]) == 2
    assert (f"--resume: nothing to resume in {out}: no checkpoint saved whole in {out / 'checkpoints'}; "
            "drop --resume to start a fresh run in a new or empty --output_dir") in the_problems(capsys)
    (tmp_path / "ds.json").write_text('{"zero_optimization": {"stage": 2,}}')
    assert train_main([*args[:-1], str(tmp_path / "new"), "--deepspeed", str(tmp_path / "ds.json")]) == 2
    assert any(p.startswith(f"--deepspeed {tmp_path / 'ds.json'}: invalid JSON at line 1, column 35") for p in the_problems(capsys))


def test_deepspeed_asked_for_where_it_is_not_installed_is_refused_before_loading(tmp_path, capsys, monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "deepspeed" else find_spec(name, *a))
    args = ["--model_path", str(tmp_path / "no-model"), "--train_file", annotations_file(tmp_path), "--input_dir", ".",
            "--output_dir", str(tmp_path / "out"), "--deepspeed", "zero2"]
    assert train_main(args) == 2
    error = next(p for p in the_problems(capsys) if p.startswith("--deepspeed"))
    assert "DeepSpeed is not installed here" in error and "'.[deepspeed]'" in error


def test_settings_flags_take_either_spelling_and_leave_unflagged_fields_to_the_config(tmp_path):
    from mmjudge.infer.cli import build_parser as score_parser
    from mmjudge.train.cli import build_parser as train_parser

    required = ["--model_path", "m", "--input_dir", str(tmp_path), "--output_dir", "o"]
    train = train_parser().parse_args([*required, "--train_file", annotations_file(tmp_path), "--learning-rate", "3e-4", "--lora_r", "8", "--full-finetune"])
    assert (train.learning_rate, train.lora_r, train.full_finetune, train.num_epochs) == (3e-4, 8, True, None)
    score = score_parser().parse_args([*required, "--input_file", "t.json", "--max-new-tokens", "64", "--mode", "logits"])
    assert (score.max_new_tokens, score.mode, score.token_budget) == (64, "logits", None)
    assert not hasattr(score, "ignore_stop")  # a ScoreOptions field without a flag


def test_judge_train_accepts_the_local_rank_the_deepspeed_launcher_passes(tmp_path):
    from mmjudge.train.cli import build_parser as train_parser

    args = train_parser().parse_args(["--model_path", "m", "--train_file", annotations_file(tmp_path), "--input_dir", ".", "--output_dir", "o",
                                      "--local_rank=1"])
    assert args.local_rank == 1


def test_rubric_import_names_a_missing_file_and_an_unwritable_output(tmp_path, capsys):
    assert rubric_main(["import", str(tmp_path / "missing.py"), "-o", str(tmp_path / "r.yaml")]) == 2
    assert the_error(capsys) == f"error: {tmp_path / 'missing.py'}: file not found"
    (tmp_path / "prompts.py").write_text(MMIE_LIKE_PROMPTS)
    (tmp_path / "a-file").write_text("")
    assert rubric_main(["import", str(tmp_path / "prompts.py"), "-o", str(tmp_path / "a-file" / "r.yaml")]) == 2
    assert the_error(capsys) == f"error: -o {tmp_path / 'a-file' / 'r.yaml'}: {tmp_path / 'a-file'} is a file, not a folder"
    assert rubric_main(["import", str(tmp_path / "prompts.py"), "-o", str(tmp_path / "r.yaml"), "--verbose"]) == 0


def test_a_prompt_that_makes_no_valid_rubric_is_named(tmp_path, capsys):
    (tmp_path / "prompts.py").write_text(MMIE_LIKE_PROMPTS.replace("{answer}", "{answer}{extra}"))
    assert rubric_main(["import", str(tmp_path / "prompts.py"), "-o", str(tmp_path / "r.yaml")]) == 2
    assert "prompts.py: the SA prompt (line 4) makes no valid rubric: unknown field(s) {extra}" in the_error(capsys)


def test_anything_else_is_an_internal_failure(capsys):
    def broken(argv):
        raise KeyError("bogus")

    assert run(broken, []) == 1
    assert capsys.readouterr().err.splitlines() == ["error: internal failure: KeyError: 'bogus'", "(run again with --verbose for the full traceback)"]


def test_the_shipped_presets_pass_the_checks_a_users_file_gets():
    for preset in sorted((CONFIG_DIR / "score").glob("*.yaml")):
        settings_from_config(ScoreOptions, preset, argparse.Namespace())
    for preset in sorted((CONFIG_DIR / "train").glob("*.yaml")):
        assert config_problems(settings_from_config(TrainConfig, preset, argparse.Namespace())) == [], preset


@pytest.mark.parametrize("settings, folder", [(ScoreOptions, "score"), (TrainConfig, "train")])
def test_a_preset_holds_only_what_differs_from_the_declared_defaults(settings, folder):
    """Each default is declared once, in its settings dataclass: a preset key equal to it would be a second
    declaration that could drift from the first unseen."""
    defaults = settings_from_config(settings, None, argparse.Namespace())
    presets = sorted((CONFIG_DIR / folder).glob("*.yaml"))
    assert presets
    for preset in presets:
        values = read_yaml(preset)
        assert values, preset
        applied = settings_from_config(settings, preset, argparse.Namespace())
        repeated = [name for name in values if getattr(applied, name) == getattr(defaults, name)]
        assert repeated == [], f"{preset} repeats the defaults of {repeated}"


def help_text(parser) -> str:
    return " ".join(parser.format_help().split())


def test_judge_train_help_shows_the_values_a_run_would_use():
    from mmjudge.train.cli import build_parser as train_parser

    assert "peak learning rate (default: 4e-05)" in help_text(train_parser([]))
    tiny = str(CONFIG_DIR / "train" / "tiny.yaml")
    text = help_text(train_parser(["--config", tiny, "--help"]))
    assert "peak learning rate (default: 0.002)" in text and "LoRA rank (default: 16)" in text


def test_judge_score_help_shows_the_values_of_the_format_or_config_given(tmp_path):
    from mmjudge.infer.cli import build_parser as score_parser

    assert "longest feedback in tokens (default: 512)" in help_text(score_parser(["--format", "milebench", "--help"]))
    (tmp_path / "mine.yaml").write_text("max_new_tokens: 77\n")
    text = help_text(score_parser(["--config", str(tmp_path / "mine.yaml")]))
    assert "longest feedback in tokens (default: 77)" in text and "background threads that decode and tile images (default: 4)" in text


def test_a_boolean_flag_is_shown_once_each_way_and_takes_every_spelling(capsys):
    from mmjudge.train.cli import build_parser

    usage = build_parser().format_usage()
    assert "[--full_finetune | --no-full_finetune]" in usage and "--no-full-finetune" not in usage
    parser, taken = build_parser(), argparse.Namespace()
    for spelling, value in (("--full-finetune", True), ("--no-full-finetune", False), ("--full_finetune", True), ("--no-full_finetune", False)):
        parser._option_string_actions[spelling](parser, taken, None, spelling)
        assert taken.full_finetune is value


def test_an_output_dir_with_no_parents_is_checked_not_crashed_on(tmp_path, monkeypatch, capsys):
    """`--output_dir .` crashed every command (StopIteration: "." has no parents to look for)."""
    import json

    from mmjudge.calibration.cli import main as calibrate_main

    monkeypatch.chdir(tmp_path)
    scores = [{"id": f"SA_{k}", "overall": k % 7} for k in range(12)]
    (tmp_path / "p.json").write_text(json.dumps(scores))
    (tmp_path / "h.json").write_text(json.dumps(scores))
    code = calibrate_main(["--predictions", "p.json", "--human", "h.json", "--output_dir", ".", "--bootstrap", "0", "--fit", "none"])
    err = capsys.readouterr().err
    assert code == 0 and "internal failure" not in err and (tmp_path / "report.json").is_file()


@pytest.mark.parametrize("flag, value", [("--learning_rate", "inf"), ("--weight_decay", "nan"), ("--num_epochs", "inf")])
def test_an_infinite_or_nan_setting_is_refused_before_loading(tmp_path, capsys, flag, value):
    """inf passed every range check and failed after training (a config that JSON cannot hold), or at once
    in the Trainer's arithmetic."""
    args = ["--model_path", str(tmp_path / "no-model"), "--train_file", annotations_file(tmp_path), "--input_dir", ".",
            "--output_dir", str(tmp_path / "out"), flag, value]
    assert train_main(args) == 2
    err = capsys.readouterr().err
    assert f"{flag[2:]} must be a finite number" in err


def test_pair_options_of_inf_are_refused(tmp_path):
    from mmjudge.infer.options import ScoreOptions

    with pytest.raises(UsageError, match="temperature must be a finite number of at least 0, got inf"):
        ScoreOptions(temperature=float("inf"))
