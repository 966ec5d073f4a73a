"""Tiny random judges and synthetic datasets, so tests, the demo and users exercise exactly the loading
path a real checkpoint takes. Command line: `python -m mmjudge.judge.testing --help`."""

import importlib

# Where each name lives. They load on first use, so that writing a dataset or pairs (`python -m
# mmjudge.judge.testing dataset`, two of the demo's steps) does not import torch and transformers, as writing a
# checkpoint must: about 4 s of each start.
_HOMES = {
    "SIZES": "checkpoints", "Planted": "checkpoints", "TinySizes": "checkpoints", "write_native_checkpoint": "checkpoints",
    "write_original_checkpoint": "checkpoints", "write_tokenizer": "checkpoints", "write_hub_cache": "hub",
    "human_scores": "synthetic", "judge_result": "synthetic", "write_dataset": "synthetic", "write_pairs": "synthetic",
    "write_verdicts": "synthetic", "write_parquet_copy": "synthetic",
}


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)


# A test waits for what it waits for to happen, or for the process behind it to end; never for a time, which a
# busy machine (a CI runner, eight suites on two cores) turns into a failure. HANG_S bounds only a hang: far
# past any honest run, inside CI's 90 minutes.
HANG_S = 3600.0

__all__ = ["HANG_S", "SIZES", "Planted", "TinySizes", "human_scores", "judge_result", "write_dataset", "write_hub_cache", "write_native_checkpoint",
           "write_original_checkpoint", "write_pairs", "write_parquet_copy", "write_tokenizer"]
