"""Tiny random judges and synthetic datasets, so tests, the demo and users exercise exactly the loading
path a real checkpoint takes. Command line: `python -m mmjudge.judge.testing --help`."""

from mmjudge.judge.testing.checkpoints import SIZES, Planted, TinySizes, write_native_checkpoint, write_original_checkpoint, write_tokenizer
from mmjudge.judge.testing.hub import write_hub_cache
from mmjudge.judge.testing.synthetic import human_scores, judge_result, write_dataset, write_pairs

# A test waits for what it waits for to happen, or for the process behind it to end; never for a time, which a
# busy machine (a CI runner, eight suites on two cores) turns into a failure. HANG_S bounds only a hang: far
# past any honest run, inside CI's 90 minutes.
HANG_S = 3600.0

__all__ = ["HANG_S", "SIZES", "Planted", "TinySizes", "human_scores", "judge_result", "write_dataset", "write_hub_cache", "write_native_checkpoint",
           "write_original_checkpoint", "write_pairs", "write_tokenizer"]
