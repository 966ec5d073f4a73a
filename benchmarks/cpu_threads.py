"""CPU work on a busy machine, before and after judge/cpu.py chooses torch's threads: small matrix products per
second, and judge-train's seconds per step on the tiny judge (configs/train/tiny.yaml, as the demo trains),
while `--busy` processes keep cores busy (on top of whatever else the machine runs; its load is recorded).

    python benchmarks/cpu_threads.py --busy 1                  # the figures in docs/performance.md
    python benchmarks/cpu_threads.py --busy 0 --repeats 1      # idle machine, once

Each figure is a fresh process (OpenMP reads its settings when torch loads), the median of --repeats:
- before: torch's own choice, one thread per core, waiting by spinning (no OMP_* variable set);
- 1 thread / every core, passive: those settings by hand;
- after: what every command now sets (judge.cpu.use_free_cores, called by judge.cli.run).
judge-train before is its fine-tuning called directly, as `main` ran it before run() chose the threads.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MATRIX = 128  # a product of 128 x 128 float32 matrices: small, as most of a tiny judge's products are


def matmul_rate(seconds: float) -> dict:
    import torch

    a, b = torch.randn(MATRIX, MATRIX), torch.randn(MATRIX, MATRIX)
    done, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        a @ b
        done += 1
    return {"per_s": done / elapsed, "threads": torch.get_num_threads()}


def train_step_s(steps: int, through_run: bool) -> dict:
    """The median time of judge-train's training steps (forward, backward; the first, warming up, left out)."""
    from mmjudge.configs import CONFIG_DIR
    from mmjudge.judge.testing import write_dataset, write_original_checkpoint
    from mmjudge.train import cli
    from mmjudge.train.recipe import JudgeTrainer

    root = Path(tempfile.mkdtemp(prefix="cpu-threads-"))
    base = write_original_checkpoint(root / "base", seed=0)
    write_dataset(root / "data", 32, seed=0, annotated=True)
    argv = ["--model_path", str(base), "--train_file", str(root / "data" / "data.json"), "--input_dir", str(root / "data"),
            "--output_dir", str(root / "out"), "--config", str(CONFIG_DIR / "train" / "tiny.yaml"), "--rubric", str(CONFIG_DIR / "rubrics" / "tiny"),
            "--max_steps", str(steps), "--save_steps", str(steps), "--logging_steps", str(steps)]
    times, step = [], JudgeTrainer.training_step

    def timed(self, *a, **k):
        start = time.perf_counter()
        try:
            return step(self, *a, **k)
        finally:
            times.append(time.perf_counter() - start)

    JudgeTrainer.training_step = timed
    try:
        assert (cli.main(argv) if through_run else cli.fine_tune(argv)) == 0
    finally:
        shutil.rmtree(root)
    import torch

    return {"per_step_s": statistics.median(times[1:]), "threads": torch.get_num_threads()}


def worker(args) -> None:
    if args.after:
        from mmjudge.judge.cpu import use_free_cores

        use_free_cores()  # what judge.cli.run does first
    result = matmul_rate(args.seconds) if args.work == "matmul" else train_step_s(args.steps, args.after)
    print(json.dumps({**result, "wait": os.environ.get("OMP_WAIT_POLICY")}))


SETTINGS = {  # name -> (OMP_* variables, whether use_free_cores chooses)
    "before: torch's own (a thread per core, spinning)": ({}, False),
    "1 thread": ({"OMP_NUM_THREADS": "1"}, False),
    "every core, passive": ({"OMP_NUM_THREADS": str(len(os.sched_getaffinity(0))), "OMP_WAIT_POLICY": "PASSIVE"}, False),
    "after: judge/cpu.py's choice": ({}, True),
}


def measure(work: str, args, settings: dict, after: bool) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMP_")} | settings
    command = [sys.executable, __file__, "--worker", work, "--seconds", str(args.seconds), "--steps", str(args.steps), *(["--after"] if after else [])]
    runs = []
    for _ in range(args.repeats):
        load = os.getloadavg()[0]
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
        runs.append({**json.loads(done.stdout.strip().splitlines()[-1]), "load_before": load})
    return runs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--busy", type=int, default=1, help="processes that spin on a core while measuring (default: 1)")
    p.add_argument("--repeats", type=int, default=3, help="fresh processes per figure; the median is reported (default: 3)")
    p.add_argument("--seconds", type=float, default=5.0, help="seconds of matrix products per process (default: 5)")
    p.add_argument("--steps", type=int, default=8, help="judge-train steps per process (default: 8)")
    p.add_argument("--work", choices=["matmul", "train", "both"], default="both")
    p.add_argument("--output", help="JSON of every run (default: none)")
    p.add_argument("--worker", choices=["matmul", "train"], help=argparse.SUPPRESS)
    p.add_argument("--after", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        args.work = args.worker
        return worker(args)
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    results = {}
    try:
        time.sleep(2 if busy else 0)
        for work in (["matmul", "train"] if args.work == "both" else [args.work]):
            for name, (settings, after) in SETTINGS.items():
                runs = measure(work, args, settings, after)
                key = "per_s" if work == "matmul" else "per_step_s"
                results[f"{work} | {name}"] = runs
                print(f"{work:6} | {name:50} | {statistics.median(r[key] for r in runs):10.3f} {'products/s' if work == 'matmul' else 's/step':10} "
                      f"| threads {runs[0]['threads']}, wait {runs[0]['wait']} | load {statistics.median(r['load_before'] for r in runs):.1f}", flush=True)
    finally:
        for process in busy:
            process.kill()
            process.wait()
    if args.output:
        Path(args.output).write_text(json.dumps({"busy": args.busy, "cores": len(os.sched_getaffinity(0)), "results": results}, indent=2))


if __name__ == "__main__":
    main()
