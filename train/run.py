"""One judge-train run, once its settings are given, whether by judge-train's flags (train/cli.py) or by the
Python API's `mmjudge.fine_tune`: the settings and inputs checked, every problem before output_dir is taken,
then the recipe (train/recipe.py)."""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import sys
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, fields
from pathlib import Path

from mmjudge.configs import DEFAULT_RUBRICS, by_name
from mmjudge.infer.loaded import checkpoint_name_problem, find_checkpoint
from mmjudge.judge.cpu import use_free_cores
from mmjudge.judge.data import InputError, UsageError

PathLike = str | Path


@dataclass(frozen=True)
class TrainResult:
    """What `fine_tune` made: the trained judge's folder (load it with `Judge.load`), the optimizer steps
    run, and the held-out overall Pearson its checkpoint was chosen by (None: no eval_file, or undefined
    at every evaluation)."""

    output_dir: Path
    global_step: int
    best: float | None  # the held-out measure the checkpoint was chosen by
    measure: str  # which: the overall Pearson, or on pairs the accuracy with ties
    evaluated: bool  # an eval_file chose the checkpoint


def fine_tune(model_path: PathLike, train_file: PathLike, output_dir: PathLike, *, input_dir: PathLike | None = None,
              eval_file: PathLike | None = None, config: PathLike | None = None, rubrics: PathLike | Sequence[PathLike] | None = None,
              deepspeed: PathLike | None = None, resume: bool = False, revision: str | None = None, **settings) -> TrainResult:
    """Fine-tune a judge on human-rated annotations by the recipe of train/recipe.py (judge-train).

    model_path: the base judge, a local folder or a Hub id. (--model_path)
    train_file: annotations to learn from (JSON list or JSONL). (--train_file)
    output_dir: a new or empty folder for the trained judge and its checkpoints (unless resume). (--output_dir)
    input_dir: the folder that image paths in the annotations are read in (default: train_file's folder). (--input_dir)
    eval_file: held-out annotations scored at every checkpoint; the best by overall Pearson is kept. (--eval_file)
    config: a training preset, YAML or bundled name such as "tiny" (default: none). (--config)
    rubrics: rubric files or folders, or bundled names (default: sa, pbl, msr). (--rubric)
    deepspeed: a DeepSpeed JSON or bundled name: zero2, zero3, zero3_offload (default: none). (--deepspeed)
    resume: continue from the last checkpoint in output_dir. (--resume)
    revision: branch, tag or commit where model_path is a Hub id. (--revision)
    **settings: train.config.TrainConfig's fields (learning_rate, lora_r, max_steps, ...) over the config.

    Under torchrun or the deepspeed launcher every rank calls it, as every rank runs judge-train.
    """
    use_free_cores()  # before torch loads, as every command (judge/cpu.py)
    from mmjudge.judge.cli import path_problems
    from mmjudge.train.checkpoints import run_problems
    from mmjudge.train.config import TrainConfig

    known = [f.name for f in fields(TrainConfig)]
    if unknown := sorted(set(settings) - set(known)):
        raise UsageError(f"unknown training setting(s) {', '.join(unknown)}; the settings are {', '.join(known)}")
    # Every problem found before the model loads in one error, the base's included (judge-train's parser has checked
    # its path flags; the Python API has none): a second mistake is not found only on the next try. A Hub id alone
    # is fetched only once all else is clear, not gigabytes for a run that is refused.
    config = by_name("train", config) if isinstance(config, (str, Path)) and config else config
    deepspeed = str(by_name("deepspeed", deepspeed)) if isinstance(deepspeed, (str, Path)) and deepspeed else deepspeed
    given_rubrics = [] if rubrics is None else list(rubrics) if isinstance(rubrics, (list, tuple)) else [rubrics]
    given_rubrics = [by_name("rubrics", r) if isinstance(r, (str, Path)) and r else r for r in given_rubrics]
    unreadable = path_problems([("--train_file", train_file, "file"), ("--input_dir", input_dir, "dir"), ("--eval_file", eval_file, "file"),
                                *[("--rubric", r, "file_or_dir") for r in given_rubrics]])
    problems = [*unreadable, *path_problems([("--config", config, "file"), ("--deepspeed", deepspeed, "file"), ("--output_dir", output_dir, "output_dir")])]
    if not isinstance(revision, (str, type(None))):
        problems.append(f"--revision: give a branch, tag or commit name (a str), not {type(revision).__name__}")
    if model := checkpoint_name_problem(model_path):
        problems.append(model)
    cfg, found = _config(config, settings)
    problems += found
    rubric_files = given_rubrics or (list(default_rubrics(Path(train_file))) if isinstance(train_file, (str, Path)) and train_file else [])
    if not isinstance(output_dir, (str, Path)) or not output_dir or not isinstance(train_file, (str, Path)) or not train_file:
        raise UsageError(_together(problems))  # the checks below read them
    out, train_file = Path(output_dir), Path(train_file)
    inputs = [(flag, path) for flag, path in [("--model_path", model_path), ("--train_file", train_file), ("--eval_file", eval_file),
                                              ("--config", config), ("--deepspeed", deepspeed), *[("--rubric", r) for r in rubric_files]]
              if isinstance(path, (str, Path))]
    length = (cfg.max_steps, cfg.num_epochs, cfg.full_finetune) if cfg else (None, None, None)
    problems += run_problems(out, resume, deepspeed if isinstance(deepspeed, str) and Path(deepspeed).is_file() else None, inputs, *length)
    if cfg is not None:
        problems += objective_problems(cfg.objective, eval_file)
    if cfg is None or found or unreadable:  # the records are read by the settings (scale, objective): not by wrong ones
        raise UsageError(_together(problems))
    loaded, annotations, refused = _inputs(rubric_files, train_file, input_dir, eval_file, cfg)
    if refused is not None and not problems:
        raise refused  # the inputs' own error, as they give it
    if refused is not None:
        problems += [str(p) for p in refused.problems] if isinstance(refused, InputError) else [str(refused)]
    if problems:
        raise UsageError(_together(problems))
    from mmjudge.judge.distributed import end_process_group
    from mmjudge.judge.outputs import locked
    from mmjudge.train.recipe import train

    image_root = Path(input_dir) if input_dir is not None else train_file.parent
    base = find_checkpoint(model_path, revision)
    if deepspeed:
        deepspeed_ops()
    # Rank 0 holds output_dir for the run; the others wait for it in the Trainer's process group.
    with locked(out, "judge-train") if int(os.environ.get("RANK", "0")) == 0 else nullcontext():
        try:
            if cfg.objective == "grpo":
                from mmjudge.train.grpo import train_grpo

                result = train_grpo(base, annotations, train_file, image_root, out, loaded, cfg, deepspeed, resume)
            elif cfg.objective == "bradley_terry":
                from mmjudge.train.bradley_terry import train_reward_head

                result = train_reward_head(base, annotations, train_file, image_root, out, loaded, cfg, deepspeed, resume, Path(eval_file) if eval_file else None)
            else:
                result = train(base, annotations, train_file, image_root, out, loaded, cfg, deepspeed, resume)
        finally:
            end_process_group()  # torchrun's ranks (initialised by the Trainer) must exit cleanly, failed or not
    return TrainResult(out, result["global_step"], result["best"], result["measure"], eval_file is not None)


def _inputs(rubric_files: list, train_file: Path, input_dir: PathLike | None, eval_file: PathLike | None, cfg: TrainConfig
            ) -> tuple[dict | None, tuple | None, InputError | UsageError | None]:
    """The rubrics and annotations read and checked against each other and the settings, or the error that says
    what is wrong with them."""
    from mmjudge.judge.prompts import load_rubrics
    from mmjudge.train.data import check_scales, read_annotations

    try:
        loaded = load_rubrics(rubric_files)
        image_root = Path(input_dir) if input_dir is not None else train_file.parent
        annotations = read_annotations(train_file, Path(eval_file) if eval_file else None, image_root, loaded, cfg.scale, cfg.objective)
        check_scales(annotations[0] + annotations[1], loaded, cfg.scale)
    except (InputError, UsageError) as err:
        return None, None, err
    return loaded, annotations, None


def deepspeed_ops() -> None:
    """DeepSpeed's CPU ops (CPU Adam for ZeRO-Offload, shared-memory collectives), compiled on the first --deepspeed
    run rather than by `make setup` for every user: 3 minutes of 2 nearly idle cores, 16 of 2 busy ones
    (docs/quickstart.md). Compiled by torch's extension loader under its file lock in TORCH_EXTENSIONS_DIR, one rank
    compiling while the others wait, and loaded from there by every later run; a line says why the wait."""
    import torch.utils.cpp_extension as extensions
    from deepspeed.ops.op_builder import CPUAdamBuilder, ShareMemCommBuilder

    builders = [CPUAdamBuilder(), ShareMemCommBuilder()]
    missing = [b.name for b in builders if not (Path(extensions._get_build_directory(b.name, False)) / f"{b.name}.so").is_file()]
    if missing and int(os.environ.get("RANK", "0")) == 0:
        where = os.environ.get("TORCH_EXTENSIONS_DIR", "torch's extension cache")
        print(f"compiling DeepSpeed's CPU ops ({', '.join(missing)}) for --deepspeed: once, minutes, then kept in {where}", file=sys.stderr, flush=True)
    for builder in builders:
        builder.load(verbose=False)


def _config(config: Path | None, settings: dict) -> tuple[TrainConfig | None, list[str]]:
    """The run's settings (None where one is of the wrong type) and every problem of theirs: out of range, of the
    wrong type, unknown to the config, or not used by this run."""
    from mmjudge.judge.cli import config_values, setting_problems, settings_from_config
    from mmjudge.train.config import TrainConfig, config_problems, unused_settings

    if config is not None and not (isinstance(config, (str, Path)) and Path(config).is_file()):
        return None, []  # path_problems names it
    given = argparse.Namespace(**settings)
    try:
        cfg = settings_from_config(TrainConfig, config, given)
    except UsageError as err:  # the config's own: a key that is no setting, or no mapping
        return None, [str(err)]
    except InputError as err:  # a value of another type than its setting's: named with every other setting's problem
        typed = {(p.file if p.file.startswith("--") else p.field or "").lstrip("-").split("[")[0] for p in err.problems}
        ranges = setting_problems(TrainConfig, config_values(TrainConfig, config, given))
        return None, [str(p) for p in err.problems] + [_from(p, config, settings) for p in ranges if re.match(r"\w*", p)[0] not in typed]
    return cfg, [_from(p, config, settings) for p in config_problems(cfg)] + unused_settings(cfg, settings)


def _from(problem: str, config: Path | None, given: dict) -> str:
    """A setting's problem (it starts with the setting's name), naming the config where the value came from it."""
    name = re.match(r"\w*", problem)[0]
    return f"{config}: {problem}" if config and given.get(name) is None else problem


def _together(problems: list[str]) -> str:
    return problems[0] if len(problems) == 1 else f"{len(problems)} problems with the inputs and settings:\n  " + "\n  ".join(problems)


def objective_problems(objective: str, eval_file: PathLike | None) -> list[str]:
    """What a GRPO run needs that the others do not: TRL (the rl extra), and no --eval_file (the saved judge is
    the last step's; judge-score measures it)."""
    if objective != "grpo":
        return []
    problems = [] if importlib.util.find_spec("trl") else ["--objective grpo runs on TRL, which is not installed: pip install 'mmjudge[rl]'"]
    if eval_file is not None:
        problems.append(f"--eval_file {eval_file}: objective grpo keeps the last step's weights and evaluates nothing during the run; "
                        "drop it and score the trained judge with judge-score (docs/grpo.md)")
    return problems


def default_rubrics(train_file: Path) -> tuple[Path, ...]:
    """MMIE's rubrics, and for pairs the toolkit's pairwise one beside them (judge-score's defaults for pairs)."""
    from mmjudge.judge.data import holds_pairs
    from mmjudge.judge.formats import FORMATS

    return FORMATS["pairs"].default_rubrics if holds_pairs(train_file) else DEFAULT_RUBRICS
