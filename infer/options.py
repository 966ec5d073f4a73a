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


Mode = Literal["generate", "logits"]


def _option(default, help: str, minimum: int | None = None, flag: bool = True):
    """A ScoreOptions field. `help` is also its flag's; `minimum` is the least whole number that works;
    `flag`: judge-score has a flag of the field's name (the others are for presets and code)."""
    return field(default=default, metadata={"help": help, "minimum": minimum, "flag": flag})


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
    max_tiles: int | None = _option(None, "tiles per image before the thumbnail; none: the checkpoint's max_dynamic_patch", minimum=1)
    workers: int = _option(4, "background threads that decode and tile images", minimum=1)
    ignore_stop: bool = _option(False, "always generate max_new_tokens, no forced score heading (benchmarks: equal work per sample)",
                                flag=False)

    def __post_init__(self):
        if problems := setting_problems(ScoreOptions, asdict(self)):
            raise UsageError("invalid scoring options:\n  " + "\n  ".join(problems))


def preset(format_name: str) -> Path | None:
    """What judge-score changes from the defaults for a format unless a config names others: the bundled
    scoring preset of the format's name; None for MMIE, whose options are the defaults."""
    return bundled("score").get(format_name)


def options_for(format_name: str, config: str | Path | None, given: dict, more_problems: Iterable[str] = ()) -> ScoreOptions:
    """The options an input of this format is scored with, by judge-score and by Judge.score alike: the
    format's preset, or `config` (a bundled preset's name or a YAML) where there is one, overridden by the
    values `given` (flags or keyword arguments; None: not given). Every value that cannot work, and the
    caller's `more_problems`, in one UsageError."""
    config = by_name("score", config) if config else preset(format_name)
    values = config_values(ScoreOptions, config, argparse.Namespace(**given))
    if problems := setting_problems(ScoreOptions, values) + list(more_problems):
        raise UsageError(f"invalid scoring options (from {config or 'the defaults'} and the flags):\n  " + "\n  ".join(problems))
    return ScoreOptions(**values)
