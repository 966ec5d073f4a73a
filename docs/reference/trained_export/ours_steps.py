"""Ours side, step by step: judge-score's prompts (ids, tiles) for each sample, decoded alone by its Decoder,
with each step's top-8 log-probabilities. usage: ours_steps.py CHECKPOINT DATA_DIR RUBRIC N OUT.pt"""
import sys
from concurrent.futures import Future
from pathlib import Path
import torch
from mmjudge.infer.scheduler import Request
from mmjudge.infer.engine import _load_pixels, judge_decoder, prepare
from mmjudge.infer.options import ScoreOptions
from mmjudge.judge.data import validate_samples
from mmjudge.judge.model import load_judge
from mmjudge.judge.prompts import load_rubrics

ckpt, data_dir, rubric, n, out = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4]), Path(sys.argv[5])
judge = load_judge(ckpt, dtype=torch.float32)
samples, problems, _ = validate_samples(data_dir / "data.json", data_dir)
assert not problems, problems
items = prepare(judge, enumerate(samples), load_rubrics([rubric]), data_dir, ScoreOptions(max_tiles=12, max_new_tokens=n))
decoder = judge_decoder(judge, "cpu", None, [0])
results = []
for item in items:
    pixels = _load_pixels(item, torch.float32, pin=False)
    ready = Future()
    ready.set_result(pixels)
    ids = item.input_ids.long()
    request = Request(0, ids, ready)
    [completion] = [c for batch in decoder.generate([request], lambda r: r.pixels, n, top_logprobs=8) for c in batch]
    results.append({"id": item.sample.id, "input_ids": ids, "pixels": pixels, "tokens": completion.tokens,
                    "top_logprobs": completion.top_logprobs, "top_ids": completion.top_ids})
    print(item.sample.id, len(item.input_ids), completion.tokens[:8], flush=True)
torch.save(results, out)
