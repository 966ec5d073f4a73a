"""A judge loaded once on a device, scoring through the engine (infer/engine.py): what judge-score's local
backend, judge-serve and the Python API (mmjudge/api.py, a door over this) load and score with, and how
each finds the checkpoint and checks the device before any weights load."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from mmjudge.judge.data import JudgeResult, Pair, PairResult, Sample, UsageError

if TYPE_CHECKING:
    import torch

    from mmjudge.infer.options import ScoreOptions
    from mmjudge.infer.progress import Bar
    from mmjudge.judge.hub import Checkpoint
    from mmjudge.judge.model import Judge as Model
    from mmjudge.judge.prompts import Rubric

DTYPES = ("bfloat16", "float16", "float32")


@dataclass
class LoadedJudge:
    """A judge's network on its device: `path` (the checkpoint's folder), `model` (judge.model.Judge: the
    network, its tokenizer and settings), `device`, `fingerprint` (of its weights, judge/identity.py)."""

    path: Path
    model: Model
    device: str
    fingerprint: str | None

    @classmethod
    def load(cls, model_path: str | Path, device: str | None = None, dtype: str | torch.dtype | None = None,
             revision: str | None = None, deterministic: bool | None = None) -> LoadedJudge:
        """The checkpoint found, the device checked and the weights fingerprinted, then loaded."""
        from mmjudge.judge.identity import weights_fingerprint
        from mmjudge.judge.model import weight_files

        dtype_named(dtype)  # refused before anything is read
        device = checked_device(device or default_device(), deterministic)
        path = find_checkpoint(model_path, revision).path
        return cls.at(path, device, dtype, weights_fingerprint(weight_files(path)))

    @classmethod
    def at(cls, path: Path, device: str, dtype: str | torch.dtype | None, fingerprint: str | None) -> LoadedJudge:
        """The judge of a checkpoint already found, on a device already checked."""
        from mmjudge.judge.model import load_judge

        return cls(path, load_judge(path, device, dtype_named(dtype)), device, fingerprint)

    def score_batches(self, samples: list[tuple[int, Sample | Pair]], rubrics: dict[str, Rubric], options: ScoreOptions,
                      input_dir: str | Path, progress: bool | Callable[[str], Bar] = False, source: str = "samples"
                      ) -> Iterator[list[JudgeResult | PairResult]]:
        """The engine on samples (or pairs) already checked, each with its index in the input: their results a
        batch at a time as they finish, in no set order. A prompt past the judge's context is refused (InputError
        naming its record of `source`, the input's file) before any is scored. `progress`: bars of these samples
        on stderr, or none; or what makes each bar (judge-score's count every rank's samples)."""
        from mmjudge.infer.engine import prepare, refuse_past_context
        from mmjudge.infer.progress import Bar, counted
        from mmjudge.infer.reward_model import scorer_for
        from mmjudge.judge.rope import context_length

        bar = progress if callable(progress) else (lambda what: Bar(what, len(samples), show=progress))
        scorer = scorer_for(self.model, rubrics, options, self.device)
        with bar("preparing") as preparing:
            items = prepare(self.model, counted(samples, preparing), rubrics, Path(input_dir), options)
        refuse_past_context(items, context_length(self.model.model.config.get_text_config()), source)
        with bar("scoring") as scoring:  # moved by every token written, so that a batch of all the samples moves it too
            for batch in scorer.judged(items, progress=scoring.update):
                yield [result for _, result in batch]


def dtype_named(dtype: str | torch.dtype | None) -> torch.dtype | None:
    """A dtype given by name (--dtype) as torch's; None: the device's default."""
    import torch

    if isinstance(dtype, str) and dtype not in DTYPES:
        raise UsageError(f"--dtype {dtype}: one of {', '.join(DTYPES)}")
    return getattr(torch, dtype) if isinstance(dtype, str) else dtype


def find_checkpoint(name: str | Path, revision: str | None, flag: str = "--model_path") -> Checkpoint:
    """The checkpoint `name` names (judge.hub.Checkpoint: a local folder, or a Hub id's files fetched into
    the cache); where it names none, the error names its flag."""
    from mmjudge.judge.model import find_checkpoint as find

    try:
        return find(name, revision)
    except UsageError as err:
        raise UsageError(_flagged(flag, name, str(err))) from None


def checkpoint_name_problem(name: object, flag: str = "--model_path") -> str | None:
    """What find_checkpoint would refuse in `name` without asking the Hub (a wrong type, nothing here by that name
    that could be a Hub id), named by its flag; None where only the Hub (or its cache) can tell."""
    from mmjudge.judge.hub import name_problem

    if not isinstance(name, (str, Path)):
        return f"{flag}: give a local directory or a Hugging Face Hub id (a str or Path), not {type(name).__name__}"
    problem = name_problem(str(name))
    return _flagged(flag, name, problem) if problem else None


def _flagged(flag: str, name: str | Path, message: str) -> str:
    return f"{flag} {message}" if name and message.startswith(f"{name}: ") else f"{flag} {name}: {message}" if name else f"{flag}: {message}"


def default_device() -> str:
    import torch

    return f"cuda:{os.environ.get('LOCAL_RANK', '0')}" if torch.cuda.is_available() else "cpu"


def checked_device(device: str, deterministic: bool | None = None) -> str:
    """The device, refused before anything loads where torch cannot use it, or where a `deterministic` run's
    kernels cannot run (Triton's, on a CUDA GPU: infer/batch_invariant.py)."""
    import torch

    from mmjudge.infer.batch_invariant import triton_runs_on

    try:
        parsed = torch.device(device)
    except RuntimeError:
        raise UsageError(f"--device {device}: not a device; give cpu, cuda or cuda:N") from None
    if parsed.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"--device {device}: torch sees no CUDA GPU here (use --device cpu, or a CUDA build of torch)")
    if parsed.type == "cuda" and parsed.index is not None and parsed.index >= torch.cuda.device_count():
        raise UsageError(f"--device {device}: torch sees {torch.cuda.device_count()} GPU(s), numbered from 0")
    if deterministic and not triton_runs_on(parsed):
        where = "Triton is not installed (it comes with PyTorch's CUDA builds)" if parsed.type == "cuda" else f"--device {device} is not a CUDA GPU"
        raise UsageError(f"--deterministic runs batch-invariant Triton kernels on a CUDA GPU, and {where}; "
                         "leave --deterministic out to score here")
    return device
