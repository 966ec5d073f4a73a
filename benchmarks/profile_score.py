"""Where judge-score's engine spends its time: torch.profiler over the engine on the scoring benchmark's
workload (full-size InternVL2-4B architecture, random weights), one run per mode.

    python benchmarks/profile_score.py --samples 8 --new_tokens 32 --out profile.txt
    python benchmarks/profile_score.py --tiny --samples 4 --new_tokens 4 --max_tiles 1 --device cpu   # smoke test

Prints, per mode, the wall time and the operators that took the most device time (self time, so that a
kernel is counted once), and writes the full tables to --out.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from mmjudge.judge.cpu import use_free_cores

# Before torch loads: the engine computes in this process, so on a CPU it takes judge-score's threads (judge/cpu.py),
# not torch's own choice, which beside other work on a small machine spins on cores that are not free.
use_free_cores()

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile

from mmjudge.infer.options import ScoreOptions
from mmjudge.judge.data import load_samples
from mmjudge.judge.kernels import use_fused_kernels
from mmjudge.judge.model import load_judge
from mmjudge.judge.prompts import load_rubrics
from mmjudge.judge.testing import write_original_checkpoint
from score_throughput import engine_run, full_size_judge, prepare, warm_up_share, write_workload


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="a tiny random judge (CPU smoke test)")
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--new_tokens", type=int, default=32)
    p.add_argument("--max_tiles", type=int, default=12)
    p.add_argument("--token_budget", type=int, help="the engine's KV-cache tokens (default: judge-score's: what free GPU memory holds)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--rows", type=int, default=25, help="operators printed per mode")
    p.add_argument("--out", help="write the full tables here")
    args = p.parse_args()

    on_gpu = args.device.startswith("cuda")
    sort_key = "self_cuda_time_total" if on_gpu else "self_cpu_time_total"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    report = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if args.tiny:
            judge = load_judge(write_original_checkpoint(tmp / "tiny"), args.device)
        else:
            judge = full_size_judge(args.device, tmp / "tok")
            use_fused_kernels(judge.model, args.device)  # as load_judge does on a GPU
        data = write_workload(tmp / "data", args.samples, 0, judge.tokenizer)
        samples = list(enumerate(load_samples(data / "data.json", data)))
        rubrics = load_rubrics()
        for options in (ScoreOptions(max_new_tokens=args.new_tokens, token_budget=args.token_budget, ignore_stop=True, max_tiles=args.max_tiles),
                        ScoreOptions(mode="logits", token_budget=args.token_budget, max_tiles=args.max_tiles)):
            items = prepare(judge, samples, rubrics, data, options)
            engine_run(judge, rubrics, warm_up_share(items), options, args.device)
            with profile(activities=activities) as prof:
                start = time.perf_counter()
                engine_run(judge, rubrics, items, options, args.device)
                seconds = time.perf_counter() - start
            table = prof.key_averages().table(sort_by=sort_key, row_limit=args.rows, max_name_column_width=60)
            head = f"== {options.mode}: {len(items)} samples, {seconds:.2f} s wall (profiled)"
            print(head, table, sep="\n")
            report.append(head + "\n" + prof.key_averages().table(sort_by=sort_key, row_limit=200, max_name_column_width=90))
    if args.out:
        Path(args.out).write_text("\n\n".join(report))


if __name__ == "__main__":
    main()
