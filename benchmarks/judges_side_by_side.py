"""The three kinds of judge mmjudge trains, from the same tiny judge on the same pairs and measured on the same
test pairs: a Bradley-Terry reward head, a generative pairwise judge (SFT), and that judge trained further by GRPO
(a reasoning judge's recipe: verdict, format and swap-consistency rewards). For each: pairwise accuracy (with ties
as a verdict, and without), swap consistency, and the scoring engine's seconds per 1,000 pairs (the model loaded,
prompts prepared; the time of scoring them, both orders for the generative judges, each answer once for the head).

For each seed N: bt_seeds.py's pairs and split (120 pairs, 40 for testing, no rationale) and tiny judge of
seed N; the reward head as bt_seeds.py trains it; the generative judge by `judge-train --config tiny --rubric
tiny --seed N --num_epochs E` on the same training pairs (each in both orders, the verdict as the target); the
GRPO judge by `judge-train --objective grpo` from that generative judge on the same pairs (--grpo: its flags).
Writes DIR/side_by_side.json and DIR/side_by_side.md.

    python benchmarks/judges_side_by_side.py --seeds 0 1 --output_dir /tmp/sbs
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from mmjudge.judge.cpu import use_free_cores  # noqa: E402

# Before torch loads: the engine here computes in this process, with judge-score's threads (judge/cpu.py). With
# torch's own choice, 2 spinning threads on a 2-core machine with other work running, a pair took 35 times as long
# as on 1 thread (the head: 380 s against 11 s per 1,000 pairs, back to back at load 4.7).
use_free_cores()

from bt_seeds import split  # noqa: E402  (the same pairs and split as the seed table)

from mmjudge.configs import CONFIG_DIR  # noqa: E402
from mmjudge.demo.cli import cpu_name, load_average  # noqa: E402
from mmjudge.infer.engine import prepare  # noqa: E402
from mmjudge.infer.options import ScoreOptions  # noqa: E402
from mmjudge.infer.reward_model import scorer_for  # noqa: E402
from mmjudge.judge.data import load_pairs, majority  # noqa: E402
from mmjudge.judge.model import load_judge  # noqa: E402
from mmjudge.judge.prompts import load_rubrics  # noqa: E402
from mmjudge.judge.testing import write_original_checkpoint  # noqa: E402

GENERATIVE_RUBRIC = CONFIG_DIR / "rubrics" / "tiny"
# GRPO's steps, learning rate and sampling as recorded in docs/benchmarks/side_by_side.json: grpo_seeds.py's first
# recipe (80 steps at temperature 0.5). Its recipe now (200 steps at temperature 1.0, --min_p 0.3, --kl_beta 0.1)
# found the pair rule from judges that wrote one position, in about 20 minutes a seed here.
GRPO = "--max_steps 80 --learning_rate 1e-3 --temperature 0.5 --num_generations 4 --per_device_batch_size 32 --max_completion_length 16"
KINDS = {"reward": "Bradley-Terry head", "generative": "generative pairwise (SFT)", "grpo": "generative pairwise, SFT then GRPO"}


def train(base: Path, root: Path, out: Path, rubric: Path, seed: int, extra: list[str]) -> float:
    command = [str(Path(sys.executable).parent / "judge-train"), "--model_path", str(base), "--train_file", str(root / "train.json"),
               "--input_dir", str(root), "--output_dir", str(out), "--config", "tiny", "--rubric", str(rubric), "--seed", str(seed), *extra]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed with exit code {done.returncode}:\n{done.stderr[-3000:]}")
    return time.perf_counter() - start


def measured(judge_dir: Path, root: Path, rubric: Path) -> dict:
    """Accuracy and swap consistency on the test pairs, and the engine's seconds to score them."""
    judge = load_judge(judge_dir)
    rubrics = load_rubrics([rubric])
    pairs = load_pairs(root / "test.json", root, preferred=True)
    people = {}
    for pair in pairs:
        people.setdefault(pair.id, []).append(pair.preference)
    unique = list({pair.id: pair for pair in pairs}.values())
    options = ScoreOptions(max_new_tokens=16, workers=1)
    items = prepare(judge, list(enumerate(unique)), rubrics, root, options)
    start, cpu_start = time.perf_counter(), time.process_time()
    results = [result for batch in scorer_for(judge, rubrics, options, "cpu").judged(items) for _, result in batch]
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    compared = [(r.verdict, majority(people[r.id])) for r in results if r.verdict is not None]
    decisive = [(j, h) for j, h in compared if "tie" not in (j, h)]
    consistent = [r.swap_consistent for r in results if r.swap_consistent is not None]
    rate = lambda values: sum(values) / len(values) if values else None  # noqa: E731
    return {"pairs": len(unique), "accuracy_with_ties": rate([j == h for j, h in compared]), "accuracy_without_ties": rate([j == h for j, h in decisive]),
            "swap_consistency": rate(consistent), "seconds_per_1000_pairs": round(seconds / len(unique) * 1000, 1),
            # this process's CPU seconds, every thread's: what other work on a shared machine moves far less than wall time
            "cpu_seconds_per_1000_pairs": round(cpu_seconds / len(unique) * 1000, 1)}


def run_seed(seed: int, out: Path, args: argparse.Namespace) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    root = out / "data"
    split(root, seed)
    base = write_original_checkpoint(out / "tiny-judge", seed=seed)
    epochs = ["--num_epochs", args.num_epochs]
    seconds = {"reward": train(base, root, out / "reward", root / "general.yaml", seed, [*epochs, "--objective", "bradley_terry"]),
               "generative": train(base, root, out / "generative", GENERATIVE_RUBRIC, seed, epochs)}
    seconds["grpo"] = train(out / "generative", root, out / "grpo", GENERATIVE_RUBRIC, seed, ["--objective", "grpo", *shlex.split(args.grpo)])
    rubrics = {"reward": root / "general.yaml", "generative": GENERATIVE_RUBRIC, "grpo": GENERATIVE_RUBRIC}
    return {"seed": seed, **{kind: {**measured(out / kind, root, rubric), "training_seconds": round(seconds[kind], 1)} for kind, rubric in rubrics.items()}}


def markdown(record: dict) -> str:
    shown = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
    before, after = record["load_average_before_after"]
    lines = [f"`{record['command']}` on {record['machine']} (load average {before} when it started, {after} when it ended); "
             "the 40 test pairs of each seed.", "",
             "| seed | judge | accuracy (ties a verdict) | accuracy (ties out) | swap consistency | s / 1,000 pairs (scoring) "
             "| CPU s / 1,000 pairs | judge-train (s) |",
             "|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in record["seeds"]:
        for kind, name in KINDS.items():
            m = r[kind]
            consistency = "1 (each answer alone)" if kind == "reward" else shown(m["swap_consistency"])
            lines.append(f"| {r['seed']} | {name} | {shown(m['accuracy_with_ties'])} | {shown(m['accuracy_without_ties'])} | {consistency} "
                         f"| {m['seconds_per_1000_pairs']:.0f} | {m['cpu_seconds_per_1000_pairs']:.0f} | {m['training_seconds']:.0f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds (default: 0 1 2)")
    p.add_argument("--output_dir", default="side_by_side", help="each seed's runs in seed-N/, and the tables (default: side_by_side)")
    p.add_argument("--num_epochs", default="4", help="judge-train's --num_epochs for the head and the SFT judge (default: 4)")
    p.add_argument("--grpo", default=GRPO, help=f"judge-train's flags for GRPO (default: {GRPO!r})")
    args = p.parse_args(argv)
    out = Path(args.output_dir)
    results, load_before = [], load_average()
    for seed in args.seeds:
        results.append(run_seed(seed, out / f"seed-{seed}", args))
        print(json.dumps(results[-1]), flush=True)
    record = {"command": f"python benchmarks/judges_side_by_side.py --seeds {' '.join(map(str, args.seeds))} --num_epochs {args.num_epochs} "
                         f"--grpo {shlex.quote(args.grpo)}",
              "machine": f"{cpu_name()}, {os.cpu_count()} cores, beside other jobs",
              "load_average_before_after": [load_before, load_average()], "seeds": results}
    out.mkdir(parents=True, exist_ok=True)
    (out / "side_by_side.json").write_text(json.dumps(record, indent=1) + "\n")
    (out / "side_by_side.md").write_text(markdown(record))
    print(markdown(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
