"""The demo on many seeds: `judge-demo --seed N` for each N, run as a user runs it, one after another, with
the figures each run writes to its figures.json (Pearson of the judge's expected score with the human overall
score on the test split, before and after training; the best validation Pearson judge-train kept its
checkpoint by; each step's seconds) and the CPU seconds the demo's processes used. Writes DIR/demo_seeds.json
and DIR/demo_seeds.md (the table the README's demo section shows), and exits 1 when a seed ends below
--min_pearson.

    python benchmarks/demo_seeds.py                           # seeds 0-9 into demo_seeds/
    python benchmarks/demo_seeds.py --seeds 2 5 --output_dir /tmp/seeds

Wall-clock times depend on what else the machine runs, so the table gives beside them the CPU seconds (user +
system, of the demo and its steps), which vary far less with load, and the 1-minute load average, as
the system gives it, before and after each seed. The environment is passed on as it is: on a machine
others share, OMP_NUM_THREADS=1 keeps torch's threads from spinning against each other.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from mmjudge.demo.cli import FIGURES, load_average


def children_cpu_seconds() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def run_seed(seed: int, out: Path) -> dict:
    """One demo, as `judge-demo --seed N --output_dir OUT` runs it, and the figures it wrote."""
    shutil.rmtree(out, ignore_errors=True)  # a seed's run starts clean, as from a fresh clone
    command = [str(Path(sys.executable).parent / "judge-demo"), "--seed", str(seed), "--output_dir", str(out)]
    load_before, cpu_before, start = load_average(), children_cpu_seconds(), time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    seconds, cpu_seconds = time.perf_counter() - start, children_cpu_seconds() - cpu_before
    if done.returncode != 0:
        raise SystemExit(f"judge-demo --seed {seed} failed with exit code {done.returncode}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    figures = json.loads((out / FIGURES).read_text())
    return {"seed": seed, "pearson_before": figures["pearson"]["before"]["value"], "pearson_after": figures["pearson"]["after"]["value"],
            "best_validation_pearson": figures["validation_pearson_best"], "training_steps": figures["training_steps"],
            "seconds": round(seconds, 1), "training_seconds": figures["seconds"]["steps"].get("3: train"), "cpu_seconds": round(cpu_seconds, 1),
            "load_before": load_before, "load_after": load_average(), "machine": figures["machine"], "source": figures["source"]}


def _figure(value: float | None) -> str:
    return "undefined" if value is None else f"{value:.3f}"


def markdown(results: list[dict], min_pearson: float) -> str:
    machine = results[0]["machine"]
    threads = os.environ.get("OMP_NUM_THREADS")
    lines = [f"`judge-demo --seed N` (configs/demo.yaml, configs/train/tiny.yaml) on {machine['cpu']}, {machine['cores']} cores"
             f"{f', OMP_NUM_THREADS={threads}' if threads else ''}, at {results[0]['source']['commit'] or results[0]['source']['version']}; "
             "Pearson of the judge's expected score with the human overall score on the 80 test samples.", "",
             "| seed | before | after | best validation | demo (s) | training (s) | CPU (s) | load average before / after |",
             "|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in results:
        lines.append(f"| {r['seed']} | {_figure(r['pearson_before'])} | {_figure(r['pearson_after'])} | {_figure(r['best_validation_pearson'])} "
                     f"| {r['seconds']:.0f} | {r['training_seconds']:.0f} | {r['cpu_seconds']:.0f} | {r['load_before']} / {r['load_after']} |")
    after = [r["pearson_after"] if r["pearson_after"] is not None else float("-inf") for r in results]
    lines += ["", f"After training: lowest {min(after):.3f}, median {statistics.median(after):.3f}; "
                  f"{sum(a >= min_pearson for a in after)} of {len(after)} seeds at {min_pearson} or above. "
                  f"Demo time: median {statistics.median(r['seconds'] for r in results):.0f} s, longest {max(r['seconds'] for r in results):.0f} s; "
                  f"CPU: median {statistics.median(r['cpu_seconds'] for r in results):.0f} s."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=list(range(10)), help="demo seeds (default: 0 to 9)")
    p.add_argument("--output_dir", default="demo_seeds", help="each seed's demo in seed-N/, and the tables (default: demo_seeds)")
    p.add_argument("--min_pearson", type=float, default=0.95, help="the test-split Pearson every seed must reach (default: 0.95)")
    args = p.parse_args(argv)
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for seed in args.seeds:
        results.append(run_seed(seed, out / f"seed-{seed}"))
        r = results[-1]
        print(f"seed {seed}: Pearson {_figure(r['pearson_before'])} -> {_figure(r['pearson_after'])} in {r['seconds']:.0f} s "
              f"(training {r['training_seconds']:.0f} s, CPU {r['cpu_seconds']:.0f} s, load {r['load_before']} -> {r['load_after']})", flush=True)
        # written after each seed: ten demos take a while, and an interrupted run keeps what it measured
        (out / "demo_seeds.json").write_text(json.dumps({"command": "judge-demo --seed N", "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
                                                         "min_pearson": args.min_pearson, "seeds": results}, indent=1) + "\n")
        (out / "demo_seeds.md").write_text(markdown(results, args.min_pearson))
    print(f"\n{markdown(results, args.min_pearson)}\nwritten: {out / 'demo_seeds.json'}, {out / 'demo_seeds.md'}")
    low = [r["seed"] for r in results if r["pearson_after"] is None or r["pearson_after"] < args.min_pearson]
    return 1 if low else 0


if __name__ == "__main__":
    sys.exit(main())
