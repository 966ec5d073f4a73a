"""judge-score's local backend: the judge loaded here, on this rank's device, scoring in batches; under
`torchrun` each rank scores its share of the samples (infer/run.py shards them)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from mmjudge.infer.engine import Scorer, prepare
from mmjudge.infer.options import ScoreOptions
from mmjudge.infer.progress import Bar, counted
from mmjudge.judge.data import JudgeResult, Sample, UsageError
from mmjudge.judge.identity import weights_fingerprint
from mmjudge.judge.model import find_checkpoint, load_judge, weight_files, with_max_tiles
from mmjudge.judge.prompts import Rubric


class LocalBackend:
    """Finds the checkpoint and checks the device when made; loads the judge in `load`."""

    def __init__(self, args, options: ScoreOptions, rubrics: dict[str, Rubric], rank: int):
        self.device = checked_device(args.device or default_device())
        self.model_dir = find_checkpoint(args.model_path, args.revision).path
        self.judge_fingerprint = weights_fingerprint(weight_files(self.model_dir))
        self.dtype = getattr(torch, args.dtype) if args.dtype else None
        self.options, self.rubrics, self.image_root, self.rank = options, rubrics, Path(args.input_dir), rank

    def load(self) -> dict:
        """The judge loaded; what of it must be unchanged for a journal's results to be resumed: the
        checkpoint's files (a Hub id's cache snapshot, whose path names its commit), dtype and settings."""
        self.judge = load_judge(self.model_dir, self.device, self.dtype)
        self.judge.settings = with_max_tiles(self.judge.settings, self.options.max_tiles)
        self.scorer = Scorer(self.judge, self.rubrics, self.options, self.device)
        model_dir = self.model_dir.resolve()
        weights = sorted((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in model_dir.iterdir() if f.is_file())
        return {"model": str(model_dir), "weights": weights, "dtype": str(next(self.judge.model.parameters()).dtype),
                "settings": self.judge.settings.to_json(), "prompt_token_budget": self.options.prompt_token_budget,
                "ignore_stop": self.options.ignore_stop}

    def score(self, samples: list[tuple[int, Sample]], bar: Callable[[str], Bar]) -> Iterator[list[JudgeResult]]:
        with bar("preparing") as preparing:
            items = prepare(self.judge, counted(samples, preparing), self.rubrics, self.image_root, self.options)
        with bar("scoring") as scoring:
            for batch in self.scorer.run(items, progress=scoring.update):
                yield [result for _, result in batch]

    def warnings(self, results: list[JudgeResult]) -> list[str]:
        return []

    def close(self) -> None:
        pass


def checked_device(device: str) -> str:
    """The device, refused before anything loads where torch cannot use it."""
    try:
        parsed = torch.device(device)
    except RuntimeError:
        raise UsageError(f"--device {device}: not a device; give cpu, cuda or cuda:N") from None
    if parsed.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"--device {device}: torch sees no CUDA GPU here (use --device cpu, or a CUDA build of torch)")
    if parsed.type == "cuda" and parsed.index is not None and parsed.index >= torch.cuda.device_count():
        raise UsageError(f"--device {device}: torch sees {torch.cuda.device_count()} GPU(s), numbered from 0")
    return device


def default_device() -> str:
    return f"cuda:{os.environ.get('LOCAL_RANK', '0')}" if torch.cuda.is_available() else "cpu"
