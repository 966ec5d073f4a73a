"""The image-reliance probe (judge-score --probe_images blank|shuffle): does the judge look at the images?

Every sample whose answer has images is scored a second time with those images replaced, the question's
images and all text unchanged:
- blank: each answer image becomes a mid-grey image of the same size (so the same tiles and tokens);
- shuffle: each answer image becomes an answer image of another sample of the same category, drawn by a
  generator seeded with --probe_seed and the sample's id (the same draw on any number of ranks, in any
  order). A category where one sample alone has answer images has nothing to draw from: its sample is not
  probed, and the run says so.
The figures compare the two passes sample by sample, per criterion (overall and each criterion scored in
both): the mean absolute change, the share of samples whose score changed, and the total-variation
distance between the two passes' score histograms. A judge that scores image quality or text-image
coherence from the text alone moves little: see BARELY_MOVES.

Grey images are written to a temporary directory that lives as long as the run, never beside the input;
the shuffled images are the input's own, only read.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from statistics import mean

import matplotlib

matplotlib.use("Agg")  # no display needed
import matplotlib.pyplot as plt
from PIL import Image

from mmjudge.infer.journal import fingerprint
from mmjudge.infer.summary import histogram
from mmjudge.judge.data import CRITERIA, JudgeResult, Sample, resolve_image
from mmjudge.judge.parsing import ScoreScale

GREY = (128, 128, 128)
# A criterion that should depend on the images, whose score changes on under a tenth of the samples when
# their images are replaced, is named: the judge does not score what the images show. Judged on image quality
# and text-image coherence; on the overall score where the rubric scores neither (or --mode logits); on the
# expected score (at its nearest level) where no output parsed.
BARELY_MOVES = 0.10
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


def probe_pass(kind: str, seed: int, samples: list[Sample], image_root: Path, blank_dir: Path, run_id: str) -> ProbePass:
    """The probe's pass over the run's samples; its results are resumed only beside the same main run's."""
    probed, notes = probed_samples(samples, kind, seed, image_root, blank_dir)
    return ProbePass(kind, seed, probed, notes, fingerprint({"run": run_id, "probe": kind, "seed": seed}))


def probed_samples(samples: list[Sample], probe: str, seed: int, image_root: Path, blank_dir: Path) -> tuple[list[Sample], list[str]]:
    """The samples of the probe pass, their answer images replaced, and notes on the samples left out."""
    with_images = [s for s in samples if answer_images(s)]
    notes = []
    if skipped := len(samples) - len(with_images):
        notes.append(f"{skipped} sample(s) have no image in their answer: nothing to replace, not probed")
    if probe == "blank":
        return [replace_answer_images(s, [blank_image(resolve_image(image, image_root), blank_dir) for image in answer_images(s)])
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
    return {"probe": probe, "seed": seed if probe == "shuffle" else None, "probed": len(probed), "notes": notes,
            "criteria": figures, "barely_moves": barely_moving(figures), "threshold": BARELY_MOVES}


def format_reliance(entry: dict) -> str:
    replaced = {"blank": "blanked (mid-grey)", "shuffle": "swapped with other samples' of the same category"}[entry["probe"]]
    lines = [f"Image reliance, answer images {replaced}: {entry['probed']} sample(s) scored again"]
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
    fig.suptitle(f"Image reliance: the answer's images {'blanked' if entry['probe'] == 'blank' else 'shuffled within the category'}, "
                 f"{entry['probed']} samples")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
