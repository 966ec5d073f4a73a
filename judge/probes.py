"""The bias suite's probes: what each perturbation changes, what a judge that reads the image and the content
should do under it, and how its effect is measured and gated. Torch-free: judge-score runs the perturbed copies
(infer/probe.py), judge-calibrate reports their effects (calibration/run.py).

Each probe scores perturbed copies of the samples through the same engine and journal, and compares each copy's
overall score (or expected score) with the sample's own:
- effect: the mean shift (copy minus original, in score levels) and the share of samples whose score changed
  level, each with a 95% percentile bootstrap interval over samples;
- gate, by what the probe expects of a judge that looks at the image and judges content, not form:
  - moves (the image blanked, swapped, degraded, its order reversed): the score should change on at least
    --probe_threshold of the samples; a judge under it does not read what the images show;
  - drops (a sentence that contradicts the image appended): the mean shift's interval should lie below 0;
  - holds (padding that adds nothing; the same content reworded): the mean shift should be at most
    --probe_max_shift levels (padding: upwards; rewording: either way).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel


@dataclass(frozen=True)
class Probe:
    kind: str
    changes: str  # what the copy changes, for the report
    expects: str  # moves, drops or holds (module docstring)
    source: str  # the paper the perturbation follows, and how ours differs
    images: bool  # it changes the answer's images: samples without any are not probed


PROBES = {p.kind: p for p in (
    Probe("blank", "answer images blanked (mid-grey)", "moves",
          "MM-JudgeBias (arXiv 2604.18164) asks what a judge does without the image (its Bias-Deviation: the score should drop when "
          "meaning is destroyed); ours keeps a grey image of the same size, so the prompt keeps its tiles and tokens, and gates on any "
          "change, not only a drop", True),
    Probe("shuffle", "answer images swapped with other samples' of the same category", "moves",
          "MM-JudgeBias's image-response mismatch; ours draws another sample's image of the same category (seeded by --probe_seed and "
          "the id), so the image stays plausible for the question", True),
    Probe("blur", "answer images blurred (Gaussian, radius a 50th of the shorter side)", "moves",
          "an image degradation (this issue's; we have not matched MM-JudgeBias's own operations); one fixed strength; a judge moves "
          "where its rubric scores image quality, as MMIE's does", True),
    Probe("noise", "answer images with Gaussian pixel noise (sigma 40 of 255, seeded)", "moves",
          "an image degradation, as blur; one fixed strength", True),
    Probe("quarter", "answer images at a quarter of their width and height, shown at their own size", "moves",
          "an image degradation, as blur; scaled back up, so the judge's tiles are unchanged and only detail is lost", True),
    Probe("reverse", "answer images in reverse order (answers with two or more)", "moves",
          "ours, for interleaved answers (MMIE, OpenING): each text no longer sits beside its image", True),
    Probe("contradict", "a sentence that contradicts the images appended to the answer", "drops",
          "text anchoring: judges reward a plausible narrative that conflicts with the image (arXiv 2606.02578: 16.4% of Qwen2.5-VL-7B's "
          "judging errors); ours appends one fixed sentence that denies the images' content, where the paper perturbs the images", True),
    Probe("verbosity", "the answer padded with a fluent paragraph that adds nothing", "holds",
          "verbosity bias (Zheng et al. 2023, MT-Bench), which MM-JudgeBias's Bias-Conformity (a change that keeps the meaning should "
          "keep the score) covers for multimodal judges; one fixed paragraph", False),
    Probe("paraphrase", "the answer's text reworded, from the user's --paraphrases file", "holds",
          "MM-JudgeBias's Bias-Conformity for rewording; no model here writes paraphrases, so they come from the user", False),
)}
# For pairs, position (the answer shown first) is probed by judging both orders: judge-calibrate's preference report.

# The gates' defaults: an image probe should change the score on at least a tenth of the samples (judge-score's
# warning, infer/probe.py, uses the same); padding or rewording may move the mean score by half a level at most.
BARELY_MOVES = 0.10
PROBE_MAX_SHIFT = 0.5
# On pairs, the judge may pick its own family's answer at most this much more often than people do.
FAMILY_MAX_GAP = 0.10
SEEDED = ("shuffle", "noise")  # the probes --probe_seed draws for


def probe_kinds(args) -> list[str]:
    """The probes a judge-score run asked for: --probe's, and --probe_images's, once each in the order given."""
    return list(dict.fromkeys([*(getattr(args, "probe", None) or []), *([args.probe_images] if getattr(args, "probe_images", None) else [])]))


CONTRADICTION = "To be clear, the image above shows something else entirely: an empty white room with nothing in it."
PADDING = ("It is worth noting that this answer has been carefully considered and written with attention to clarity, "
           "completeness and coherence. Each point above follows from the previous one, and together they address the "
           "question as it was asked, in a form that is easy to read and to follow from the beginning to the end.")


class Share(BaseModel):
    value: float
    low: float
    high: float


class ProbeEffect(BaseModel):
    kind: str
    changes: str
    expects: str
    source: str
    n: int  # samples scored in both passes
    mean_shift: Share  # copy minus original, score levels
    share_changed: Share  # of samples whose score changed level
    gate: str  # the rule, in words
    threshold: float  # --probe_threshold and --probe_max_shift, as the gate read them
    max_shift: float
    passed: bool | None  # None: no sample to judge by


def mean_with_interval(values: np.ndarray, resamples: int, seed: int) -> Share:
    """The mean, with a 95% percentile bootstrap interval over the values (none drawn: the mean alone)."""
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, len(values), size=(resamples, len(values)))].mean(1) if resamples else np.array([values.mean()])
    return Share(value=float(values.mean()), low=float(np.percentile(means, 2.5)), high=float(np.percentile(means, 97.5)))


def probe_effect(kind: str, before: np.ndarray, after: np.ndarray, before_level: np.ndarray, after_level: np.ndarray,
                 threshold: float, max_shift: float, resamples: int = 1000, seed: int = 0) -> ProbeEffect:
    """The effect and gate of one probe from the original's and the copy's scores (and their level indices) per sample."""
    probe = PROBES[kind]
    shift, changed = np.asarray(after, float) - np.asarray(before, float), (np.asarray(after_level) != np.asarray(before_level)).astype(float)
    gate = {"moves": f"passes where the score changes on at least {threshold:.0%} of the samples",
            "drops": "passes where the mean shift's 95% interval lies below 0",
            "holds": (f"passes where the mean shift is at most +{max_shift:g} levels" if kind == "verbosity"
                      else f"passes where the mean shift is within ±{max_shift:g} levels")}[probe.expects]
    common = dict(kind=kind, changes=probe.changes, expects=probe.expects, source=probe.source, n=len(shift), gate=gate, threshold=threshold, max_shift=max_shift)
    if not len(shift):
        empty = Share(value=0.0, low=0.0, high=0.0)
        return ProbeEffect(**common, mean_shift=empty, share_changed=empty, passed=None)
    mean_shift, share_changed = mean_with_interval(shift, resamples, seed), mean_with_interval(changed, resamples, seed)
    passed = {"moves": share_changed.value >= threshold, "drops": mean_shift.high < 0,
              "holds": mean_shift.value <= max_shift if kind == "verbosity" else abs(mean_shift.value) <= max_shift}[probe.expects]
    return ProbeEffect(**common, mean_shift=mean_shift, share_changed=share_changed, passed=bool(passed))
