"""judge-score as a Ray Data job against judge-score alone, on the same samples: records equal, and what Ray costs.

    python benchmarks/ray_batch.py                                   # 1,000 synthetic samples, tiny random judge, CPU
    python benchmarks/ray_batch.py --model_path CKPT --flag=--device=cuda --ray_gpus 1 --actors 8   # a GPU cluster's node

Runs `judge-score` twice as a user runs it, each in its own process: once alone, then with `--ray local
--ray_actors N` (a Ray cluster started on this machine, 127.0.0.1, and stopped at the end). Both score the same
input with the same flags (default: the tiny judge, --mode logits, --max_tiles 1, --rubric tiny). Then the records
are compared, texts and verdicts exact and distributions within --tolerance, and the overhead per sample is the
difference of the two wall times over the samples: on one machine, what Ray's start, its actors' own judge loads
and its moving of rows cost beside the scoring. The figures go to stdout as JSON, with the machine's cores and its
load average before and after (a busy machine's figures are recorded as such).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FAST = ["--mode", "logits", "--max_tiles", "1", "--rubric", "tiny"]


def judge_score(argv: list[str]) -> float:
    """Wall seconds of one judge-score run, which must succeed."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "mmjudge.infer.cli", *argv], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"judge-score {' '.join(argv)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return time.perf_counter() - start


def differences(got, expected, tolerance: float, where: str = "") -> list[str]:
    """Where two records differ: any text, verdict, count or key at all; a float by more than `tolerance`."""
    if isinstance(expected, dict):
        if not isinstance(got, dict) or set(got) != set(expected):
            return [f"{where}: keys {sorted(got) if isinstance(got, dict) else got!r} != {sorted(expected)}"]
        return [d for key in expected for d in differences(got[key], expected[key], tolerance, f"{where}.{key}")]
    if isinstance(expected, list):
        if not isinstance(got, list) or len(got) != len(expected):
            return [f"{where}: {got!r} != {expected!r}"]
        return [d for k, (a, b) in enumerate(zip(got, expected)) for d in differences(a, b, tolerance, f"{where}[{k}]")]
    if isinstance(expected, float) and isinstance(got, float):
        return [] if abs(got - expected) <= tolerance else [f"{where}: {got} != {expected}"]
    return [] if got == expected and type(got) is type(expected) else [f"{where}: {got!r} != {expected!r}"]


def largest_float_gap(got, expected) -> float:
    if isinstance(expected, dict):
        return max((largest_float_gap(got[key], expected[key]) for key in expected), default=0.0)
    if isinstance(expected, list):
        return max((largest_float_gap(a, b) for a, b in zip(got, expected)), default=0.0)
    return abs(got - expected) if isinstance(expected, float) else 0.0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model_path", help="the judge (default: a tiny random judge written here)")
    p.add_argument("--samples", type=int, default=1000, help="synthetic MMIE samples, with images (default: %(default)s)")
    p.add_argument("--actors", type=int, default=2, help="Ray actors, each a copy of the judge (default: %(default)s)")
    p.add_argument("--ray_gpus", type=float, default=0, help="GPUs per actor (default: %(default)s)")
    p.add_argument("--batch_size", type=int, default=50, help="samples an actor takes at a time (default: %(default)s)")
    p.add_argument("--flag", action="append", default=[], help="a judge-score flag for both runs, e.g. --flag=--device=cuda (default: "
                                                              f"{' '.join(FAST)} on the tiny judge)")
    p.add_argument("--tolerance", type=float, default=1e-6, help="largest difference of a distribution's probability (default: %(default)g)")
    args = p.parse_args(argv)

    from mmjudge.judge.testing import write_dataset, write_original_checkpoint

    with tempfile.TemporaryDirectory(prefix="ray-batch-") as tmp:
        tmp = Path(tmp)
        model = args.model_path or str(write_original_checkpoint(tmp / "judge", seed=0))
        data = write_dataset(tmp / "data", args.samples, seed=0)
        flags = [f for flag in args.flag for f in flag.split("=", 1)] or FAST
        common = ["--model_path", model, "--input_dir", str(data.parent), "--input_file", data.name, *flags]
        load_before = os.getloadavg()
        alone = judge_score([*common, "--output_dir", str(tmp / "alone")])
        on_ray = judge_score([*common, "--output_dir", str(tmp / "ray"), "--ray", "local", "--ray_actors", str(args.actors),
                              "--ray_gpus", str(args.ray_gpus), "--ray_batch_size", str(args.batch_size)])
        load_after = os.getloadavg()
        expected = json.loads((tmp / "alone" / "eval_result.json").read_text())
        got = json.loads((tmp / "ray" / "eval_result.json").read_text())
        summaries = [json.loads((tmp / run / "summary.json").read_text()) for run in ("alone", "ray")]
    found = differences(got, expected, args.tolerance, "records") + differences(summaries[1], summaries[0], args.tolerance, "summary")
    figures = {
        "samples": args.samples, "actors": args.actors, "batch_size": args.batch_size, "flags": flags,
        "judge_score_s": round(alone, 2), "judge_score_ray_s": round(on_ray, 2),
        "overhead_per_sample_ms": round(1000 * (on_ray - alone) / args.samples, 2),
        "records_equal": not found, "largest_probability_gap": largest_float_gap(got, expected), "differences": found[:10],
        "cores": len(os.sched_getaffinity(0)), "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in load_after],
    }
    print(json.dumps(figures, indent=2))
    return 0 if not found else 1


if __name__ == "__main__":
    sys.exit(main())
