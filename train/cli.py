"""judge-train: fine-tune a judge (InternVL2/2.5/3, Qwen2.5-VL, Qwen3-VL, Qwen3.5) on human-rated annotations.

    judge-train --model_path BASE --train_file train.json --input_dir DATA --output_dir OUT [--eval_file heldout.json]
    judge-train --model_path BASE --train_file pairs.json --input_dir DATA --output_dir OUT  # pairs: the pairwise rubric
    judge-train ... --train_file pairs.json --rubric POINTWISE.yaml --objective bradley_terry   # a reward head (docs/reward-models.md)
    judge-train ... --train_file pairs.json --objective grpo        # GRPO over TRL from a judge-train judge (docs/grpo.md)
    judge-train mine --scores eval_result.json --train_file pairs.json --output_file hard.json   # the pairs a judge gets wrong
    judge-train merge --adapter OUT --output_dir MERGED [--format native|original]

Many GPUs or nodes: `torchrun --nproc_per_node N -m mmjudge.train.cli ...` or `deepspeed --module mmjudge.train.cli ...` (add
--deepspeed zero2); docs/training.md shows both, on one node and on several.
Settings are TrainConfig's defaults (InternVL's LoRA recipe for InternVL2-4B), overridden by --config (a YAML
holding what differs, or a bundled preset by name: --config tiny) and then by the flag of each setting's name; --help shows the values
that apply, --config's included when one is given.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields
from pathlib import Path

from mmjudge.infer.loaded import find_checkpoint
from mmjudge.judge.cli import CommandParser, add_common_flags, add_revision_flag, add_settings_flags, config_given, config_values, run
from mmjudge.judge.data import UsageError
from mmjudge.judge.outputs import written_whole
from mmjudge.train.config import TrainConfig
from mmjudge.train.run import fine_tune as run_fine_tune

# judge.model and the training recipe are imported where they are used (here and in train/run.py): they load
# torch and transformers (seconds), which --help, --version and a bad flag's message do not need.


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    p = CommandParser(prog="judge-train", description=__doc__)
    p.add_argument("--model_path", required=True, help="base judge checkpoint, a local directory or a Hugging Face Hub id "
                                                       "(InternVL2/2.5/3 original or -hf, Qwen2.5-VL, Qwen3-VL, Qwen3.5, or a merged judge)")
    add_revision_flag(p)
    p.add_argument("--train_file", required=True, path="file", help="annotations to learn from (JSON list or JSONL): samples with human_scores, "
                                                                     "or pairs with a preference, each learnt in both orders under a pairwise rubric")
    p.add_argument("--input_dir", required=True, path="dir", help="directory that image paths in the annotations are relative to")
    p.add_argument("--output_dir", required=True, path="output_dir", help="where the trained judge, checkpoints and eval_history.json go: "
                                                                          "a new or empty directory, unless --resume")
    p.add_argument("--eval_file", path="file", help="held-out annotations scored at every checkpoint (default: none)")
    p.add_argument("--config", path="file", bundled="train", help="YAML of the settings that differ from the defaults below (default: none)")
    p.add_argument("--rubric", nargs="+", path="file_or_dir", bundled="rubrics", help="rubric YAML files or directories (default: sa pbl msr, and pairwise for pairs)")
    p.add_argument("--deepspeed", path="file", bundled="deepspeed", help="DeepSpeed JSON (default: none)")
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint in --output_dir (default: start fresh)")
    # The deepspeed launcher passes this flag; the rank itself is read from LOCAL_RANK, which it sets as torchrun does.
    p.add_argument("--local_rank", type=int, help="this process's device on its node, passed by the deepspeed launcher (default: set by the launcher)")
    add_settings_flags(p, TrainConfig, config_values(TrainConfig, config_given(argv, "train"), argparse.Namespace()))
    add_common_flags(p)
    return p


def merge_parser() -> argparse.ArgumentParser:
    p = CommandParser(prog="judge-train merge", description="Fold a LoRA adapter into its base and write a standalone checkpoint.")
    p.add_argument("--adapter", required=True, help="a judge-train output holding an adapter: its directory or a Hugging Face Hub id")
    add_revision_flag(p, of="--adapter")
    p.add_argument("--output_dir", required=True, path="output_dir", help="where the merged checkpoint goes: a new or empty directory")
    p.add_argument("--format", choices=("native", "original"), default="native",
                   help="native: transformers' own layout of the backbone (the released layout of a -hf InternVL, Qwen2.5-VL, "
                        "Qwen3-VL or Qwen3.5 base), as this toolkit, transformers and vLLM read it; original: InternVL's own format "
                        "(InternVLChatModel) in the layout of the adapter's original base, with its code, as InternVL's code, MMIE's "
                        "main.py, vLLM and LMDeploy read it (default: native)")
    add_common_flags(p)
    return p


def mine_parser() -> argparse.ArgumentParser:
    p = CommandParser(prog="judge-train mine", description="Keep the pairs a judge gets wrong or is inconsistent on (train/mining.py), "
                                                            "for --objective grpo.")
    p.add_argument("--scores", required=True, path="file", help="judge-score's eval_result.json of the training pairs, judged with --samples k")
    p.add_argument("--train_file", required=True, path="file", help="the pairs with a preference that were scored")
    p.add_argument("--input_dir", path="dir", help="directory that image paths in the pairs are relative to (default: --train_file's)")
    p.add_argument("--output_file", required=True, path="output_file", help="where the hard pairs' records go (JSON list)")
    add_common_flags(p)
    return p


def main(argv=None) -> int:
    return run(_main, argv)


def _main(argv) -> int:
    subcommands = {"merge": merge, "mine": mine}
    return subcommands[argv[0]](argv[1:]) if argv and argv[0] in subcommands else fine_tune(argv)


def mine(argv) -> int:
    args = mine_parser().parse_args(argv)
    train_file, out = Path(args.train_file), Path(args.output_file)
    for flag, given in (("--train_file", train_file), ("--scores", Path(args.scores))):
        if out.resolve() == given.resolve():
            raise UsageError(f"--output_file {out}: it is {flag}, an input; give another file")
    from mmjudge.train.mining import mine as mine_pairs

    found = mine_pairs(Path(args.scores), train_file, Path(args.input_dir) if args.input_dir else train_file.parent, out)
    print(f"hard pairs: {found['hard']} of {found['pairs']} ({found['wrong']} wrong, {found['inconsistent']} inconsistent), "
          f"{found['records']} records: {out}")
    return 0


def merge(argv) -> int:
    args = merge_parser().parse_args(argv)
    out = Path(args.output_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"--output_dir {out} is not an empty directory; give a new or empty one")
    from mmjudge.judge.backbones.internvl import save_original
    from mmjudge.judge.model import checkpoint_format, load_judge, original_base, save_native

    adapter = find_checkpoint(args.adapter, args.revision, "--adapter").path
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
    settings = {f.name: getattr(args, f.name) for f in fields(TrainConfig)}  # None: not given, the config's or the default applies
    result = run_fine_tune(args.model_path, args.train_file, args.output_dir, input_dir=args.input_dir, eval_file=args.eval_file,
                           config=args.config, rubrics=args.rubric, deepspeed=args.deepspeed, resume=args.resume, revision=args.revision,
                           **settings)
    print(f"trained judge: {result.output_dir}  (steps: {result.global_step}, {chosen_by(result.best, result.evaluated, result.measure)})")
    return 0


def chosen_by(best: float | None, evaluated: bool, measure: str = "overall Pearson") -> str:
    """How the saved weights were chosen, in words."""
    if not evaluated:
        return "the last step's weights: no --eval_file to choose a checkpoint by"
    if best is None:
        why = "too few overall scores parsed, or all alike" if measure == "overall Pearson" else "no verdict parsed"
        return f"best {measure}: undefined at every evaluation ({why}); the first checkpoint kept"
    return f"best {measure}: {best:.3f}"


if __name__ == "__main__":
    sys.exit(main())
