"""The demo on many seeds: `judge-demo --seed N` for each N, run as a user runs it, one after another, with
the agreement it reports on its test split (Pearson of the judge's expected score with the human overall
score, before and after training), the best validation Pearson judge-train kept its checkpoint by, and the
time of the whole demo and of its training step. Writes DIR/demo_seeds.json and DIR/demo_seeds.md (the table
the README's demo section shows), and exits 1 when a seed ends below --min_pearson.

    python benchmarks/demo_seeds.py                           # seeds 0-9 into demo_seeds/
    python benchmarks/demo_seeds.py --seeds 2 5 --output_dir /tmp/seeds

Times depend on what else the machine runs: the table says the machine, its cores and its load average
(1-minute, as /proc/loadavg gives it) before and after each seed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

STEP_TIME = re.compile(r"^== (\S+?):.*?\n.*?\n\s+ok in (\d+)s", re.MULTILINE | re.DOTALL)


def load_average() -> float | None:
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def cpu_name() -> str:
    try:
        return next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def run_seed(seed: int, out: Path) -> dict:
    """One demo, as `judge-demo --seed N --output_dir OUT` runs it, and the figures it wrote."""
    shutil.rmtree(out, ignore_errors=True)
    command = [str(Path(sys.executable).parent / "judge-demo"), "--seed", str(seed), "--output_dir", str(out)]
    load_before, start = load_average(), time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"judge-demo --seed {seed} failed with exit code {done.returncode}:\n{done.stdout[-2000:]}{done.stderr[-3000:]}")
    report = json.loads((out / "report" / "report.json").read_text())
    pearson = {name: report["judges"][name]["criteria"]["overall"]["all"]["pearson"]["value"] for name in ("before", "after")}
    history = json.loads((out / "trained-judge" / "eval_history.json").read_text())
    steps = {name: int(s) for name, s in STEP_TIME.findall(done.stdout)}
    return {"seed": seed, "pearson_before": pearson["before"], "pearson_after": pearson["after"],
            "best_validation_pearson": max((h["overall"]["pearson"] for h in history if h["overall"]["pearson"] is not None), default=None),
            "seconds": round(seconds, 1), "training_seconds": steps.get("3"), "load_before": load_before, "load_after": load_average()}


def _figure(value: float | None) -> str:
    return "undefined" if value is None else f"{value:.3f}"


def markdown(results: list[dict], machine: str, min_pearson: float) -> str:
    lines = [f"`judge-demo --seed N` (configs/demo.yaml, configs/train/tiny.yaml) on {machine}; Pearson of the judge's expected "
             "score with the human overall score on the 80 test samples.", "",
             "| seed | before | after | best validation | demo (s) | training (s) | load average before / after |",
             "|---:|---:|---:|---:|---:|---:|---|"]
    for r in results:
        lines.append(f"| {r['seed']} | {_figure(r['pearson_before'])} | {_figure(r['pearson_after'])} | {_figure(r['best_validation_pearson'])} "
                     f"| {r['seconds']:.0f} | {r['training_seconds'] if r['training_seconds'] is not None else '-'} "
                     f"| {r['load_before']} / {r['load_after']} |")
    after = [r["pearson_after"] if r["pearson_after"] is not None else float("-inf") for r in results]
    seconds = [r["seconds"] for r in results]
    lines += ["", f"After training: lowest {min(after):.3f}, median {statistics.median(after):.3f}; "
                  f"{sum(a >= min_pearson for a in after)} of {len(after)} seeds at {min_pearson} or above. "
                  f"Demo time: median {statistics.median(seconds):.0f} s, longest {max(seconds):.0f} s."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=list(range(10)), help="demo seeds (default: 0 to 9)")
    p.add_argument("--output_dir", default="demo_seeds", help="each seed's demo in SEED-N/, and the tables (default: demo_seeds)")
    p.add_argument("--min_pearson", type=float, default=0.95, help="the test-split Pearson every seed must reach (default: 0.95)")
    args = p.parse_args(argv)
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    machine = f"{cpu_name()}, {os.cpu_count()} cores"
    results = []
    for seed in args.seeds:
        results.append(run_seed(seed, out / f"seed-{seed}"))
        r = results[-1]
        print(f"seed {seed}: Pearson {_figure(r['pearson_before'])} -> {_figure(r['pearson_after'])} in {r['seconds']:.0f} s "
              f"(training {r['training_seconds']} s, load {r['load_before']} -> {r['load_after']})", flush=True)
        # written after each seed: ten demos take a while, and an interrupted run keeps what it measured
        (out / "demo_seeds.json").write_text(json.dumps({"machine": machine, "command": "judge-demo --seed N", "seeds": results}, indent=1) + "\n")
        (out / "demo_seeds.md").write_text(markdown(results, machine, args.min_pearson))
    print(f"\n{markdown(results, machine, args.min_pearson)}\nwritten: {out / 'demo_seeds.json'}, {out / 'demo_seeds.md'}")
    low = [r["seed"] for r in results if r["pearson_after"] is None or r["pearson_after"] < args.min_pearson]
    return 1 if low else 0


if __name__ == "__main__":
    sys.exit(main())
