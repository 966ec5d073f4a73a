"""Tokens per answer under a JSON schema, compact (judge-serve's default) against whitespace allowed
(`disable_any_whitespace: false`), written by the tiny random judge through infer/decoding.py directly.

    python benchmarks/structured_tokens.py [--seeds 8] [--max_tokens 120]

Each of four chat prompts is answered greedily and at temperature 1 with --seeds seeds, under a three-field
verdict schema; prints each setting's mean and median answer length in tokens and how many answers stopped.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from concurrent.futures import Future
from pathlib import Path

from mmjudge.infer import grammar
from mmjudge.infer.sampler import Sampling
from mmjudge.infer.scheduler import Request
from mmjudge.infer.engine import judge_decoder, judge_vocabulary
from mmjudge.judge.model import load_judge
from mmjudge.judge.testing import write_original_checkpoint

QUESTIONS = ["Is this answer good?", "Rate the answer to the question about the picture, and say why in a few words.", "Score it.",
             "The answer names the wrong color of the car; how many points does it lose, and what would a careful judge write?"]
VERDICT = {"type": "object", "properties": {"better": {"enum": ["A", "B", "tie"]}, "score": {"type": "integer", "minimum": 0, "maximum": 6},
                                            "sure": {"type": "boolean"}}, "required": ["better", "score", "sure"], "additionalProperties": False}


def no_images(request: Request) -> Future:
    future = Future()
    future.set_result(None)
    return future


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--max_tokens", type=int, default=120)
    args = parser.parse_args()
    judge = load_judge(write_original_checkpoint(Path(tempfile.mkdtemp()) / "ckpt", seed=0))
    vocabulary = judge_vocabulary(judge)
    prompts = [judge.tokenizer(judge.settings.template.render(q), return_tensors="pt").input_ids[0] for q in QUESTIONS]
    for name, whitespace in (("compact", grammar.COMPACT), ("whitespace allowed", None)):
        rules = grammar.json_schema(vocabulary, VERDICT, whitespace)
        settings = [Sampling()] + [Sampling(temperature=1.0, seed=seed) for seed in range(args.seeds)]
        requests = [Request(k, prompt, sampling=sampling, grammar=rules) for k, (prompt, sampling) in
                    enumerate((p, s) for p in prompts for s in settings)]
        decoder = judge_decoder(judge, "cpu", None, columns=[])
        done = [c for batch in decoder.generate(requests, no_images, args.max_tokens) for c in batch]
        lengths = [len(c.tokens) for c in done]
        print(f"{name}: {len(done)} answers, {statistics.mean(lengths):.1f} tokens per answer (median {statistics.median(lengths)}), "
              f"{sum(c.finish_reason == 'stop' for c in done)} stopped")


if __name__ == "__main__":
    main()
