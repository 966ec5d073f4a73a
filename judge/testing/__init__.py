"""Tiny random judges and synthetic datasets, so tests, the demo and users exercise exactly the loading
path a real checkpoint takes. Command line: `python -m judge.testing --help`."""

from judge.testing.checkpoints import SIZES, TinySizes, write_native_checkpoint, write_original_checkpoint, write_tokenizer
from judge.testing.hub import write_hub_cache
from judge.testing.synthetic import human_scores, judge_result, write_dataset

__all__ = ["SIZES", "TinySizes", "human_scores", "judge_result", "write_dataset", "write_hub_cache", "write_native_checkpoint", "write_original_checkpoint", "write_tokenizer"]
