"""judge-train: fine-tune a judge (InternVL2/2.5/3, Qwen2.5-VL, Qwen3-VL) on human-rated annotations.

    judge-train --model_path BASE --train_file train.json --input_dir DATA --output_dir OUT [--eval_file heldout.json]
    judge-train merge --adapter OUT --output_dir MERGED [--format native|original]

Many GPUs or nodes: `torchrun --nproc_per_node N -m mmjudge.train.cli ...` or `deepspeed --module mmjudge.train.cli ...` (add
--deepspeed configs/deepspeed/zero2.json); README.md shows both, on one node and on several.
Settings are TrainConfig's defaults (InternVL's LoRA recipe for InternVL2-4B), overridden by --config (a YAML
in configs/train/ holding what differs) and then by the flag of each setting's name; --help shows the values
that apply, --config's included when one is given.
"""

from __future__ import annotations

import argparse
import os
import sys
from contextlib import nullcontext
from pathlib import Path

from mmjudge.judge.cli import add_common_flags, add_revision_flag, add_settings_flags, config_values, flag_given, run, settings_from_config
from mmjudge.judge.data import InputError, UsageError, read_json
from mmjudge.judge.outputs import LOCK_FILE, locked, overwritten_inputs, written_whole
from mmjudge.judge.prompts import DEFAULT_RUBRICS, load_rubrics
from mmjudge.train.checkpoints import resume_point, unsafe_pickles
from mmjudge.train.config import CHECKPOINTS_DIR, TrainConfig, config_problems

# judge.model, judge.distributed and train.recipe are imported where they are used: they load torch and
# transformers (seconds), which --help, --version and a bad flag's message do not need.


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="judge-train", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model_path", required=True, help="base judge checkpoint, a local directory or a Hugging Face Hub id "
                                                       "(InternVL2/2.5/3 original or -hf, Qwen2.5-VL, Qwen3-VL, or a merged judge)")
    add_revision_flag(p)
    p.add_argument("--train_file", required=True, help="annotations to learn from (JSON list or JSONL)")
    p.add_argument("--input_dir", required=True, help="directory that image paths in the annotations are relative to")
    p.add_argument("--output_dir", required=True, help="where the trained judge, checkpoints and eval_history.json go: "
                                                       "a new or empty directory, unless --resume")
    p.add_argument("--eval_file", help="held-out annotations scored at every checkpoint (default: none)")
    p.add_argument("--config", help="YAML of the settings that differ from the defaults below, e.g. configs/train/tiny.yaml (default: none)")
    p.add_argument("--rubric", nargs="+", help="rubric YAML files or directories (default: configs/rubrics/{sa,pbl,msr}.yaml)")
    p.add_argument("--deepspeed", help="DeepSpeed JSON, e.g. configs/deepspeed/zero2.json (default: none)")
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint in --output_dir (default: start fresh)")
    # The deepspeed launcher passes this flag; the rank itself is read from LOCAL_RANK, which it sets as torchrun does.
    p.add_argument("--local_rank", "--local-rank", type=int, help="this process's device on its node, passed by the deepspeed launcher "
                                                                  "(default: set by the launcher)")
    add_settings_flags(p, TrainConfig, config_values(TrainConfig, flag_given(argv, "config"), argparse.Namespace()))
    add_common_flags(p)
    return p


def merge_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="judge-train merge", description="Fold a LoRA adapter into its base and write a standalone checkpoint.")
    p.add_argument("--adapter", required=True, help="a judge-train output holding an adapter: its directory or a Hugging Face Hub id")
    add_revision_flag(p, of="--adapter")
    p.add_argument("--output_dir", required=True, help="where the merged checkpoint goes: a new or empty directory")
    p.add_argument("--format", choices=("native", "original"), default="native",
                   help="native: transformers' own layout of the backbone (the released layout of a -hf InternVL, Qwen2.5-VL or "
                        "Qwen3-VL base), as this toolkit, transformers and vLLM read it; original: InternVL's own format "
                        "(InternVLChatModel) in the layout of the adapter's original base, with its code, as InternVL's code, MMIE's "
                        "main.py, vLLM and LMDeploy read it (default: native)")
    add_common_flags(p)
    return p


def main(argv=None) -> int:
    return run(_main, argv)


def _main(argv) -> int:
    return merge(argv[1:]) if argv and argv[0] == "merge" else fine_tune(argv)


def merge(argv) -> int:
    args = merge_parser().parse_args(argv)
    out = Path(args.output_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"--output_dir {out} is not an empty directory; give a new or empty one")
    from mmjudge.judge.backbones.internvl import save_original
    from mmjudge.judge.model import checkpoint_format, find_checkpoint, load_judge, original_base, save_native

    adapter = find_checkpoint(args.adapter, args.revision).path
    if checkpoint_format(adapter) != "adapter":
        raise UsageError(f"--adapter {args.adapter}: not a LoRA adapter directory (no adapter_config.json)")
    base = original_base(adapter) if args.format == "original" else None  # refused here, before the weights load
    judge = load_judge(adapter)
    with written_whole(out) as staging:
        save_original(judge, base, staging) if base else save_native(judge, staging)
    print(f"merged checkpoint ({args.format} format): {out}")
    return 0


def fine_tune(argv) -> int:
    args = build_parser(argv).parse_args(argv)
    cfg = settings_from_config(TrainConfig, args.config, args)
    out = Path(args.output_dir)
    # A setting's problem names the config it may come from; the others name their flag or file.
    if problems := [f"{args.config} (or its flag): {p}" if args.config else p for p in config_problems(cfg)] + run_problems(args, out):
        raise UsageError(problems[0] if len(problems) == 1 else f"{len(problems)} problems with the settings and flags:\n  " + "\n  ".join(problems))
    rubrics = load_rubrics(args.rubric or DEFAULT_RUBRICS)
    from mmjudge.judge.distributed import end_process_group
    from mmjudge.judge.model import find_checkpoint
    from mmjudge.train.data import check_scales, read_annotations
    from mmjudge.train.recipe import train

    # Every problem of the inputs, then of the base, before --output_dir is taken: a run refused leaves none behind.
    train_file, image_root = Path(args.train_file), Path(args.input_dir)
    annotations = read_annotations(train_file, Path(args.eval_file) if args.eval_file else None, image_root, rubrics, cfg.scale)
    check_scales(annotations[0] + annotations[1], rubrics, cfg.scale)
    base = find_checkpoint(args.model_path, args.revision)
    # Rank 0 holds --output_dir for the run; the others wait for it in the Trainer's process group.
    with locked(out, "judge-train") if int(os.environ.get("RANK", "0")) == 0 else nullcontext():
        try:
            result = train(base, annotations, train_file, image_root, out, rubrics, cfg, args.deepspeed, args.resume)
        finally:
            end_process_group()  # torchrun's ranks (initialised by the Trainer) must exit cleanly, failed or not
    print(f"trained judge: {out}  (steps: {result['global_step']}, {chosen_by(result['best_pearson'], bool(args.eval_file))})")
    return 0


def chosen_by(best_pearson: float | None, evaluated: bool) -> str:
    """How the saved weights were chosen, in words."""
    if not evaluated:
        return "the last step's weights: no --eval_file to choose a checkpoint by"
    if best_pearson is None:
        return "best overall Pearson: undefined at every evaluation (too few overall scores parsed, or all alike); the first checkpoint kept"
    return f"best overall Pearson: {best_pearson:.3f}"


def run_problems(args, out: Path) -> list[str]:
    """What --deepspeed, --resume and --output_dir ask that cannot work.

    A fresh run needs a new or empty --output_dir: an earlier run's files would outlive it (after a
    --full_finetune run, judge-score would load the earlier LoRA adapter), and its checkpoints would be
    resumed later. Refusing is safer than deleting: a mistyped directory costs a message, not a judge.
    Every rank checks before any writes there: the Trainer writes only once all have joined the process group."""
    problems = []
    if args.deepspeed:
        try:
            read_json(args.deepspeed)
        except InputError as err:
            problems += [f"--deepspeed {problem}" for problem in err.problems]
    checkpoints = out / CHECKPOINTS_DIR
    if args.resume:
        checkpoint, skipped = resume_point(checkpoints) if checkpoints.is_dir() else (None, [])
        if checkpoint is None:
            problems.append(f"--resume: nothing to resume in {out}: no checkpoint saved whole in {checkpoints}"
                            + "".join(f"; {line}" for line in skipped) + "; drop --resume to start a fresh run in a new or empty --output_dir")
        else:
            problems += [f"--resume: {problem}" for problem in unsafe_pickles(checkpoint)]
    if not args.resume and out.is_dir() and any(p.name != LOCK_FILE for p in out.iterdir()):
        problems.append(f"--output_dir {out} is not empty (an earlier run?); give a new or empty directory, or --resume to continue that run")
    # Everything in --output_dir is the run's: an input there could be overwritten by a checkpoint or the judge.
    inputs = [("--model_path", args.model_path), ("--train_file", args.train_file), ("--eval_file", args.eval_file),
              ("--config", args.config), ("--deepspeed", args.deepspeed), *[("--rubric", path) for path in args.rubric or DEFAULT_RUBRICS]]
    return problems + overwritten_inputs(out, ["**"], inputs)


if __name__ == "__main__":
    sys.exit(main())
