"""Reference fixture, step 1 (mmjudge's venv): judge-score's prompts for the tiny test tokenizer, with the
spans where the template and the images put special tokens, and the tokenizer's files.

    .venv/bin/python docs/reference/encode_prompts.py /tmp/encode
    <transformers 4.37.2 venv>/bin/python docs/reference/encode_437.py /tmp/encode tests/judge/reference/encode_transformers_4.37.json

Prompts: the synthetic dataset's samples (0-2 question and 0-3 answer images, tiled as judge-score tiles
them) under this toolkit's MMIE rubrics and the tiny judge's, with the template's default system message,
another one, and an empty one; and a chat turn as judge-serve renders it. None holds a special token in
its text: those are read as text here on purpose, unlike the reference (judge/prompts.py, encode_prompt)."""
import json
import sys
from pathlib import Path

from mmjudge.configs import CONFIG_DIR, DEFAULT_RUBRICS
from mmjudge.judge.data import validate_samples
from mmjudge.judge.prompts import build_prompt, load_rubrics, render_query
from mmjudge.judge.templates import TEMPLATES
from mmjudge.judge.testing import write_dataset, write_tokenizer
from mmjudge.judge.testing.checkpoints import SIZES
from mmjudge.judge.tiling import TilingConfig
from mmjudge.judge.vision import placeholder

out = Path(sys.argv[1])
write_tokenizer(out / "tokenizer")
samples, problems, _ = validate_samples(write_dataset(out / "data", 9, seed=3), out / "data")
assert not problems, problems
template = TEMPLATES["phi3-chat"]
tiling = TilingConfig(image_size=SIZES.image_size, max_tiles=2, tokens_per_tile=SIZES.tokens_per_tile)
prompts = []
for rubrics, system_message in ((DEFAULT_RUBRICS, None), (tuple((CONFIG_DIR / "rubrics" / "tiny").glob("*.yaml")), "You rate answers."),
                                (tuple((CONFIG_DIR / "rubrics" / "tiny").glob("*.yaml")), "")):
    by_category = load_rubrics(rubrics)
    for sample in samples[:3]:
        prompt = build_prompt(sample, by_category[sample.category], template, system_message, out / "data", tiling)
        prompts.append({"text": prompt.text, "controls": [list(span) for span in prompt.controls]})
text, controls = render_query(template, [None, "\nIs this a good answer? Rate it."], [placeholder(tiling, 2 * SIZES.tokens_per_tile)], None)
prompts.append({"text": text, "controls": [list(span) for span in controls]})
(out / "prompts.json").write_text(json.dumps(prompts, indent=1, ensure_ascii=False))
print(f"{len(prompts)} prompts, {sum(len(p['text']) for p in prompts)} characters")
