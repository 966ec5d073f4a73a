"""python -m mmjudge.judge.testing checkpoint|dataset|pairs|verdicts ...: write a tiny random judge, a synthetic dataset,
synthetic pairs, or synthetic judges' verdicts on pairs.

    python -m mmjudge.judge.testing checkpoint --format original|native [--seed N] [--shards K] [--dtype D] [--system_message TEXT] OUT_DIR
    python -m mmjudge.judge.testing checkpoint --family NAME [--seed N] [--rope_switch N] OUT_DIR
    python -m mmjudge.judge.testing dataset --samples N [--seed N] [--annotated] [--rating marker|image|text] [--parquet] OUT_DIR
    python -m mmjudge.judge.testing pairs --pairs N [--seed N] [--annotated] [--text_only] [--no_rationale] [--parquet] OUT_DIR
    python -m mmjudge.judge.testing verdicts --pairs N [--seed N] OUT_DIR

Each prints the path it wrote. See `judge/testing/synthetic.py` for the annotated scores' rule.
"""

from __future__ import annotations

import argparse
import sys

from mmjudge.judge.cli import CommandParser, add_common_flags, run
from mmjudge.judge.data import UsageError
from mmjudge.judge.testing import write_dataset, write_pairs, write_parquet_copy, write_verdicts
from mmjudge.judge.testing.synthetic import RATINGS
from mmjudge.judge.testing.family_table import DEFAULT_SWITCH, FAMILIES

PARQUET = ("also write the records as Parquet beside the JSON (data.parquet, pairs.parquet), a record a row, each image a Hugging Face "
           "Image struct holding its bytes (default: off)")


def build_parser() -> argparse.ArgumentParser:
    p = CommandParser(prog="python -m mmjudge.judge.testing", description=__doc__)
    add_common_flags(p)
    sub = p.add_subparsers(dest="command", required=True)
    ckpt = sub.add_parser("checkpoint", help="write a tiny random InternVL2-style judge (weights, config, tokenizer)")
    ckpt.add_argument("out_dir", path="output_dir", help="directory to write (created if missing)")
    ckpt.add_argument("--format", choices=["original", "native"], default="original",
                      help="original: InternVLChatModel, as InternVL2-4B and MMIE-Eval ship; "
                           "native: transformers' InternVLForConditionalGeneration + judge_config.json (default: original)")
    ckpt.add_argument("--family", choices=list(FAMILIES),
                      help="a tiny checkpoint of this backbone family in its released layout (judge/testing/families.py); "
                           "instead of --format (default: InternVL2-4B's, by --format)")
    ckpt.add_argument("--rope_switch", type=int, default=DEFAULT_SWITCH,
                      help="with --family: where the language model's rotary embedding switches regime (Phi-3's long rope, InternLM2's "
                           f"dynamic NTK), to put prompts on both sides of it (default: {DEFAULT_SWITCH})")
    ckpt.add_argument("--seed", type=int, default=0, help="seed of the random weights (default: 0)")
    ckpt.add_argument("--shards", type=int, default=1, help="number of safetensors shards, original format only (default: 1)")
    ckpt.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                      help="stored dtype, original format only; the real checkpoint is bfloat16, float32 keeps parity checks exact (default: float32)")
    ckpt.add_argument("--system_message", help="the system message config.json gives the judge, original format only, in place of InternVL2's "
                                               "default (156 tokens of the tiny tokenizer's: half of a short prompt) (default: InternVL2's)")
    data = sub.add_parser("dataset", help="write a synthetic MMIE-format dataset: OUT_DIR/data.json and real images in OUT_DIR/images/")
    data.add_argument("out_dir", path="output_dir", help="directory to write (created if missing)")
    data.add_argument("--samples", type=int, default=24, help="number of samples (default: 24)")
    data.add_argument("--seed", type=int, default=0, help="seed of texts, images and scores (default: 0)")
    data.add_argument("--annotated", action="store_true",
                      help="add human_scores (a learnable rule of the answer), annotator, feedback, and a second annotator for every fourth sample (default: off)")
    data.add_argument("--rating", choices=RATINGS, default="marker",
                      help="what the human scores follow: marker, the answer's closing quality word and whether it has an image; image, the "
                           "colour its one image mostly shows (red or blue); text, the colour its closing sentence claims, the image's drawn "
                           "apart; the last two are twins for the bias suite's image probes, one annotator each (default: marker)")
    data.add_argument("--parquet", action="store_true", help=PARQUET)
    pairs = sub.add_parser("pairs", help="write synthetic pairs: OUT_DIR/pairs.json, with the dataset their answers come from")
    pairs.add_argument("out_dir", path="output_dir", help="directory to write (created if missing)")
    pairs.add_argument("--pairs", type=int, default=12, help="number of pairs (default: 12)")
    pairs.add_argument("--seed", type=int, default=0, help="seed of texts and images (default: 0)")
    pairs.add_argument("--annotated", action="store_true",
                       help="add a preference (the answer with the better closing marker; a tie where they match), annotator and rationale, "
                            "and a second annotator for every fourth pair (default: off)")
    pairs.add_argument("--text_only", action="store_true", help="keep the texts alone: no images (default: off)")
    pairs.add_argument("--no_rationale", action="store_true", help="with --annotated: the preference alone, no rationale (default: off)")
    pairs.add_argument("--parquet", action="store_true", help=PARQUET)
    verdicts = sub.add_parser("verdicts", help="write three synthetic judges' verdicts on pairs (sharp, fair, blunt: OUT_DIR/<judge>.json) and "
                                               "people's preferences (OUT_DIR/people.json), drawn from a known chance per pair")
    verdicts.add_argument("out_dir", path="output_dir", help="directory to write (created if missing)")
    verdicts.add_argument("--pairs", type=int, default=400, help="number of pairs (default: 400)")
    verdicts.add_argument("--seed", type=int, default=0, help="seed of the draws (default: 0)")
    return p


def main(argv=None) -> int:
    return run(_main, argv)


def _main(argv) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "checkpoint":
        path = _write_checkpoint(args)
    elif args.command == "verdicts":
        if args.pairs < 1:
            raise UsageError(f"--pairs must be at least 1, got {args.pairs}")
        path = write_verdicts(args.out_dir, args.pairs, seed=args.seed)
    elif args.command == "pairs":
        if args.pairs < 1:
            raise UsageError(f"--pairs must be at least 1, got {args.pairs}")
        path = write_pairs(args.out_dir, args.pairs, seed=args.seed, annotated=args.annotated, text_only=args.text_only,
                           rationale=not args.no_rationale)
    else:
        if args.samples < 1:
            raise UsageError(f"--samples must be at least 1, got {args.samples}")
        path = write_dataset(args.out_dir, args.samples, seed=args.seed, annotated=args.annotated, rating=args.rating)
    if args.command in ("dataset", "pairs") and args.parquet:
        print(write_parquet_copy(path))
    print(path)
    return 0


def _write_checkpoint(args: argparse.Namespace):
    original_only = args.shards != 1 or args.dtype != "float32" or args.system_message is not None
    if args.family and original_only:
        raise UsageError("--shards, --dtype and --system_message apply to --format original only; a --family checkpoint is written in its "
                         "released layout")
    if not args.family and args.shards < 1:
        raise UsageError(f"--shards must be at least 1, got {args.shards}")
    if not args.family and args.format == "native" and original_only:
        raise UsageError("--shards, --dtype and --system_message apply to --format original only; transformers writes the native format itself")
    # Imported here, after the flags are checked: the writers import torch and transformers (seconds), which
    # the dataset and pairs commands do not need.
    from mmjudge.judge.testing.checkpoints import write_native_checkpoint, write_original_checkpoint
    from mmjudge.judge.testing.families import write_family_checkpoint

    if args.family:
        return write_family_checkpoint(args.family, args.out_dir, seed=args.seed, rope_switch=args.rope_switch)
    if args.format == "original":
        return write_original_checkpoint(args.out_dir, seed=args.seed, shards=args.shards, dtype=args.dtype, system_message=args.system_message)
    return write_native_checkpoint(args.out_dir, seed=args.seed)


if __name__ == "__main__":
    sys.exit(main())
