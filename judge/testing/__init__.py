"""Tiny random judges and synthetic datasets, so tests, the demo and users exercise exactly the loading
path a real checkpoint takes. Command line: `python -m mmjudge.judge.testing --help`."""

from mmjudge.judge.testing.checkpoints import SIZES, Planted, TinySizes, write_native_checkpoint, write_original_checkpoint, write_tokenizer
from mmjudge.judge.testing.hub import write_hub_cache
from mmjudge.judge.testing.synthetic import human_scores, judge_result, write_dataset, write_pairs

__all__ = ["SIZES", "Planted", "TinySizes", "human_scores", "judge_result", "write_dataset", "write_hub_cache", "write_native_checkpoint",
           "write_original_checkpoint", "write_pairs", "write_tokenizer"]
