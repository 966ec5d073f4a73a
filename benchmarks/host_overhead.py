"""The host's share of judge-score's engine, measured on a CPU: everything but the model's own computation.

    python benchmarks/host_overhead.py                                   # 64 and 256 rows, generate and logits mode
    python benchmarks/host_overhead.py --rows 64 --new_tokens 32 --profile phases.txt
    python benchmarks/host_overhead.py --rows 4 --new_tokens 4 --samples 4   # smoke test (the suite runs it)

The engine runs as judge-score runs it (infer/engine.py's Scorer: the scheduler, slots, prefill groups, decoding
loop, follow-up rule, detokenizer and parser, the progress bar, images decoded and tiled in the loader threads) on the scoring
benchmark's MMIE-shaped workload (benchmarks/score_throughput.py: 1-4 images a sample, 500-1200 text tokens), with
one thing replaced: the model. `HostOnly` below, the decoder's runner, is this benchmark's stand-in, never a product path: its forward
passes return tensors of the right shapes at once, each row's next token read off a fixed cycle of distinct
tokens, so that every row writes --new_tokens tokens (the stop token ignored, as the scoring benchmark does). On a
GPU the model's work is queued on the device and overlaps the host's, so what is left here is what each engine
step costs the host before the device can be given the next one.

Reported, in CPU time of the engine's thread (the loader threads' image work is apart, as it overlaps):
- generate mode, with --rows rows decoding at once: host microseconds per decoding step and per prefill call;
- logits mode: host microseconds per sample;
- with --profile, each phase's share (cProfile, a second run: the profiler slows Python, so its shares are read,
  not its times).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import platform
import pstats
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from mmjudge.judge.cpu import use_free_cores

# Before torch loads (judge/cpu.py): the engine's thread takes judge-score's CPU threads.
use_free_cores()

import torch  # noqa: E402

from mmjudge.infer import engine
from mmjudge.infer.engine import Scorer, prepare
from mmjudge.infer.options import ScoreOptions
from mmjudge.infer.runner import Runner
from mmjudge.infer.sampler import Step
from mmjudge.infer.progress import Bar
from mmjudge.judge.data import load_samples
from mmjudge.judge.model import load_judge
from mmjudge.judge.prompts import load_rubrics
from mmjudge.judge.testing import write_original_checkpoint
from score_throughput import write_workload

# The engine's phases, by the functions that hold them (infer/decoding.py and its parts, infer/engine.py), for --profile.
PHASES = {
    "decoding step: set-up (positions, draws, masks, penalties)": ["draws_of", "masks_of", "penalties_of", "step_inputs"],
    "decoding step: outputs to rows (Step.rows)": ["rows"],
    "decoding step: each row's token taken (_accept, on_token)": ["_accept"],
    "prefill: inputs built (ids, places, rotary positions)": ["prefill"],
    "prefill: grouping and admission": ["group", "_admit"],
    "results: detokenized and parsed": ["_generate_result", "_logits_result"],
}


@dataclass
class HostTimes:
    """CPU time of the engine's thread in the decoder's two kinds of call (their counts are the decoder's own)."""

    step_ns: int = 0
    prefill_ns: int = 0


def timed(method, times: HostTimes, total: str):
    """A bound `method` of the decoder or its runner, its CPU time in the engine's thread added to `times`' field `total`."""
    def run(*args):
        start = time.thread_time_ns()
        try:
            return method(*args)
        finally:
            setattr(times, total, getattr(times, total) + time.thread_time_ns() - start)
    return run


class HostOnly(Runner):
    """The benchmark's stand-in for the model (module docstring): the runner's own code around it and the decoder's run unchanged.
    A prompt's first token is the cycle's first, each later one its input's successor on the cycle."""

    cycle: torch.Tensor  # distinct token ids
    successor: torch.Tensor  # (vocabulary,) each token's next on the cycle (the first for any other)
    zeros: dict  # rows -> the recorded columns, log-probabilities and their ids, all zeros

    def embed(self, input_ids, pixels):
        return torch.zeros(*input_ids.shape, 1, dtype=self.dtype), None

    def layers(self, hidden, *args, **kwargs):
        return hidden

    def _outputs(self, chosen: torch.Tensor) -> Step:
        """A forward pass's outputs for `chosen` tokens: zeros of the right shapes, made once per row count (the
        stand-in's own allocations are not the engine's)."""
        rows = chosen.shape[0]
        if rows not in self.zeros:
            self.zeros[rows] = (torch.zeros(rows, len(self.sampler.columns)), torch.zeros(rows, 0), torch.zeros(rows, 0, dtype=torch.long))
        return Step(chosen, *self.zeros[rows])

    def head(self, hidden, logprobs, draws, masks, penalties=None) -> Step:
        return self._outputs(self.cycle[:1].expand(hidden.shape[0]))

    def step(self, cache, tokens, draws, masks, penalties, logprobs) -> Step:
        return self._outputs(self.successor[tokens])


def host_only(scorer: Scorer, new_tokens: int) -> HostTimes:
    """Give the scorer's decoder the stand-in model (a cycle of `new_tokens` distinct ordinary tokens) and time its
    decoding steps and prefills."""
    decoder, runner = scorer.decoder, scorer.decoder.runner
    special = set(scorer.judge.tokenizer.all_special_ids) | set(decoder.stop_ids) | set(decoder.sampler.suppress.tolist())
    ordinary = [t for t in range(runner.vocab_size) if t not in special][: max(2, new_tokens)]
    runner.__class__ = HostOnly
    runner.cycle = torch.tensor(ordinary)
    runner.successor = torch.full((runner.vocab_size,), ordinary[0])
    runner.successor[runner.cycle] = torch.roll(runner.cycle, -1)
    runner.zeros = {}
    times = HostTimes()
    decoder._decode = timed(decoder._decode, times, "step_ns")
    runner.prefill = timed(runner.prefill, times, "prefill_ns")
    return times


def loaded_once(load_pixels):
    """The engine's image loader, each sample's images loaded once for all runs: the loader threads' work is not the
    engine thread's, and decoding every image again made each run of 64 samples take 20 s on 2 cores."""
    loaded = {}

    def load(item, *args):
        key = (id(item), *args)
        if key not in loaded:
            loaded[key] = load_pixels(item, *args)
        return loaded[key]
    return load


def measure(judge, rubrics, items, options: ScoreOptions, profile: cProfile.Profile | None = None) -> dict:
    """One run of the engine over `items` with the stand-in model: the engine thread's CPU time, in all and in the
    decoder's steps and prefills."""
    scorer = Scorer(judge, rubrics, options, "cpu")
    times = host_only(scorer, options.max_new_tokens)
    if profile is not None:
        profile.enable()
    start = time.thread_time_ns()
    with Bar(f"{options.mode}", len({item.index for item in items})) as bar:  # judge-score's progress bar, told of every token
        results = [r for batch in scorer.judged(items, progress=bar.update) for _, r in batch]
    total = time.thread_time_ns() - start
    if profile is not None:
        profile.disable()
    scorer.loaders.shutdown()
    assert len(results) == len(items), "every sample must be judged"
    runner = scorer.decoder.runner
    return {"samples": len(items), "steps": runner.steps, "prefills": runner.prefills, "host_ms": total / 1e6,
            "step_us": times.step_ns / 1e3 / max(1, runner.steps), "prefill_us": times.prefill_ns / 1e3 / max(1, runner.prefills),
            "per_sample_us": total / 1e3 / len(items)}


def phase_shares(profile: cProfile.Profile) -> dict[str, float]:
    """Each phase's time (PHASES: its functions' cumulative time, what they call included, so that phases may nest),
    as a share of the engine thread's profiled CPU time."""
    stats = pstats.Stats(profile).stats
    total = sum(entry[2] for entry in stats.values())  # every function's own time
    by_name: dict[str, float] = {}
    for (filename, _, name), (_, _, own, cumulative, _) in stats.items():
        if "mmjudge" in filename or "/infer/" in filename:
            by_name[name] = by_name.get(name, 0.0) + cumulative
    shares = {phase: sum(by_name.get(name, 0.0) for name in names) / total for phase, names in PHASES.items()}
    shares["decoding steps in all (_decode)"] = by_name.get("_decode", 0.0) / total
    return shares


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, action="append", help="rows decoding at once (repeatable; default: 64 and 256)")
    p.add_argument("--samples", type=int, help="samples per run (default: as many as rows)")
    p.add_argument("--new_tokens", type=int, default=256, help="tokens each row writes (default: 256)")
    p.add_argument("--max_tiles", type=int, default=12, help="tiles per image, as MMIE-Eval uses (default: 12)")
    p.add_argument("--profile", help="also profile each run and write the phases' shares and the top functions here")
    p.add_argument("--repeat", type=int, default=3, help="timed runs of each mode, the least time reported (default: 3)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="also write the figures to this file")
    args = p.parse_args()

    figures = {"machine": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads",
               "load_average_before": list(round(x, 2) for x in os.getloadavg()), "runs": []}
    report = []
    engine._load_pixels = loaded_once(engine._load_pixels)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        judge = load_judge(write_original_checkpoint(tmp / "tiny"), "cpu")
        rubrics = load_rubrics()
        for rows in args.rows or [64, 256]:
            samples_n = args.samples or rows
            data = write_workload(tmp / f"data{rows}", samples_n, args.seed, judge.tokenizer)
            samples = list(enumerate(load_samples(data / "data.json", data)))
            generate = ScoreOptions(max_new_tokens=args.new_tokens, ignore_stop=True, max_tiles=args.max_tiles)
            items = prepare(judge, samples, rubrics, data, generate)
            # room for every row at once: each slot holds the longest prompt and its answer
            budget = rows * (max(len(item.input_ids) for item in items) + args.new_tokens + 64)
            generate = ScoreOptions(max_new_tokens=args.new_tokens, ignore_stop=True, max_tiles=args.max_tiles, token_budget=budget)
            logits = ScoreOptions(mode="logits", max_tiles=args.max_tiles)
            logit_items = prepare(judge, samples, rubrics, data, logits)
            for mode, options, mode_items in (("generate", generate, items), ("logits", logits, logit_items)):
                measure(judge, rubrics, mode_items, options)  # warm-up, which also loads every sample's images once
                repeats = [measure(judge, rubrics, mode_items, options) for _ in range(args.repeat)]
                # the least of each figure: on a busy machine the other work only ever adds to the engine thread's time
                run = {"mode": mode, "rows": rows, **{key: min(r[key] for r in repeats) for key in repeats[0]}}
                if args.profile:
                    profile = cProfile.Profile(time.thread_time)  # CPU time: a wait on the loader threads is not the host's work
                    measure(judge, rubrics, mode_items, options, profile)
                    run["phase_shares"] = phase_shares(profile)
                    out = io.StringIO()
                    pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(25)
                    report.append(f"== {mode}, {rows} rows ==\n" + "\n".join(f"{v:6.1%}  {k}" for k, v in run["phase_shares"].items()) + "\n" + out.getvalue())
                figures["runs"].append(run)
                print(json.dumps(run), flush=True)
    figures["load_average_after"] = list(round(x, 2) for x in os.getloadavg())
    if args.profile:
        Path(args.profile).write_text("\n".join(report))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
