"""Synthetic MMIE-format datasets with real image files, and human scores a judge can learn.

Each answer ends with a marker word that sets its quality level: "poor" 1, "average" 3, "excellent" 5.
With --annotated, the human scores follow from the level and the answer's images:

    overall = text_quality = level
    image_quality = level if the answer has an image, else 0
    text_image_coherence = max(level - 1, 0)
    style_consistency = min(level + 1, 6) if the answer has two or more images, else level

Every fifth answer is a plain string (as MMIE's text-only models give). Every fourth sample has a second annotator whose overall and text_quality are one higher (capped at 6),
so multi-annotator aggregation has something to average.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from PIL import Image, ImageDraw

CATEGORIES = ("SA", "PBL", "MSR")
MODELS = ("model-a", "model-b", "model-c")
LEVELS = {"poor": 1, "average": 3, "excellent": 5}
WORDS = "the boat leaves the harbour and the story goes on with a clear plan for each step of the scene".split()


def _image(rng: random.Random, path: Path) -> None:
    width, height = rng.randint(32, 200), rng.randint(32, 200)
    image = Image.new("RGB", (width, height), tuple(rng.randrange(256) for _ in range(3)))
    draw = ImageDraw.Draw(image)
    for _ in range(3):
        x0, y0 = rng.randrange(width), rng.randrange(height)
        box = (x0, y0, x0 + rng.randint(4, width), y0 + rng.randint(4, height))
        draw.ellipse(box, fill=tuple(rng.randrange(256) for _ in range(3)))
    image.save(path, quality=90)


def _sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + "."


def human_scores(level: int, answer_images: int) -> dict[str, int]:
    return {
        "overall": level,
        "text_quality": level,
        "image_quality": level if answer_images else 0,
        "text_image_coherence": max(level - 1, 0),
        "style_consistency": min(level + 1, 6) if answer_images >= 2 else level,
    }


def write_dataset(out_dir: str | Path, n_samples: int, *, seed: int = 0, annotated: bool = False) -> Path:
    """Write OUT_DIR/data.json and OUT_DIR/images/; returns the path of data.json."""
    out_dir = Path(out_dir)
    (out_dir / "images").mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    records = []
    for i in range(n_samples):
        sample_id = f"{CATEGORIES[i % 3]}_{i:04d}"

        def segments(part: str, n_images: int, text: str) -> list[dict]:
            out = [{"text": text}]
            for k in range(n_images):
                name = f"images/{part}_{i:04d}_{k}.{rng.choice(['png', 'jpg'])}"
                _image(rng, out_dir / name)
                out.append({"text": _sentence(rng, 4), "image": name} if k % 2 else {"image": name})
            return out

        marker = rng.choice(list(LEVELS))
        plain = i % 5 == 4  # MMIE's text-only models answer with a plain string
        n_answer_images = 0 if plain else rng.randint(0, 3)
        question = segments("q", rng.randint(0, 2), _sentence(rng, rng.randint(6, 14)) + " What happens next?")
        # The marker closes the answer, right before the judge starts writing: close enough for a tiny
        # 2-layer judge to learn the rule in a few CPU minutes.
        verdict = f"Overall, this answer is {marker}."
        opening = _sentence(rng, rng.randint(6, 14))
        answer = f"{opening} {verdict}" if plain else segments("a", n_answer_images, opening) + [{"text": verdict}]
        record = {"id": sample_id, "question": question, "answer": answer, "model": MODELS[i % len(MODELS)],
                  "gt_answer": [{"text": _sentence(rng, 8)}]}
        if not annotated:
            records.append(record)
            continue
        scores = human_scores(LEVELS[marker], n_answer_images)
        records.append({**record, "human_scores": scores, "annotator": "ann-1", "feedback": f"The answer is {marker}."})
        if i % 4 == 0:
            second = {**scores, "overall": min(scores["overall"] + 1, 6), "text_quality": min(scores["text_quality"] + 1, 6)}
            records.append({**record, "human_scores": second, "annotator": "ann-2"})
    path = out_dir / "data.json"
    path.write_text(json.dumps(records, indent=1))
    return path
