"""mmjudge's side of a backbone exactness check: each sample's prompt (the text a chat API takes, the token ids,
the pixels), and what judge-score's engine writes for it at its default batching and at --token_budget 1 (one
sample at a time): the tokens, every step's logits over the whole vocabulary, and the answer's text.
usage: ours.py CHECKPOINT DATA_DIR MAX_TILES NEW_TOKENS OUT.pt"""
import sys
from concurrent.futures import Future
from pathlib import Path

import torch

from mmjudge.infer.scheduler import Request
from mmjudge.infer.engine import _load_pixels, judge_decoder, prepare
from mmjudge.infer.options import ScoreOptions
from mmjudge.judge.data import load_samples
from mmjudge.judge.model import load_judge, with_max_tiles
from mmjudge.judge.prompts import build_prompt, load_rubrics

checkpoint, data, max_tiles, new_tokens, out = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
torch.set_num_threads(1)
judge = load_judge(checkpoint)
rubrics = load_rubrics()
samples = load_samples(data / "data.json", data)
items = prepare(judge, list(enumerate(samples)), rubrics, data, ScoreOptions(max_tiles=max_tiles))
settings = with_max_tiles(judge.settings, max_tiles)
pixels = [_load_pixels(item, torch.float32, pin=False) for item in items]
vocabulary = judge.model.config.get_text_config().vocab_size
runs = {}
for budget in (None, 1):
    decoder = judge_decoder(judge, "cpu", budget, columns=list(range(vocabulary)))

    def load(request, pixels=pixels):
        future = Future()
        future.set_result(pixels[request.index])
        return future

    requests = sorted((Request(i, item.input_ids.long()) for i, item in enumerate(items)), key=lambda r: -len(r.input_ids))
    runs[budget] = {c.index: c for done in decoder.generate(requests, load, new_tokens) for c in done}
records = []
for i, (item, sample) in enumerate(zip(items, samples)):
    prompt = build_prompt(sample, rubrics[sample.category], settings.template, settings.system_message, data, settings.images)
    record = {"id": sample.id, "query": prompt.query, "system": settings.system, "images": [str(image.path) for image in prompt.images],
              "tiles": [image.n_tiles for image in prompt.images], "input_ids": item.input_ids.long(),
              "pixels": None if pixels[i] is None else pixels[i].values, "grids": None if pixels[i] is None else pixels[i].grids}
    for name, budget in (("batched", None), ("alone", 1)):
        completion = runs[budget][i]
        record[name] = {"tokens": completion.tokens, "logits": completion.logits, "text": judge.answer(completion.tokens)}
    records.append(record)
torch.save({"stop_ids": judge.stop_ids, "unwritable": sorted(set(range(vocabulary)) - set(range(len(judge.tokenizer))))
            + judge.tokenizer.convert_tokens_to_ids(list(settings.images.image_tokens)), "records": records}, out)
print(f"{len(records)} samples, prompts of {min(len(r['input_ids']) for r in records)}-{max(len(r['input_ids']) for r in records)} tokens, "
      f"{sum(len(r['images']) for r in records)} images: {out}")
