"""judge-serve's rewards at RL batch sizes: many one-sample /get_reward requests from concurrent clients (an
RL framework's per-sample reward calls) against the same samples in one request, samples/s side by side.

    python benchmarks/reward_load.py                                   # 1,024 samples, 64 clients, the tiny judge, CPU
    python benchmarks/reward_load.py --samples 64 --clients 8 --json figures.json
    python benchmarks/reward_load.py --prefix_cache default --prefix_cache 16384 --prefix_cache 0
    python benchmarks/reward_load.py --model_path CKPT --device cuda
    python benchmarks/reward_load.py --groups 32 --json groups.json        # GRPO groups, with and without the prefix cache

Starts judge-serve on a free 127.0.0.1 port with --reward score:SA --mode logits (a reward is one prefill) and
--max_samples as large as --samples, once for each --prefix_cache, back to back (by default none given, the reward
endpoints' own size, then 0: off; each run records the tokens its cache could hold, from /metrics). Each sample is
a synthetic question (its text and first image, a path under --image_root; the questions of the dataset's 32
samples in turn) and answer, sent as OpenRLHF sends one: {"query": [prompt + response], "prompts", "images"}. First
all the samples in one request (the batch), then each sample in a request of its own from --clients concurrent
senders in one asyncio loop (as OpenRLHF and verl send per-sample rewards), each sending its next as soon as its
last is answered. Both are timed from the first byte sent to the last answer;
latency percentiles are of the one-sample requests. The rewards of every run are compared: each sample's must be
the same (to 1e-6: on a CPU prefill groups are not batch-invariant to the bit, and a cached prompt's two pieces
not a whole prefill's; judge-serve --deterministic is, on a GPU). The prefill passes and prompt tokens prefilled
of each run come from /metrics. --json's record renders as docs/rewards.md's table (markdown; a --groups record's,
groups_markdown).

With --groups G: GRPO's groups instead, G questions (each its text and first image) with --group_size answers
each (the answers of other samples), each group one /get_reward request (a group's completions, as TRL's reward
call passes them) from --clients concurrent senders as above: once against a server with its prefix cache (the
default: a group's shared rubric, question and image prefilled once), then against one started with --prefix_cache 0,
back to back.
Samples/s and the prompt tokens prefilled (from /metrics) side by side; the rewards of the two runs are compared
(the cached prompts are prefilled in two pieces, the others whole: equal to float32 rounding, not to the bit).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

import httpx2
from serve_load import forward_passes, metric_values, percentile, served


def bodies_of(data_dir: Path, n: int) -> list[dict]:
    """n one-sample /get_reward bodies, cycling over the dataset's samples with a number in each response so
    that no two are the same."""
    samples = json.loads((data_dir / "data.json").read_text())
    bodies = []
    for k in range(n):
        sample = samples[k % len(samples)]
        prompt = " ".join(s["text"] for s in sample["question"] if s.get("text"))
        answer = sample["answer"] if isinstance(sample["answer"], str) else " ".join(s["text"] for s in sample["answer"] if s.get("text"))
        image = next((s["image"] for s in sample["question"] + (sample["answer"] if isinstance(sample["answer"], list) else []) if s.get("image")), None)
        bodies.append({"query": [f"{prompt}{answer} ({k})"], "prompts": [prompt], "images": [[image] if image else []]})
    return bodies


def batched(base: str, bodies: list[dict], timeout_s: float) -> dict:
    whole = {key: [value for body in bodies for value in body[key]] for key in ("query", "prompts", "images")}
    before = forward_passes(base)
    start = time.perf_counter()
    answer = httpx2.post(f"{base}/get_reward", json=whole, timeout=timeout_s)
    seconds = time.perf_counter() - start
    answer.raise_for_status()
    after = forward_passes(base)
    return {"samples": len(bodies), "seconds": seconds, "samples_per_s": len(bodies) / seconds, "rewards": answer.json()["rewards"],
            "prefills": after[0] - before[0], "prefill_tokens": after[2] - before[2]}


def one_by_one(base: str, bodies: list[dict], clients: int, timeout_s: float) -> dict:
    """Each body in a request of its own from `clients` concurrent senders (sent)."""
    before = forward_passes(base)
    answers, latencies, seconds = sent(base, bodies, clients, timeout_s)
    after = forward_passes(base)
    failed = sum(answer is None for answer in answers)
    return {"samples": len(bodies), "clients": clients, "seconds": seconds, "samples_per_s": (len(bodies) - failed) / seconds,
            "failed": failed, "p50_s": percentile(latencies, 0.5), "p99_s": percentile(latencies, 0.99),
            "rewards": [answer and answer["rewards"][0] for answer in answers],
            "prefills": after[0] - before[0], "prefill_tokens": after[2] - before[2]}


def sent(base: str, bodies: list[dict], clients: int, timeout_s: float) -> tuple[list[dict | None], list[float], float]:
    """Each body a /get_reward request from `clients` concurrent senders in one asyncio loop, each sending its next as
    soon as its last is answered: as RL frameworks send rewards (OpenRLHF from aiohttp tasks, verl's reward loop awaiting
    async reward functions, mmjudge.rewards' adapters from httpx2.AsyncClient), not from a thread each, which on a small
    machine spends more CPU beside the server than the server's own requests do. Each body's answer (None: not a 200),
    the requests' latencies, and the seconds from the first byte sent to the last answer."""
    return asyncio.run(_sent(base, bodies, clients, timeout_s))


async def _sent(base: str, bodies: list[dict], clients: int, timeout_s: float) -> tuple[list[dict | None], list[float], float]:
    answers, latencies = [None] * len(bodies), []
    next_index = iter(range(len(bodies)))

    async def client(http: httpx2.AsyncClient) -> None:
        for k in next_index:  # shared: each sender takes the next body not yet taken
            start = time.perf_counter()
            answer = await http.post(f"{base}/get_reward", json=bodies[k])
            latencies.append(time.perf_counter() - start)
            if answer.status_code == 200:
                answers[k] = answer.json()

    start = time.perf_counter()
    async with httpx2.AsyncClient(timeout=timeout_s, limits=httpx2.Limits(max_connections=clients)) as http:
        await asyncio.gather(*(client(http) for _ in range(clients)))
    return answers, latencies, time.perf_counter() - start


def groups_of(data_dir: Path, groups: int, size: int, opening: str = "") -> list[dict]:
    """One /get_reward body per group: a sample's question (text and first image; its text after `opening`) and
    `size` answers, those of the samples after it."""
    samples = json.loads((data_dir / "data.json").read_text())
    text = lambda segments: segments if isinstance(segments, str) else " ".join(s["text"] for s in segments if s.get("text"))  # noqa: E731
    bodies = []
    for g in range(groups):
        question = samples[g % len(samples)]["question"]
        prompt = opening + text(question)
        image = next((s["image"] for s in question if s.get("image")), None)
        answers = [f"{text(samples[(g + 1 + k) % len(samples)]['answer'])} ({g}.{k})" for k in range(size)]
        bodies.append({"query": [prompt + answer for answer in answers], "prompts": [prompt] * size, "images": [[image] if image else []] * size})
    return bodies


def grouped(base: str, bodies: list[dict], clients: int, timeout_s: float) -> dict:
    """Each group's request from `clients` concurrent senders (sent)."""
    before = forward_passes(base)
    answers, _, seconds = sent(base, bodies, clients, timeout_s)
    after = forward_passes(base)
    if failed := [k for k, answer in enumerate(answers) if answer is None]:
        raise SystemExit(f"groups {failed} were not answered with 200")
    samples = sum(len(body["query"]) for body in bodies)
    return {"groups": len(bodies), "samples": samples, "clients": clients, "seconds": seconds, "samples_per_s": samples / seconds,
            "prefills": after[0] - before[0], "prefill_tokens": after[2] - before[2], "prefix_cache": prefix_cache_of(base),
            "rewards": [r for answer in answers for r in answer["rewards"]]}


def prefix_cache_of(base: str) -> int:
    """The tokens the server's prefix cache may hold (0: none), as its /metrics says."""
    return metric_values(base, ("judge_prefix_cache_limit_tokens",))[0]


def compare_groups(args) -> None:
    """--groups: the same groups with the prefix cache and without it, back to back."""
    runs = {}
    for name, flags in (("prefix_cache", []), ("no_prefix_cache", ["--prefix_cache", "0"])):
        with served(args.model_path, ["--device", args.device, "--reward", "score:SA", "--mode", "logits", "--max_tiles", "1",
                                      "--max_samples", str(args.group_size), *flags, *args.serve_flag], image_root=True) as (base, data_dir):
            bodies = groups_of(data_dir, args.groups, args.group_size)
            grouped(base, groups_of(data_dir, 1, args.group_size, "Warm-up. "), 1, args.timeout_s)  # untimed, a question of no group
            runs[name] = grouped(base, bodies, args.clients, args.timeout_s)
    cached, whole = runs["prefix_cache"], runs["no_prefix_cache"]
    largest = max(abs(a - b) for a, b in zip(cached["rewards"], whole["rewards"]))
    for name, run in runs.items():
        print(f"{name} ({run['prefix_cache']:,} tokens): {run['groups']} groups of {args.group_size} from {run['clients']} clients: {run['samples_per_s']:.2f} samples/s "
              f"({run['seconds']:.1f} s), {run['prefill_tokens']:,} prompt tokens prefilled in {run['prefills']} prefills")
    print(f"with / without: samples/s {cached['samples_per_s'] / whole['samples_per_s']:.2f}, prefill tokens "
          f"{cached['prefill_tokens'] / whole['prefill_tokens']:.2f}; largest reward difference {largest:.2e}")
    if args.json:
        Path(args.json).write_text(json.dumps({"device": args.device, "serve_flags": args.serve_flag, "group_size": args.group_size,
                                               "samples_per_s_ratio": cached["samples_per_s"] / whole["samples_per_s"],
                                               "prefill_tokens_ratio": cached["prefill_tokens"] / whole["prefill_tokens"],
                                               "largest_reward_difference": largest,
                                               **{name: {k: v for k, v in run.items() if k != "rewards"} for name, run in runs.items()}}, indent=2))


def measured(args, prefix_cache: int | None) -> dict:
    """One server of this --prefix_cache (None: not given, the reward endpoints' default): the samples in one request,
    then one by one from the clients."""
    cache = [] if prefix_cache is None else ["--prefix_cache", str(prefix_cache)]
    with served(args.model_path, ["--device", args.device, "--reward", "score:SA", "--mode", "logits", "--max_tiles", "1",
                                  "--max_samples", str(max(args.samples, 1)), *cache, *args.serve_flag], image_root=True) as (base, data_dir):
        bodies = bodies_of(data_dir, args.samples)
        batched(base, bodies[:2], args.timeout_s)  # warm-up, untimed
        batch = batched(base, bodies, args.timeout_s)
        single = one_by_one(base, bodies, args.clients, args.timeout_s)
        tokens = prefix_cache_of(base)
    differ = sum(s is None or abs(s - b) > 1e-6 for s, b in zip(single["rewards"], batch["rewards"]))
    return {"prefix_cache": prefix_cache, "prefix_cache_tokens": tokens, "ratio": single["samples_per_s"] / batch["samples_per_s"],
            "rewards_differing": differ, "batch": batch, "one_by_one": single}


def cache_size(value: str) -> int | None:
    """--prefix_cache's value: tokens, or `default` (not given to judge-serve)."""
    return None if value == "default" else int(value)


def markdown(record: dict) -> str:
    """The table of a run's record (--json), as docs/rewards.md shows it."""
    lines = ["| `--prefix_cache` | run | samples/s | seconds | prefill passes | prompt tokens prefilled | latency p50 / p99 | one-sample / one request |",
             "|---:|---|---:|---:|---:|---:|---:|---:|"]
    for run in record["runs"]:
        batch, single = run["batch"], run["one_by_one"]
        cache = ("0 (off)" if run["prefix_cache"] == 0 else f"{run['prefix_cache']:,}" if run["prefix_cache"]
                 else f"not given: {run['prefix_cache_tokens']:,}")
        lines += [f"| {cache} | one request of {batch['samples']:,} samples | {batch['samples_per_s']:.2f} | {batch['seconds']:.1f} | "
                  f"{batch['prefills']:,} | {batch['prefill_tokens']:,} | - | |",
                  f"| {cache} | {single['samples']:,} one-sample requests from {single['clients']} clients | {single['samples_per_s']:.2f} | "
                  f"{single['seconds']:.1f} | {single['prefills']:,} | {single['prefill_tokens']:,} | {single['p50_s']:.2f} s / {single['p99_s']:.2f} s | "
                  f"{run['ratio']:.2f} |"]
    return "\n".join(lines) + "\n"


def groups_markdown(record: dict) -> str:
    """The table of a --groups run's record (--json), as docs/rewards.md shows it."""
    lines = ["| run | samples/s | seconds | prompt tokens prefilled | prefill passes |", "|---|---:|---:|---:|---:|"]
    for name, label in (("prefix_cache", "prefix cache ({:,} tokens, the default)"), ("no_prefix_cache", "no prefix cache (`--prefix_cache 0`)")):
        run = record[name]
        lines.append(f"| {label.format(run['prefix_cache'])} | {run['samples_per_s']:.2f} | {run['seconds']:.1f} | {run['prefill_tokens']:,} | {run['prefills']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model_path", help="the judge to serve (default: a tiny random one, written to a temporary directory)")
    p.add_argument("--device", default="cpu", help="judge-serve's --device (default: cpu)")
    p.add_argument("--samples", type=int, default=1024, help="samples rewarded each way (default: 1024)")
    p.add_argument("--clients", type=int, default=64, help="concurrent clients of the one-sample requests (default: 64)")
    p.add_argument("--prefix_cache", type=cache_size, action="append",
                   help="judge-serve's --prefix_cache of each run in tokens, or default (not given), back to back (repeatable; "
                        "default: default, then 0)")
    p.add_argument("--timeout_s", type=float, default=3600, help="the longest a request may take (default: 3600)")
    p.add_argument("--serve_flag", action="append", default=[], help="a flag for judge-serve, as --serve_flag=--name=value (repeatable)")
    p.add_argument("--groups", type=int, help="GRPO groups instead, with and without the prefix cache (module docstring) (default: none)")
    p.add_argument("--group_size", type=int, default=8, help="answers per group with --groups (default: 8)")
    p.add_argument("--json", help="also write the figures to this file")
    args = p.parse_args()
    if args.groups:
        compare_groups(args)
        return

    runs = [measured(args, size) for size in args.prefix_cache or [None, 0]]
    rewards = [run[way]["rewards"] for run in runs for way in ("batch", "one_by_one")]
    differ = sum(any(r is None or abs(r - first) > 1e-6 for r in others) for first, *others in zip(*rewards))
    for run in runs:
        batch, single = run["batch"], run["one_by_one"]
        name = f"--prefix_cache {'default' if run['prefix_cache'] is None else run['prefix_cache']} ({run['prefix_cache_tokens']:,} tokens)"
        print(f"{name}: one request of {batch['samples']} samples: {batch['samples_per_s']:.2f} samples/s "
              f"({batch['seconds']:.1f} s, {batch['prefills']} prefill passes, {batch['prefill_tokens']:,} prompt tokens prefilled)")
        print(f"{name}: {single['samples']} one-sample requests from {single['clients']} clients: "
              f"{single['samples_per_s']:.2f} samples/s ({single['seconds']:.1f} s, {single['prefills']} prefill passes, "
              f"{single['prefill_tokens']:,} prompt tokens prefilled), p50 {single['p50_s']:.3f} s, p99 {single['p99_s']:.3f} s, "
              f"{single['failed']} failed; ratio {run['ratio']:.2f}")
    print(f"samples whose reward differs between any two of the runs: {differ}")
    if args.json:
        Path(args.json).write_text(json.dumps({"device": args.device, "serve_flags": args.serve_flag, "rewards_differing": differ,
                                               "runs": [{**run, **{way: {k: v for k, v in run[way].items() if k != "rewards"}
                                                                    for way in ("batch", "one_by_one")}} for run in runs]}, indent=2))


if __name__ == "__main__":
    main()
