"""judge-score's scoring options: the keys of configs/score/<format>.yaml and, where marked, its flags.
Free of torch, so that the command line can be built and checked before any model code loads.

The defaults live in the dataclass rather than in a preset per format because code builds options too
(judge-train's evaluation, judge-serve, the benchmarks) and needs the same values a run gets; a preset that
repeated them could drift from them unseen."""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from mmjudge.configs import bundled, by_name
from mmjudge.judge.cli import config_values, setting_problems
from mmjudge.judge.data import UsageError
from mmjudge.judge.preferences import RULES


Mode = Literal["generate", "logits"]
# Tiles per image a run may ask: choosing an image's grid among more takes ever longer (a 96 x 64 image on a busy
# 2-core machine: 0.007 s at 64 tiles, 0.07 s at 128, 0.5 s at 256; 20,000 did not end in a minute, 1e9 hung).
MAX_TILES = 64
# Judgements of a pair in each order: VL-RewardBench votes over a handful; 1e20 was taken and never ended.
MAX_SAMPLES = 100
# Tokens of keys and values a prefix cache may hold: at InternVL2-4B's 384 KiB a token, 2**20 are 384 GiB, more
# than any one device holds.
MAX_PREFIX_CACHE = 2**20
# The keys and values judge-serve's reward endpoints keep of prompts' shared parts where --prefix_cache is not given,
# off a GPU (serve/rewards.py's with_prefix_cache; on one, half the KV cache's room: infer/cache.py's
# prefix_cache_room): InternVL2-4B's 16,384 tokens in bf16; a smaller judge's more, which a fixed count of tokens left
# missing (docs/rewards.md).
REWARD_PREFIX_CACHE_BYTES = 6 * 2**30
Rule = Literal[RULES]


def _option(default, help: str, minimum: int | None = None, flag: bool = True, below: int | None = None):
    """A ScoreOptions field. `help` is also its flag's; `minimum` is the least whole number that works and
    `below` a bound it stays under; `flag`: judge-score has a flag of the field's name (the others are for
    presets and code)."""
    return field(default=default, metadata={"help": help, "minimum": minimum, "flag": flag, "below": below})


@dataclass(frozen=True)
class ScoreOptions:
    """How judge-score runs. Each option is declared once, here, with its default, which is MMIE's;
    configs/score/<format>.yaml is another format's preset and holds only what it changes. The fields are
    the presets' keys and, where `flag`, judge-score's flags."""

    mode: Mode = _option("generate", "generate: feedback and parsed scores, with the score's distribution; "
                                     "logits: one forward pass, the score distribution only")
    max_new_tokens: int = _option(1024, "longest feedback in tokens", minimum=1)
    token_budget: int | None = _option(
        None, "tokens of KV cache for decoding, batch size x (longest prompt + new tokens); prefill groups hold at most "
              "this many too; none: on a GPU what its free memory holds, on a CPU 65536", minimum=1)
    image_token_budget: int | None = _option(
        None, "image tokens per sample before tiles, then whole images, are cut; none: no limit", minimum=0)
    prompt_token_budget: int | None = _option(
        None, "tokens per prompt before the question's oldest context is cut; none: no limit", minimum=1)
    max_tiles: int | None = _option(None, "tiles per image before the thumbnail; none: the checkpoint's max_dynamic_patch", minimum=1,
                                    below=MAX_TILES + 1)
    workers: int = _option(4, "background threads that decode and tile images", minimum=1)
    structured: bool = _option(
        False, "constrain the judge's answer with a grammar to the layout its rubric asks for: free text, then one line per criterion "
               "and a '### Score' line, every score on the rubric's scale, so that each score written parses (judge-score records it in summary.json); "
               "off: the judge writes freely, as MMIE's protocol has it")
    deterministic: bool | None = _option(
        None, "score each sample to the same bits whatever is batched beside it: each prompt prefilled in a group of its own, and "
              "batch-invariant matrix products in decoding (Triton kernels, on a CUDA GPU); off: prompts prefilled in groups, and in "
              "bf16 a sample's answer may change with what is batched beside it; none: on wherever its kernels run")
    prefix_cache: int | None = _option(
        None, "tokens of keys and values kept of prompts' parts before their first answer (the rubric, the question and its images), "
              "so that the answers to one question (a GRPO group, a pair's two orders) prefill that part once; each such prompt is "
              "prefilled in two pieces cut there, cached or not, so a cached part gives the same bits as a fresh one; the least recently "
              "used leaves first; 0: off, every prompt prefilled whole; none: for judge-serve's reward endpoints (an RL group's "
              "answers) what 6 GiB of the judge's keys and values hold (InternVL2-4B's 16,384 tokens), on a GPU half of what its "
              "memory free beside the weights holds, and off elsewhere (a prompt prefilled whole, as MMIE's reference prefills it)", minimum=0, below=MAX_PREFIX_CACHE + 1)
    ignore_stop: bool = _option(False, "always generate max_new_tokens, no forced score heading (benchmarks: equal work per sample)",
                                flag=False)
    # Pairs (judge/preferences.py says how a pair's verdict is decided): PAIR_OPTIONS.
    pair_rule: Rule = _option("agree", "a pairwise judge's final verdict from its two orders - agree: the verdict both orders give, "
                                       "else a tie (MT-Bench's rule); mean_probability: the likeliest of the orders' mean verdict distribution")
    tie_margin: float = _option(0.5, "a pointwise judge's tie: answers whose expected scores differ by this much or less", minimum=0)
    samples: int = _option(1, "judgements of each pair in each order; above 1 they are sampled at temperature, and an order's verdict "
                              "is their majority (VL-RewardBench's k-sample voting)", minimum=1,
                       below=MAX_SAMPLES + 1)
    temperature: float = _option(1.0, "sampling temperature of the judgements when samples is above 1", minimum=0)
    top_p: float = _option(1.0, "nucleus of the judgements when samples is above 1: each token drawn from the likeliest ones that "
                                "together hold this much probability (VL-RewardBench samples at 0.2); 1: from all")
    seed: int = _option(0, "seed of the sampled judgements; each one's own, from it, the pair's id, the order and the sample", minimum=0)

    def __post_init__(self):
        problems = setting_problems(ScoreOptions, asdict(self))
        if not 0 < self.top_p <= 1:
            problems.append(f"top_p {self.top_p:g} is a share of the probability: give a number above 0 and at most 1")
        if self.samples > 1 and self.temperature == 0:
            problems.append(f"samples {self.samples} at temperature 0 would be {self.samples} copies of one judgement; give a temperature above 0")
        if self.structured and self.mode == "logits":
            problems.append("structured constrains what the judge writes, and --mode logits writes nothing: use --mode generate")
        if self.structured and self.ignore_stop:
            problems.append("structured ends each answer where its grammar ends, and ignore_stop never ends one")
        if problems:
            raise UsageError("invalid scoring options:\n  " + "\n  ".join(problems))


def preset(format_name: str) -> Path | None:
    """What judge-score changes from the defaults for a format unless a config names others: the bundled
    scoring preset of the format's name; None for MMIE, whose options are the defaults."""
    return bundled("score").get(format_name)


# The options that only pairs read: refused where given for single answers, which would silently ignore them.
PAIR_OPTIONS = ("pair_rule", "tie_margin", "samples", "temperature", "top_p", "seed")


def options_for(format_name: str, config: str | Path | None, given: dict, more_problems: Iterable[str] = ()) -> ScoreOptions:
    """The options an input of this format is scored with, by judge-score and by Judge.score alike: the
    format's preset, or `config` (a bundled preset's name or a YAML) where there is one, overridden by the
    values `given` (flags or keyword arguments; None: not given). Every value that cannot work, and the
    caller's `more_problems`, in one UsageError."""
    config = by_name("score", config) if config else preset(format_name)
    values = config_values(ScoreOptions, config, argparse.Namespace(**given))
    if problems := setting_problems(ScoreOptions, values) + list(more_problems):
        raise UsageError(f"invalid scoring options (from {config or 'the defaults'} and the options given):\n  " + "\n  ".join(problems))
    return ScoreOptions(**values)
