"""GRPO on a judge that SFT left short, on many seeds: for each seed N, synthetic annotated pairs of seed N
(`python -m mmjudge.judge.testing pairs --annotated --text_only --no_rationale`, people preferring the answer with
the better closing marker), the pairs people rank (ties out, as in bt_seeds.py) split by pair into training and
test pairs; the tiny random judge of seed N; `judge-train --config tiny` on the training pairs for too few steps to
apply the rule over its position bias (the SFT judge); `judge-train --objective grpo` from it on the same pairs;
each judge's accuracy on the test pairs (judge-score in both orders, the agree rule: a judge whose two orders
disagree gives a tie, a wrong verdict here), before and after GRPO. Every step is run as a user runs it. Writes
DIR/grpo_seeds.json (the record docs/grpo.md's table is checked against: docs/benchmarks/grpo_seeds.json) and
DIR/grpo_seeds.md, and exits 1 when a seed's GRPO judge is not more accurate than its SFT judge.

    python benchmarks/grpo_seeds.py --jobs 3                   # seeds 0-2 at once into grpo_seeds/
    python benchmarks/grpo_seeds.py --seeds 1 --output_dir /tmp/grpo

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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from mmjudge.demo.cli import cpu_name
from mmjudge.judge.testing import write_original_checkpoint, write_pairs

PAIRS, TEST_PAIRS = 300, 40


def split(root: Path, seed: int) -> None:
    """root/train.json and root/test.json: the pairs of seed `seed`, the first TEST_PAIRS ids for testing."""
    records = json.loads(write_pairs(root, PAIRS, seed=seed, annotated=True, text_only=True, rationale=False).read_text())
    records = [r for r in records if r["preference"] != "tie"]
    test = sorted({r["id"] for r in records})[:TEST_PAIRS]
    (root / "train.json").write_text(json.dumps([r for r in records if r["id"] not in test]))
    (root / "test.json").write_text(json.dumps([r for r in records if r["id"] in test]))


def command(name: str, *args: str) -> tuple[float, str]:
    """Run a console script of this venv; its wall seconds and standard output."""
    argv = [str(Path(sys.executable).parent / name), *args]
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed with exit code {done.returncode}:\n{done.stderr[-3000:]}")
    return time.perf_counter() - start, done.stdout


def test_accuracy(judge_dir: Path, root: Path, out: Path) -> float:
    """judge-score's verdicts on the test pairs against people's (the test file has one annotator per pair
    where several agree: the synthetic annotators always do)."""
    command("judge-score", "--model_path", str(judge_dir), "--input_dir", str(root), "--input_file", "test.json", "--output_dir", str(out),
            "--pair_rule", "agree", "--max_new_tokens", "16", "--max_tiles", "1")
    people = {r["id"]: r["preference"] for r in json.loads((root / "test.json").read_text())}
    verdicts = {r["id"]: r["verdict"] for r in json.loads((out / "eval_result.json").read_text())}
    return sum(verdicts[i] == people[i] for i in people) / len(people)


def run_seed(seed: int, out: Path, args: argparse.Namespace) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    root = out / "data"
    split(root, seed)
    base = write_original_checkpoint(out / "tiny-judge", seed=seed)
    common = ["--train_file", str(root / "train.json"), "--input_dir", str(root), "--config", "tiny", "--seed", str(seed)]
    sft_seconds, _ = command("judge-train", "--model_path", str(base), "--output_dir", str(out / "sft"), *common,
                             "--max_steps", str(args.sft_steps), "--save_steps", str(args.sft_steps), "--learning_rate", "1e-3")
    grpo_seconds, _ = command("judge-train", "--model_path", str(out / "sft"), "--output_dir", str(out / "grpo"), *common,
                              "--objective", "grpo", "--max_steps", str(args.grpo_steps), "--save_steps", str(args.grpo_steps),
                              "--learning_rate", args.grpo_learning_rate, "--temperature", args.temperature, "--min_p", args.min_p, "--kl_beta", args.kl_beta,
                              "--num_generations", str(args.num_generations),
                              "--per_device_batch_size", str(args.grpo_batch_size), "--max_completion_length", "16", "--logging_steps", "10")
    rewards = json.loads((out / "grpo" / "reward_history.json").read_text())
    return {"seed": seed, "test_pairs": TEST_PAIRS, "sft_steps": args.sft_steps, "sft_accuracy": test_accuracy(out / "sft", root, out / "scored-sft"),
            "grpo_steps": args.grpo_steps, "grpo_accuracy": test_accuracy(out / "grpo", root, out / "scored-grpo"),
            "first_reward": rewards[0]["reward"], "last_reward": rewards[-1]["reward"],
            "sft_seconds": round(sft_seconds, 1), "grpo_seconds": round(grpo_seconds, 1)}


def markdown(record: dict) -> str:
    """The table of a run's record (DIR/grpo_seeds.json), as docs/grpo.md shows it."""
    results = record["seeds"]
    lines = [f"`{record['command']}` on {record['machine']}; accuracy on the {TEST_PAIRS} test pairs under the agree rule "
             "(a pair whose two orders disagree is judged a tie, and every test pair has a preference), "
             "the reward summed over verdict, format and swap consistency (0-3), mean of the first and last 10 steps.", "",
             "| seed | SFT steps | SFT accuracy | GRPO steps | GRPO accuracy | reward first / last | SFT (s) | GRPO (s) |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['seed']} | {r['sft_steps']} | {r['sft_accuracy']:.3f} | {r['grpo_steps']} | {r['grpo_accuracy']:.3f} | "
              f"{r['first_reward']:.2f} / {r['last_reward']:.2f} | {r['sft_seconds']:.0f} | {r['grpo_seconds']:.0f} |" for r in results]
    gained = sum(r["grpo_accuracy"] > r["sft_accuracy"] for r in results)
    lines += ["", f"GRPO more accurate than its SFT judge on {gained} of {len(results)} seeds."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=list(range(3)), help="seeds (default: 0 to 2)")
    p.add_argument("--output_dir", default="grpo_seeds", help="each seed's run in seed-N/, and the tables (default: grpo_seeds)")
    p.add_argument("--sft_steps", type=int, default=80, help="judge-train's SFT steps, too few to apply the rule over the judge's position bias (default: 80)")
    p.add_argument("--grpo_steps", type=int, default=200, help="judge-train --objective grpo's steps (default: 200)")
    p.add_argument("--grpo_learning_rate", default="1e-3", help="judge-train --objective grpo's learning rate (default: 1e-3)")
    p.add_argument("--temperature", default="1.0", help="judge-train --objective grpo's sampling temperature (default: 1.0)")
    p.add_argument("--min_p", default="0.3", help="judge-train --objective grpo's min-p truncation of the sampling (default: 0.3)")
    p.add_argument("--kl_beta", default="0.1", help="judge-train --objective grpo's KL weight to the SFT judge (default: 0.1)")
    p.add_argument("--num_generations", type=int, default=4, help="judge-train --objective grpo's completions per prompt (default: 4)")
    p.add_argument("--grpo_batch_size", type=int, default=32, help="judge-train --objective grpo's completions per step (default: 32: 4 pairs)")
    p.add_argument("--jobs", type=int, default=1, help="seeds run at once (default: 1)")
    args = p.parse_args(argv)
    out = Path(args.output_dir)
    with ThreadPoolExecutor(args.jobs) as pool:  # each seed's work is in its own subprocesses
        results = list(pool.map(lambda seed: run_seed(seed, out / f"seed-{seed}", args), args.seeds))
    print("\n".join(json.dumps(r) for r in results), flush=True)
    out.mkdir(parents=True, exist_ok=True)
    record = {"command": f"python benchmarks/grpo_seeds.py --seeds {' '.join(map(str, args.seeds))} --sft_steps {args.sft_steps} "
                         f"--grpo_steps {args.grpo_steps} --grpo_learning_rate {args.grpo_learning_rate} --temperature {args.temperature} "
                         f"--min_p {args.min_p} --kl_beta {args.kl_beta} --num_generations {args.num_generations} --grpo_batch_size {args.grpo_batch_size} --jobs {args.jobs}",
              "machine": f"{cpu_name()}, {os.cpu_count()} cores, beside other jobs", "seeds": results}
    (out / "grpo_seeds.json").write_text(json.dumps(record, indent=1) + "\n")
    table = markdown(record)
    (out / "grpo_seeds.md").write_text(table)
    print(table)
    return 0 if all(r["grpo_accuracy"] > r["sft_accuracy"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
