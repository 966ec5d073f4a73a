"""judge-score's local backend: the judge loaded here, on this rank's device, as a LoadedJudge
(infer/loaded.py), scoring through its `score_batches`, as the Python API's `Judge` does (one engine for
both doors); under `torchrun` each rank scores its share of the samples (infer/run.py shards them)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

from mmjudge.infer.batch_invariant import deterministic_on
from mmjudge.infer.engine import read_tokens
from mmjudge.infer.loaded import LoadedJudge, checked_device, default_device, find_checkpoint
from mmjudge.infer.options import ScoreOptions
from mmjudge.infer.progress import Bar, quiet_library_bars
from mmjudge.judge.data import JudgeResult, Pair, PairResult, Sample
from mmjudge.judge.identity import weights_fingerprint
from mmjudge.judge.checkpoint import JudgeSettings
from mmjudge.judge.model import judge_tokenizer, weight_files, with_max_tiles
from mmjudge.judge.prompts import Rubric


class LocalBackend:
    """Finds the checkpoint, reads its weights' fingerprint and checks the device when made; loads the judge in
    `load`."""

    def __init__(self, args, options: ScoreOptions, rubrics: dict[str, Rubric], rank: int):
        self.device = checked_device(args.device or default_device(), options.deterministic)
        self.deterministic = deterministic_on(self.device, options.deterministic)
        self.model_dir = find_checkpoint(args.model_path, args.revision).path
        self.judge_fingerprint = weights_fingerprint(weight_files(self.model_dir))
        if options.mode == "logits":  # what the judge's tokenizer cannot read is refused before its weights load
            read_tokens(judge_tokenizer(self.model_dir), rubrics, options.mode)
        self.dtype = args.dtype
        self.options, self.rubrics, self.image_root, self.rank = options, rubrics, Path(args.input_dir), rank

    def load(self) -> dict:
        """The judge loaded; what of it must be unchanged for a journal's results to be resumed: the
        checkpoint's files (a Hub id's cache snapshot, whose path names its commit), dtype and settings."""
        quiet_library_bars()
        self.judge = LoadedJudge.at(self.model_dir, self.device, self.dtype, self.judge_fingerprint)
        model = self.judge.model
        model.settings = with_max_tiles(model.settings, self.options.max_tiles)
        return journal_settings(self.model_dir, str(next(model.model.parameters()).dtype), model.settings, self.options, self.deterministic)

    def score(self, samples: list[tuple[int, Sample | Pair]], bar: Callable[[str], Bar]) -> Iterator[list[JudgeResult | PairResult]]:
        yield from self.judge.score_batches(samples, self.rubrics, self.options, self.image_root, progress=bar)

    def warnings(self, results: list[JudgeResult]) -> list[str]:
        return []

    def close(self) -> None:
        pass


def journal_settings(model_dir: Path, dtype: str, settings: JudgeSettings, options: ScoreOptions, deterministic: bool) -> dict:
    """What of a judge a journal's results depend on (LocalBackend.load's, and judge-score --ray's, whose actors load the
    same judge, so that either resumes the other's journal): the checkpoint's files (a Hub id's cache snapshot, whose
    path names its commit), dtype (torch's name) and settings."""
    model_dir = model_dir.resolve()
    weights = sorted((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in model_dir.iterdir() if f.is_file())
    return {"model": str(model_dir), "weights": weights, "dtype": dtype, "settings": settings.to_json(),
            "prompt_token_budget": options.prompt_token_budget, "ignore_stop": options.ignore_stop, "structured": options.structured,
            # only where it is on, so that the journals of runs without it stay resumable; the prefix cache's prompts are
            # prefilled in two pieces (their last bits not those of a whole prefill), whatever its size
            **({"deterministic": True} if deterministic else {}), **({"prefix_cache": True} if options.prefix_cache else {})}
