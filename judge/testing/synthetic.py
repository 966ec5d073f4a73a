"""Synthetic MMIE-format datasets with real image files, and human scores a judge can learn.

Sample i (from 1) is `SA_000i`, `PBL_000i` or `MSR_000i` in turn, by model-a, model-b or model-c in
turn, with 0-2 question images and 0-3 answer images (PNG or JPEG, 32-200 px a side, coloured shapes),
stored as `images/q_000i_k.png` / `images/a_000i_k.jpg` and referenced by those relative paths. Every
fifth answer is a plain string, as MMIE's text-only models give (so it has no image).

Each answer ends with "Overall, this answer is <marker>." With `annotated=True` the human scores are
a function of that marker and of whether the answer has an image (`human_scores`):

    base                 = 0 for "poor", 3 for "average", 5 for "excellent"
    overall              = base + 1 if the answer has at least one image, else base
    text_quality         = base
    image_quality        = overall if the answer has an image, else 0
    text_image_coherence = max(overall - 1, 0)
    style_consistency    = min(overall + 1, 6) if the answer has two or more images, else overall

Every record names `annotator` "ann-1" and carries a short `feedback` (FEEDBACK) that gives none of the facts the
scores follow from: a critique that named the marker ("The answer is excellent.") let a
judge in training read its scores from its own critique, right in every target, instead of from the answer;
where it had not yet learnt to write that word, its scores followed a wrong one (the demo's seed 2 wrote
"average" for every answer, overall Pearson 0.39, where this critique gives 0.99). Every fourth sample (1, 5,
9, ...) is rated again by "ann-2", whose overall and text_quality differ by exactly 1 (one up, or one down
from 6), so multi-annotator aggregation has something to average.

Those scores follow the text and the image count, not what the images show: blanking or swapping an answer's
images keeps both, so a judge trained on them may rightly ignore the pixels. Two twin variants tell a judge that
looks at the image from one that reads the text only (the bias suite's must-show, docs/calibration.md), `rating`:
every answer has one image, mostly red or mostly blue, and closes with "Overall, the picture is <red|blue>.",
the image's colour and the claimed one drawn independently, so the inputs of both twins are alike:

    rating="image": every score is 5 where the answer's image is mostly red, 1 where it is mostly blue;
                    the claim, drawn apart from the image, tells nothing of it
    rating="text":  every score is 5 where the answer claims red, 1 where it claims blue; the image tells nothing

Their questions have no image, and one annotator rates each sample (no "ann-2"): nothing but the rule to learn.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from PIL import Image, ImageDraw

from mmjudge.judge.data import JudgeResult
from mmjudge.judge.parquet import SEGMENT_FIELDS, write_rows

CATEGORIES = ("SA", "PBL", "MSR")
MODELS = ("model-a", "model-b", "model-c")
MARKERS = {"poor": 0, "average": 3, "excellent": 5}
RATINGS = ("marker", "image", "text")  # what the human scores follow: the closing marker (and image count), or a colour (module doc)
COLOURS = {"red": (215, 35, 35), "blue": (35, 55, 215)}  # the colour variants' two dominant colours, and their scores
COLOUR_SCORES = {"red": 5, "blue": 1}
FEEDBACK = "The answer was rated."  # as long as "The answer is excellent." was: the review fits eval_max_new_tokens
WORDS = "the boat leaves the harbour and the story goes on with a clear plan for each step of the scene".split()


def human_scores(marker: str, answer_images: int) -> dict[str, int]:
    """ann-1's scores for an answer with this marker word and this many images (rule in the module doc)."""
    base = MARKERS[marker]
    overall = base + 1 if answer_images else base
    return {
        "overall": overall,
        "text_quality": base,
        "image_quality": overall if answer_images else 0,
        "text_image_coherence": max(overall - 1, 0),
        "style_consistency": min(overall + 1, 6) if answer_images >= 2 else overall,
    }


def _second_opinion(scores: dict[str, int]) -> dict[str, int]:
    nudge = lambda x: x + 1 if x < 6 else x - 1  # noqa: E731
    return {**scores, "overall": nudge(scores["overall"]), "text_quality": nudge(scores["text_quality"])}


def _draw_image(rng: random.Random, path: Path) -> None:
    width, height = rng.randint(32, 200), rng.randint(32, 200)
    colour = lambda: tuple(rng.randrange(256) for _ in range(3))  # noqa: E731
    image = Image.new("RGB", (width, height), colour())
    draw = ImageDraw.Draw(image)
    for _ in range(rng.randint(1, 4)):
        x0, y0 = rng.randrange(width), rng.randrange(height)
        x1, y1 = x0 + rng.randint(4, width), y0 + rng.randint(4, height)
        shape = rng.choice(["ellipse", "rectangle", "triangle"])
        if shape == "triangle":
            draw.polygon([(x0, y1), ((x0 + x1) // 2, y0), (x1, y1)], fill=colour())
        else:
            getattr(draw, shape)((x0, y0, x1, y1), fill=colour())
    image.save(path, quality=90)  # the suffix picks PNG or JPEG; PNG ignores quality


def _draw_coloured(rng: random.Random, path: Path, colour: str) -> None:
    """A picture mostly of `colour` (its shade jittered), with one small shape of any colour on it."""
    width, height = rng.randint(32, 200), rng.randint(32, 200)
    image = Image.new("RGB", (width, height), tuple(min(255, max(0, c + rng.randint(-25, 25))) for c in COLOURS[colour]))
    x0, y0 = rng.randrange(width), rng.randrange(height)
    ImageDraw.Draw(image).ellipse((x0, y0, x0 + width // 4, y0 + height // 4), fill=tuple(rng.randrange(256) for _ in range(3)))
    image.save(path, quality=90)


def colour_scores(colour: str) -> dict[str, int]:
    """The colour variants' human scores: every criterion and the overall score alike (module doc)."""
    return {name: COLOUR_SCORES[colour] for name in ("overall", "text_quality", "image_quality", "text_image_coherence", "style_consistency")}


def _coloured_record(rng: random.Random, out_dir: Path, i: int, rating: str, annotated: bool) -> dict:
    shown, claimed = rng.choice(list(COLOURS)), rng.choice(list(COLOURS))
    name = f"images/a_{i:04d}_0.{rng.choice(['png', 'jpg'])}"
    _draw_coloured(rng, out_dir / name, shown)
    answer = [{"text": _sentence(rng, rng.randint(6, 14))}, {"image": name}, {"text": f"Overall, the picture is {claimed}."}]
    record = {"id": f"{CATEGORIES[(i - 1) % 3]}_{i:04d}", "question": [{"text": _sentence(rng, rng.randint(6, 14)) + " What does it show?"}],
              "answer": answer, "model": MODELS[(i - 1) % len(MODELS)], "gt_answer": [{"text": _sentence(rng, 8)}]}
    if not annotated:
        return record
    return {**record, "human_scores": colour_scores(shown if rating == "image" else claimed), "annotator": "ann-1", "feedback": FEEDBACK}


def _sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + "."


def write_dataset(out_dir: str | Path, n_samples: int, *, seed: int = 0, annotated: bool = False, rating: str = "marker") -> Path:
    """Write OUT_DIR/data.json and OUT_DIR/images/ (see the module doc); returns the path of data.json. `rating`: what
    the human scores follow, the closing marker (the demo's data) or, in the twin variants, an image's colour or a text's."""
    if n_samples < 1:
        raise ValueError(f"n_samples must be at least 1, got {n_samples}")
    if rating not in RATINGS:
        raise ValueError(f"rating must be one of {', '.join(RATINGS)}, got {rating!r}")
    out_dir = Path(out_dir)
    (out_dir / "images").mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    records = []
    for i in range(1, n_samples + 1):
        if rating != "marker":
            records.append(_coloured_record(rng, out_dir, i, rating, annotated))
            continue

        def segments(part: str, n_images: int, text: str) -> list[dict]:
            out = [{"text": text}]
            for k in range(n_images):
                name = f"images/{part}_{i:04d}_{k}.{rng.choice(['png', 'jpg'])}"
                _draw_image(rng, out_dir / name)
                # Both MMIE segment shapes: an image alone, and a caption with its image.
                out.append({"text": _sentence(rng, 4), "image": name} if k % 2 else {"image": name})
            return out

        marker = rng.choice(list(MARKERS))
        plain = i % 5 == 0
        n_answer_images = 0 if plain else rng.randint(0, 3)
        question = segments("q", rng.randint(0, 2), _sentence(rng, rng.randint(6, 14)) + " What happens next?")
        # The marker closes the answer, right before the judge starts writing: close enough for a tiny
        # 2-layer judge to learn the rule in a few CPU minutes.
        verdict = f"Overall, this answer is {marker}."
        opening = _sentence(rng, rng.randint(6, 14))
        answer = f"{opening} {verdict}" if plain else segments("a", n_answer_images, opening) + [{"text": verdict}]
        record = {"id": f"{CATEGORIES[(i - 1) % 3]}_{i:04d}", "question": question, "answer": answer,
                  "model": MODELS[(i - 1) % len(MODELS)], "gt_answer": [{"text": _sentence(rng, 8)}]}
        if not annotated:
            records.append(record)
            continue
        scores = human_scores(marker, n_answer_images)
        records.append({**record, "human_scores": scores, "annotator": "ann-1", "feedback": FEEDBACK})
        if i % 4 == 1:
            records.append({**record, "human_scores": _second_opinion(scores), "annotator": "ann-2"})
    path = out_dir / "data.json"
    path.write_text(json.dumps(records, indent=1))
    return path


def write_pairs(out_dir: str | Path, n_pairs: int, *, seed: int = 0, annotated: bool = False, text_only: bool = False,
                rationale: bool = True) -> Path:
    """OUT_DIR/pairs.json (and the images of a synthetic dataset of 2 x n_pairs samples, data.json): pair k is
    sample 2k-1's question with its answer as A and sample 2k's as B, `pair_000k`, of category general. With
    `annotated=True` people prefer the answer whose closing marker is better (poor < average < excellent), a
    tie where both say the same, and write why; every fourth pair is annotated again by "ann-2", alike. With
    `text_only=True` a pair is the question's first text and each answer's closing sentence, no image: prompts
    short enough for the demo to train a tiny judge on them in CPU seconds. With `rationale=False` people give
    their preference alone: a rationale naming both markers lets a judge in training read its verdict from
    its own rationale rather than from the answers, as a critique naming the marker did for scores (module
    doc); the demo's tiny judge learnt no verdict that way (accuracy 0.125 on the test pairs, docs/pairwise.md)."""
    if n_pairs < 1:
        raise ValueError(f"n_pairs must be at least 1, got {n_pairs}")
    out_dir = Path(out_dir)
    records = json.loads(write_dataset(out_dir, 2 * n_pairs, seed=seed).read_text())
    pairs = []
    for k in range(n_pairs):
        a, b = records[2 * k], records[2 * k + 1]
        if text_only:  # the question's first text, and each answer's closing sentence: a short prompt
            question, answer_a, answer_b = a["question"][:1], closing(a["answer"]), closing(b["answer"])
        else:
            question, answer_a, answer_b = a["question"], a["answer"], b["answer"]
        pair = {"id": f"pair_{k + 1:04d}", "question": question, "answer_a": answer_a, "answer_b": answer_b, "model_a": a["model"], "model_b": b["model"]}
        if not annotated:
            pairs.append(pair)
            continue
        markers = [marker_of(a["answer"]), marker_of(b["answer"])]
        ranks = [MARKERS[m] for m in markers]
        preference = "tie" if ranks[0] == ranks[1] else "A" if ranks[0] > ranks[1] else "B"
        why = {"rationale": f"Answer A is {markers[0]} and answer B is {markers[1]}."} if rationale else {}
        pairs.append({**pair, "preference": preference, "annotator": "ann-1", **why})
        if k % 4 == 0:
            pairs.append({**pair, "preference": preference, "annotator": "ann-2"})
    path = out_dir / "pairs.json"
    path.write_text(json.dumps(pairs, indent=1))
    return path


def write_parquet_copy(path: str | Path) -> Path:
    """The records of `path` (written by `write_dataset` or `write_pairs`) as a Parquet file beside it, a record a
    row, in the shape Hugging Face datasets give: every text a list of segments (an Arrow column holds one shape),
    every image a `{"bytes", "path"}` struct holding its file's bytes. Returns the path written."""
    path = Path(path)

    def as_row(value):
        if isinstance(value, list):
            return [as_row(item) for item in value]
        if isinstance(value, dict) and "image" in value:
            return {**value, "image": {"bytes": (path.parent / value["image"]).read_bytes(), "path": value["image"]}}
        return value

    rows = [{key: as_row([{"text": value}] if key in SEGMENT_FIELDS and isinstance(value, str) else value) for key, value in record.items()}
            for record in json.loads(path.read_text())]
    write_rows(out := path.with_suffix(".parquet"), rows)
    return out


def closing(answer: str | list[dict]) -> str:
    """The sentence an answer of `write_dataset` closes with: "Overall, this answer is <marker>." """
    text = answer if isinstance(answer, str) else answer[-1]["text"]
    return "Overall," + text.rsplit("Overall,", 1)[-1]


def marker_of(answer: str | list[dict]) -> str:
    """The marker word an answer of `write_dataset` closes with."""
    return closing(answer).rstrip(".").rsplit(" ", 1)[-1]


def judge_result(sample_id: str, score: int | float | None, **fields) -> JudgeResult:
    """A judge-score result with this score and the given fields; the others are neutral (no model, no
    images, no tokens), for tests of what reads results."""
    neutral = {"model": None, "category": "SA", "feedback": "", "criteria": {}, "n_images": 0, "n_tiles": 0,
               "prompt_tokens": 0, "generated_tokens": 0}
    return JudgeResult(id=sample_id, score=score, **(neutral | fields))


# Judges of known quality for `verdicts`: each sees people's leaning through its own noise (log-odds), so the
# sharp one agrees with people most and the panel of the three has something to combine.
VERDICT_JUDGES = {"sharp": 0.5, "fair": 1.2, "blunt": 2.0}


def write_verdicts(out_dir: str | Path, n_pairs: int, *, seed: int = 0) -> Path:
    """Pairs with a known chance q that people prefer A (drawn from Beta(0.6, 0.6)), people's preference drawn from it,
    and three judges' verdicts with order-averaged distributions (VERDICT_JUDGES: log-odds 1.5 times q's plus noise,
    so each is overconfident): OUT_DIR/people.json and OUT_DIR/<judge>.json. Pure numpy; no images, no model."""
    import numpy as np

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    q = np.clip(rng.beta(0.6, 0.6, n_pairs), 1e-6, 1 - 1e-6)
    people_a = rng.random(n_pairs) < q
    models = [("model-a", "model-b"), ("model-b", "model-c"), ("model-a", "model-c")]
    people = [{"id": f"pair_{k:04d}", "preference": "A" if a else "B", "annotator": "synthetic"} for k, a in enumerate(people_a)]
    (out / "people.json").write_text(json.dumps(people, indent=1))
    for name, noise in VERDICT_JUDGES.items():
        p_a = 1 / (1 + np.exp(-(np.log(q / (1 - q)) * 1.5 + rng.normal(0, noise, n_pairs))))
        records = [{"id": f"pair_{k:04d}", "verdict": "A" if p >= 0.5 else "B", "model_a": models[k % 3][0], "model_b": models[k % 3][1],
                    "verdict_distribution": {"A": round(0.95 * p, 6), "B": round(0.95 * (1 - p), 6), "tie": 0.05}} for k, p in enumerate(p_a)]
        (out / f"{name}.json").write_text(json.dumps(records, indent=1))
    return out / "people.json"
