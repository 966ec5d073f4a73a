"""The bias suite's probes (judge-score --probe KIND ..., and --probe_images blank|shuffle, its first two):
does the judge look at the images, and is it swayed by what should not matter? judge/probes.py lists each
perturbation, what it expects of a judge, and the paper it follows.

Every sample a probe applies to is scored a second time, as a perturbed copy, through the same engine and a
journal of its own (probe_<kind>.json):
- blank: each answer image becomes a mid-grey image of the same size (so the same tiles and tokens);
- shuffle: each answer image becomes an answer image of another sample of the same category, drawn by a
  generator seeded with --probe_seed and the sample's id (the same draw on any number of ranks, in any
  order). A category where one sample alone has answer images has nothing to draw from: its sample is not
  probed, and the run says so;
- blur, noise, quarter: each answer image degraded (noise seeded by --probe_seed and the image), same size;
- reverse: the answer's images in reverse order, where it has two or more;
- contradict: a sentence that contradicts the images appended to the answer, where it has images;
- verbosity: a fluent paragraph that adds nothing appended to every answer;
- paraphrase: the answer replaced by the user's rewording (--paraphrases: [{id, answer}]), where given.
The figures compare the two passes sample by sample, per criterion (overall and each criterion scored in
both): the mean absolute change, the share of samples whose score changed, and the total-variation
distance between the two passes' score histograms. A judge that scores image quality or text-image
coherence from the text alone moves little under the image probes: see BARELY_MOVES. judge-calibrate --probes
reports each probe's effect with its interval and a pass/fail gate.

Perturbed images are written to a temporary directory that lives as long as the run, never beside the input;
the shuffled images are the input's own, only read.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from pathlib import Path
from statistics import mean

import matplotlib

matplotlib.use("Agg")  # no display needed
import matplotlib.pyplot as plt
import numpy as np
from PIL import Image, ImageFilter
from pydantic import ValidationError

from mmjudge.infer.journal import fingerprint
from mmjudge.infer.summary import histogram
from mmjudge.judge.data import CRITERIA, InputError, JudgeResult, Problem, Sample, Segment, read_json, resolve_image, validation_problems
from mmjudge.judge.parsing import ScoreScale
from mmjudge.judge.probes import BARELY_MOVES, CONTRADICTION, PADDING, PROBES, SEEDED

GREY = (128, 128, 128)
# A criterion that should depend on the images, whose score changes on under a tenth of the samples when
# their images are replaced, is named: the judge does not score what the images show. Judged on image quality
# and text-image coherence; on the overall score where the rubric scores neither (or --mode logits); on the
# expected score (at its nearest level) where no output parsed.
IMAGE_CRITERIA = ("image_quality", "text_image_coherence")


@dataclass(frozen=True)
class ProbePass:
    """The second pass: its samples, where its results go, and what its journal's results depend on."""

    kind: str  # blank or shuffle
    seed: int
    samples: list[Sample]
    notes: list[str]
    run_id: str


def result_file(kind: str) -> str:
    return f"probe_{kind}.json"


def plot_file(kind: str) -> str:
    return f"probe_{kind}.png"


def probe_pass(kind: str, seed: int, samples: list[Sample], image_root: Path, blank_dir: Path, run_id: str,
               paraphrases: dict[str, list[Segment]] | None = None) -> ProbePass:
    """The probe's pass over the run's samples; its results are resumed only beside the same main run's."""
    probed, notes = probed_samples(samples, kind, seed, image_root, blank_dir, paraphrases or {})
    depends = {"run": run_id, "probe": kind, "seed": seed}
    if kind == "paraphrase":  # a rewording edited since is another pass
        depends["paraphrases"] = [[s.id, [segment.model_dump() for segment in s.answer]] for s in probed]
    return ProbePass(kind, seed, probed, notes, fingerprint(depends))


def probed_samples(samples: list[Sample], probe: str, seed: int, image_root: Path, blank_dir: Path,
                   paraphrases: dict[str, list[Segment]] | None = None) -> tuple[list[Sample], list[str]]:
    """The samples of the probe pass, perturbed, and notes on the samples left out."""
    notes = []
    if probe == "paraphrase":
        given = [s for s in samples if s.id in (paraphrases or {})]
        if missing := len(samples) - len(given):
            notes.append(f"{missing} sample(s) have no rewording in --paraphrases: not probed")
        return [s.model_copy(update={"answer": paraphrases[s.id]}) for s in given], notes
    if probe == "verbosity":
        return [append_text(s, PADDING) for s in samples], notes
    with_images = [s for s in samples if answer_images(s)]
    if skipped := len(samples) - len(with_images):
        notes.append(f"{skipped} sample(s) have no image in their answer: nothing to replace, not probed")
    if probe == "contradict":
        return [append_text(s, CONTRADICTION) for s in with_images], notes
    if probe == "reverse":
        several = [s for s in with_images if len(answer_images(s)) > 1]
        if fewer := len(with_images) - len(several):
            notes.append(f"{fewer} sample(s) have one answer image: no order to reverse, not probed")
        return [replace_answer_images(s, answer_images(s)[::-1]) for s in several], notes
    if probe in ("blank", "blur", "noise", "quarter"):
        return [replace_answer_images(s, [degraded(resolve_image(image, image_root), probe, seed, blank_dir) for image in answer_images(s)])
                for s in with_images], notes
    pools: dict[str, list[tuple[str, str]]] = {}
    for s in with_images:
        pools.setdefault(s.category, []).extend((s.id, image) for image in answer_images(s))
    probed = []
    for s in with_images:
        others = sorted(image for owner, image in pools[s.category] if owner != s.id)  # sorted: the same draw in any input order
        if not others:
            notes.append(f"category {s.category!r}: sample {s.id!r} is its only sample with answer images, so --probe_images shuffle "
                         "has no other sample's image to give it; not probed")
            continue
        rng = random.Random(f"{seed}:{s.id}")
        probed.append(replace_answer_images(s, [rng.choice(others) for _ in answer_images(s)]))
    return probed, notes


def answer_images(sample: Sample) -> list[str]:
    return [segment.image for segment in sample.answer if segment.image is not None]


def replace_answer_images(sample: Sample, images: list[str]) -> Sample:
    replacements = iter(images)
    answer = [s.model_copy(update={"image": next(replacements)}) if s.image is not None else s for s in sample.answer]
    return sample.model_copy(update={"answer": answer})


def append_text(sample: Sample, text: str) -> Sample:
    return sample.model_copy(update={"answer": [*sample.answer, Segment(text=text)]})


def degraded(original: Path, kind: str, seed: int, out_dir: Path) -> str:
    """The original image perturbed (blank, blur, noise, quarter), written once per image into `out_dir`; its path."""
    if kind == "blank":
        return blank_image(original, out_dir)
    name = hashlib.sha256(f"{original.resolve()}:{kind}:{seed}".encode()).hexdigest()[:16]
    path = out_dir / f"{kind}-{name}.png"
    if path.exists():
        return str(path.resolve())
    with Image.open(original) as opened:
        image = opened.convert("RGB")
    width, height = image.size
    if kind == "blur":
        image = image.filter(ImageFilter.GaussianBlur(radius=max(1.0, min(width, height) / 50)))
    elif kind == "noise":
        rng = np.random.default_rng(int(name, 16))
        pixels = np.asarray(image, dtype=float) + rng.normal(0, 40, (height, width, 3))
        image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
    elif kind == "quarter":
        image = image.resize((max(1, width // 4), max(1, height // 4)), Image.Resampling.BICUBIC).resize((width, height), Image.Resampling.BICUBIC)
    else:
        raise ValueError(f"unknown degradation {kind!r}")
    image.save(path)
    return str(path.resolve())


def blank_image(original: Path, blank_dir: Path) -> str:
    """A mid-grey PNG of the original's size in `blank_dir` (one per size), its absolute path."""
    with Image.open(original) as image:  # the header only: nothing decoded
        width, height = image.size
    path = blank_dir / f"grey-{width}x{height}.png"
    if not path.exists():
        Image.new("RGB", (width, height), GREY).save(path)
    return str(path.resolve())


def reliance(results: list[JudgeResult], probed: dict[str, JudgeResult], scale: ScoreScale) -> dict[str, dict]:
    """Per criterion, how the scores of the probed samples moved between the two passes; only samples
    scored (parsed) in both count."""
    figures = {}
    for name in ("overall", *CRITERIA, "expected_score"):
        pairs = [(score_of(r, name), score_of(probed[r.id], name)) for r in results if r.id in probed]
        pairs = [(a, b) for a, b in pairs if a is not None and b is not None]
        if not pairs:
            continue
        before, after = [a for a, _ in pairs], [b for _, b in pairs]
        moved = scale.index(before) != scale.index(after)  # an expected score counts at its nearest level
        counts_before, counts_after = histogram(before, scale), histogram(after, scale)
        figures[name] = {
            "n": len(pairs),
            "mean_abs_change": mean(abs(a - b) for a, b in pairs),
            "share_changed": float(moved.mean()),
            "tv_distance": sum(abs(counts_before[k] - counts_after[k]) for k in counts_before) / (2 * len(pairs)),
        }
    return figures


def score_of(result: JudgeResult, name: str) -> int | float | None:
    if name in ("overall", "expected_score"):
        return result.score if name == "overall" else result.expected_score
    return result.criteria.get(name)


def barely_moving(figures: dict[str, dict]) -> list[str]:
    """The criteria judged for image reliance (IMAGE_CRITERIA, else the overall score, else the expected
    score where no output parsed) whose scores changed on fewer than BARELY_MOVES of the probed samples."""
    judged = [name for name in IMAGE_CRITERIA if name in figures] or [name for name in ("overall", "expected_score") if name in figures][:1]
    return [name for name in judged if figures[name]["share_changed"] < BARELY_MOVES]


def image_reliance(probe: str, seed: int, results: list[JudgeResult], probed: dict[str, JudgeResult], notes: list[str],
                   scale: ScoreScale) -> dict:
    """The summary's image_reliance entry."""
    figures = reliance(results, probed, scale)
    return {"probe": probe, "seed": seed if probe in SEEDED else None, "probed": len(probed), "notes": notes,
            "criteria": figures, "barely_moves": barely_moving(figures) if PROBES[probe].expects == "moves" else [], "threshold": BARELY_MOVES}


def format_reliance(entry: dict) -> str:
    what = PROBES[entry["probe"]]
    lines = [f"{'Image reliance' if what.expects == 'moves' else 'Probe'}, {what.changes}: {entry['probed']} sample(s) scored again"]
    lines += [f"  note: {note}" for note in entry["notes"]]
    for name, f in entry["criteria"].items():
        lines.append(f"  {name}: mean |change| {f['mean_abs_change']:.3f}, changed {f['share_changed']:.0%}, "
                     f"total variation {f['tv_distance']:.3f} (n={f['n']})")
    if not entry["criteria"]:
        lines.append("  no sample has a parsed score in both passes: nothing to compare")
    for name in entry["barely_moves"]:
        lines.append(f"warning: the judge's {name} scores barely move without the answer's images: changed on "
                     f"{entry['criteria'][name]['share_changed']:.0%} of the samples (under {entry['threshold']:.0%}); "
                     "it does not score what the images show")
    return "\n".join(lines)


def plot_reliance(entry: dict, path: Path) -> None:
    """Per criterion, the share of samples whose score changed and the histograms' total variation (both
    0-1, the BARELY_MOVES line across), and the mean absolute change in score levels."""
    names = list(entry["criteria"])
    figures = [entry["criteria"][name] for name in names]
    x = range(len(names))
    fig, (shares, changes) = plt.subplots(1, 2, figsize=(10, 3.8))
    for offset, key, label in ((-0.2, "share_changed", "share of samples changed"), (0.2, "tv_distance", "total variation of the histograms")):
        bars = shares.bar([i + offset for i in x], [f[key] for f in figures], 0.4, label=label)
        shares.bar_label(bars, fmt="%.2f", fontsize=7)  # a bar of 0 is still read as 0
    shares.axhline(entry["threshold"], color="grey", linestyle="--", label=f"barely moves: under {entry['threshold']:.0%} changed")
    shares.set_ylim(0, 1)
    shares.legend(fontsize=8)
    changes.bar_label(changes.bar(list(x), [f["mean_abs_change"] for f in figures], 0.5, color="tab:green"), fmt="%.2f", fontsize=7)
    changes.set_ylim(0, 1.15 * max([f["mean_abs_change"] for f in figures] + [0.5]))
    changes.set_ylabel("mean |change| (score levels)")
    for ax in (shares, changes):
        ax.set_xticks(list(x), names, rotation=20, ha="right")
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(f"Probe {entry['probe']}: {PROBES[entry['probe']].changes}, {entry['probed']} samples", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def read_paraphrases(path: Path, samples: list[Sample]) -> dict[str, list[Segment]]:
    """--paraphrases: [{id, answer}], each answer a string or segments as the input's; every problem of every record named,
    before the judge loads (an id the input does not hold is one)."""
    content = read_json(path)
    if not isinstance(content, list):
        raise InputError([Problem(str(path), "expected a JSON list of {id, answer}")])
    known, problems, found = {s.id: s for s in samples}, [], {}
    for index, raw in enumerate(content):
        rid = str(raw["id"]) if isinstance(raw, dict) and raw.get("id") is not None else None
        if rid not in known or rid in found:
            said = "a record needs an id" if rid is None else f"id {rid!r} is reworded twice" if rid in found else (
                f"no sample of id {rid!r} in the input (after --limit)")
            problems.append(Problem(str(path), said, index, rid, "id"))
            continue
        try:
            found[rid] = Sample.model_validate({**known[rid].model_dump(), "answer": raw.get("answer")}).answer
        except ValidationError as err:
            problems += validation_problems(str(path), index, rid, err)
    if problems:
        raise InputError(problems)
    return found
