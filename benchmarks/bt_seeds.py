"""The Bradley-Terry reward head on many seeds: for each seed N, synthetic annotated pairs of seed N (`python -m
mmjudge.judge.testing pairs --annotated --text_only --no_rationale`, people preferring the answer with the better
closing marker), split by pair into training and test pairs; the tiny random judge of seed N; `judge-train
--objective bradley_terry --config tiny --seed N` on the training pairs, run as a user runs it; then the
saved reward model's pairwise accuracy on the test pairs (how often the answer people preferred gets the
higher reward; ties out, as they are out of training). Writes DIR/bt_seeds.json (the record docs/reward-models.md's table is
checked against: docs/benchmarks/bt_seeds.json) and DIR/bt_seeds.md, and exits 1 when a seed ends below --min_accuracy.

    python benchmarks/bt_seeds.py                           # seeds 0-4 into bt_seeds/
    python benchmarks/bt_seeds.py --seeds 2 --output_dir /tmp/bt

Wall-clock seconds depend on what else the machine runs; the table gives them as measured.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

from mmjudge.demo.cli import cpu_name
from mmjudge.judge.data import load_pairs
from mmjudge.judge.model import load_judge
from mmjudge.judge.prompts import load_rubrics
from mmjudge.judge.testing import write_original_checkpoint, write_pairs
from mmjudge.train.bradley_terry import PairCollator, build_pair_dataset, pairwise_accuracy
from mmjudge.train.data import Collator

# Each answer alone under a pointwise rubric of the synthetic pairs' category (general).
RUBRIC = "category: general\ninstructions: Rate the answer.\ntemplate: \"{instructions}\\n### Question\\n{question}\\n### Answer\\n{answer}\\n\"\n"
PAIRS, TEST_PAIRS = 120, 40


def split(root: Path, seed: int) -> None:
    """root/train.json and root/test.json: the pairs of seed `seed`, the first TEST_PAIRS ids for testing."""
    records = json.loads(write_pairs(root, PAIRS, seed=seed, annotated=True, text_only=True, rationale=False).read_text())
    test = sorted({r["id"] for r in records})[:TEST_PAIRS]
    (root / "train.json").write_text(json.dumps([r for r in records if r["id"] not in test]))
    (root / "test.json").write_text(json.dumps([r for r in records if r["id"] in test]))
    (root / "general.yaml").write_text(RUBRIC)


def test_accuracy(judge_dir: Path, root: Path) -> tuple[float, int]:
    judge = load_judge(judge_dir)
    pairs = build_pair_dataset(judge, load_pairs(root / "test.json", root, preferred=True), load_rubrics([root / "general.yaml"]), root,
                               8192, None, "test.json")
    collate = PairCollator(Collator(judge.pad_id, judge.backbone, judge.settings.images))
    return pairwise_accuracy(judge.model, pairs, collate, 16, torch.device("cpu")), len(pairs)


def run_seed(seed: int, out: Path, extra: list[str]) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    root = out / "data"
    split(root, seed)
    base = write_original_checkpoint(out / "tiny-judge", seed=seed)
    command = [str(Path(sys.executable).parent / "judge-train"), "--model_path", str(base), "--train_file", str(root / "train.json"),
               "--input_dir", str(root), "--output_dir", str(out / "reward"), "--config", "tiny", "--rubric", str(root / "general.yaml"),
               "--objective", "bradley_terry", "--seed", str(seed), *extra]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed with exit code {done.returncode}:\n{done.stderr[-3000:]}")
    steps = int(done.stdout.split("(steps: ")[1].split(",")[0])
    accuracy, test_pairs = test_accuracy(out / "reward", root)
    return {"seed": seed, "test_pairs": test_pairs, "steps": steps, "test_accuracy": accuracy, "seconds": round(seconds, 1)}


def markdown(record: dict) -> str:
    """The table of a run's record (DIR/bt_seeds.json), as docs/reward-models.md shows it."""
    results, min_accuracy = record["seeds"], record["min_accuracy"]
    lines = [f"`{record['command']}` on {record['machine']}; pairwise accuracy on the test pairs without a tie, of the {TEST_PAIRS} held out.", "",
             "| seed | test pairs | steps | test accuracy | judge-train (s) |", "|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['seed']} | {r['test_pairs']} | {r['steps']} | {r['test_accuracy']:.3f} | {r['seconds']:.0f} |" for r in results]
    passed = sum(r["test_accuracy"] >= min_accuracy for r in results)
    lines += ["", f"{passed} of {len(results)} seeds at {min_accuracy} or above; lowest {min(r['test_accuracy'] for r in results):.3f}."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=list(range(5)), help="seeds (default: 0 to 4)")
    p.add_argument("--output_dir", default="bt_seeds", help="each seed's run in seed-N/, and the tables (default: bt_seeds)")
    p.add_argument("--min_accuracy", type=float, default=0.9, help="the least test accuracy every seed must reach (default: 0.9)")
    p.add_argument("--num_epochs", default="4", help="judge-train's --num_epochs (default: 4)")
    args = p.parse_args(argv)
    out = Path(args.output_dir)
    extra = ["--num_epochs", args.num_epochs]
    results = []
    for seed in args.seeds:
        results.append(run_seed(seed, out / f"seed-{seed}", extra))
        print(json.dumps(results[-1]), flush=True)
    out.mkdir(parents=True, exist_ok=True)
    record = {"command": f"python benchmarks/bt_seeds.py --seeds {' '.join(map(str, args.seeds))} --num_epochs {args.num_epochs}",
              "machine": f"{cpu_name()}, {os.cpu_count()} cores, beside other jobs", "min_accuracy": args.min_accuracy, "seeds": results}
    (out / "bt_seeds.json").write_text(json.dumps(record, indent=1) + "\n")
    table = markdown(record)
    (out / "bt_seeds.md").write_text(table)
    print(table)
    return 0 if all(r["test_accuracy"] >= args.min_accuracy for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
