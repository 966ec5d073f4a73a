"""Prompt lengths of a data dir as judge-score builds them. usage: prompt_lengths.py CHECKPOINT DATA_DIR RUBRIC -> {id: tokens}"""
import json, sys
from pathlib import Path
import torch
from mmjudge.infer.engine import prepare
from mmjudge.infer.options import ScoreOptions
from mmjudge.judge.data import validate_samples
from mmjudge.judge.model import load_judge
from mmjudge.judge.prompts import load_rubrics
judge = load_judge(sys.argv[1], dtype=torch.float32)
samples, problems, _ = validate_samples(Path(sys.argv[2]) / "data.json", Path(sys.argv[2]))
items = prepare(judge, enumerate(samples), load_rubrics([Path(sys.argv[3])]), Path(sys.argv[2]), ScoreOptions(max_tiles=12))
print(json.dumps({i.sample.id: len(i.input_ids) for i in items}))
