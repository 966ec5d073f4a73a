"""judge-train: fine-tune an InternVL2 judge on human-rated annotations.

    judge-train --model_path BASE --train_file train.json --input_dir DATA --output_dir OUT [--eval_file heldout.json]
    judge-train merge --adapter OUT --output_dir MERGED [--format native|original]

Many GPUs or nodes: `torchrun --nproc_per_node N -m train.cli ...` or `deepspeed --module train.cli ...` (add
--deepspeed configs/deepspeed/zero2.json); README.md shows both, on one node and on several.
Settings come from --config (a YAML in configs/train/) and each can be overridden by the flag of its name.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from judge.cli import UsageError, add_common_flags, add_revision_flag, add_settings_flags, run, settings_from_config
from judge.data import InputError, read_json
from judge.prompts import CONFIG_DIR, DEFAULT_RUBRICS, load_rubrics
from train.config import CHECKPOINTS_DIR, TrainConfig, config_problems

# judge.model, judge.distributed and train.recipe are imported where they are used: they load torch and
# transformers (seconds), which --help, --version and a bad flag's message do not need.


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="judge-train", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model_path", required=True, help="base judge checkpoint, a local directory or a Hugging Face Hub id "
                                                       "(original InternVL2, native, or a merged judge)")
    add_revision_flag(p)
    p.add_argument("--train_file", required=True, help="annotations to learn from (JSON list or JSONL)")
    p.add_argument("--input_dir", required=True, help="directory that image paths in the annotations are relative to")
    p.add_argument("--output_dir", required=True, help="where the trained judge, checkpoints and eval_history.json go: "
                                                       "a new or empty directory, unless --resume")
    p.add_argument("--eval_file", help="held-out annotations scored at every checkpoint (default: none)")
    p.add_argument("--config", default=str(CONFIG_DIR / "train" / "lora.yaml"), help="YAML of training settings (default: configs/train/lora.yaml)")
    p.add_argument("--rubric", nargs="+", help="rubric YAML files or directories (default: configs/rubrics/{sa,pbl,msr}.yaml)")
    p.add_argument("--deepspeed", help="DeepSpeed JSON, e.g. configs/deepspeed/zero2.json (default: none)")
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint in --output_dir (default: start fresh)")
    # The deepspeed launcher passes this flag; the rank itself is read from LOCAL_RANK, which it sets as torchrun does.
    p.add_argument("--local_rank", "--local-rank", type=int, help="this process's device on its node, passed by the deepspeed launcher "
                                                                  "(default: set by the launcher)")
    add_settings_flags(p, TrainConfig())
    add_common_flags(p)
    return p


def merge_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="judge-train merge", description="Fold a LoRA adapter into its base and write a standalone checkpoint.")
    p.add_argument("--adapter", required=True, help="a judge-train output holding an adapter: its directory or a Hugging Face Hub id")
    add_revision_flag(p, of="--adapter")
    p.add_argument("--output_dir", required=True, help="where the merged checkpoint goes: a new or empty directory")
    p.add_argument("--format", choices=("native", "original"), default="native",
                   help="native: transformers' InternVL, as this toolkit and transformers read it; original: InternVL2's own format "
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
    from judge.model import checkpoint_format, find_checkpoint, load_judge, original_base, save_native, save_original

    adapter = find_checkpoint(args.adapter, args.revision).path
    if checkpoint_format(adapter) != "adapter":
        raise UsageError(f"--adapter {args.adapter}: not a LoRA adapter directory (no adapter_config.json)")
    base = original_base(adapter) if args.format == "original" else None  # refused here, before the weights load
    judge = load_judge(adapter)
    print(f"merged checkpoint ({args.format} format): {save_original(judge, base, out) if base else save_native(judge, out)}")
    return 0


def fine_tune(argv) -> int:
    args = build_parser().parse_args(argv)
    cfg = settings_from_config(TrainConfig, args.config, args)
    out = Path(args.output_dir)
    if problems := config_problems(cfg) + run_problems(args, out):
        raise UsageError(problems[0] if len(problems) == 1 else
                         f"{len(problems)} problems with the settings (from {args.config}) and flags:\n  " + "\n  ".join(problems))
    rubrics = load_rubrics(args.rubric or DEFAULT_RUBRICS)
    from judge.distributed import end_process_group
    from train.recipe import train

    try:
        result = train(args.model_path, args.revision, Path(args.train_file), Path(args.eval_file) if args.eval_file else None,
                       Path(args.input_dir), out, rubrics, cfg, args.deepspeed, args.resume)
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
    from transformers.trainer_utils import get_last_checkpoint  # here: --help needs no transformers

    problems = []
    if args.deepspeed:
        try:
            read_json(args.deepspeed)
        except InputError as err:
            problems += [f"--deepspeed {problem}" for problem in err.problems]
    checkpoints = out / CHECKPOINTS_DIR
    if args.resume and not (checkpoints.is_dir() and get_last_checkpoint(checkpoints)):
        problems.append(f"--resume: nothing to resume in {out} (no checkpoint in {checkpoints}); drop --resume to start a fresh run")
    if not args.resume and out.is_dir() and any(out.iterdir()):
        problems.append(f"--output_dir {out} is not empty (an earlier run?); give a new or empty directory, or --resume to continue that run")
    return problems


if __name__ == "__main__":
    sys.exit(main())
