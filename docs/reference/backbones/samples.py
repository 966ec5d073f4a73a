"""MMIE-format samples for the backbone exactness checks: sample i has i % 5 images (0-4), split between question
and answer, PNG and JPEG of 32-400 px a side (some with transparency, some upright only by their EXIF tag), and
20-700 words of text, so that prompts fall on both sides of a rope switch placed within their range.
usage: samples.py DATA_DIR N SEED"""
import json
import random
import sys
from pathlib import Path

from PIL import Image, ImageDraw

from mmjudge.judge.testing.checkpoints import CORPUS_WORDS

out, n, seed = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(seed)
(out / "images").mkdir(parents=True, exist_ok=True)
words = CORPUS_WORDS + ["zebra", "quixotic", "Ångström", "naïve", "42", "x²", "—", "fjord", "日本", "🙂"]


def image(name: str) -> str:
    width, height = rng.randint(32, 400), rng.randint(32, 400)
    mode = rng.choice(["RGB", "RGB", "RGBA", "L"])
    picture = Image.new(mode, (width, height), tuple(rng.randrange(256) for _ in range(len(mode))) if mode != "L" else rng.randrange(256))
    draw = ImageDraw.Draw(picture)
    for _ in range(rng.randint(1, 4)):
        box = sorted(rng.sample(range(width), 2)) + sorted(rng.sample(range(height), 2))
        fill = tuple(rng.randrange(256) for _ in range(len(mode))) if mode != "L" else rng.randrange(256)
        draw.rectangle([box[0], box[2], box[1], box[3]], fill=fill)
    path = f"images/{name}.{'png' if mode != 'RGB' or rng.random() < 0.5 else 'jpg'}"
    picture.save(out / path)
    return path


def text(k: int) -> str:
    return " ".join(rng.choice(words) for _ in range(k)).capitalize() + "."


records = []
for i in range(n):
    sid = f"{('SA', 'PBL', 'MSR')[i % 3]}_{i:04d}"
    images = i % 5
    in_question = rng.randint(0, images)
    question = [{"text": text(rng.randint(20, 120)), "image": None}] + [{"text": None, "image": image(f"q_{i:04d}_{k}")} for k in range(in_question)]
    answer = [{"text": text(rng.randint(40, 700)), "image": None}]
    answer += [{"text": text(rng.randint(3, 20)), "image": image(f"a_{i:04d}_{k}")} for k in range(images - in_question)]
    records.append({"id": sid, "model": "m", "question": question, "answer": answer, "gt_answer": [{"text": text(8), "image": None}]})
(out / "data.json").write_text(json.dumps(records, indent=1, ensure_ascii=False))
print(out)
