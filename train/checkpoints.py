"""The Trainer's checkpoints in --output_dir/checkpoints, as judge-train --resume reads them.

A checkpoint is whole once the Trainer has written its trainer_state.json, which it writes last (after the
weights, the DeepSpeed shards, the optimizer, the scheduler and the random states). A run killed while
saving leaves a newer checkpoint without it: --resume takes the newest whole one and says which it skipped.

Its optimizer, scheduler, random states and DeepSpeed shards are pickles, and DeepSpeed unpickles its own
with any globals (torch.load(weights_only=False)): an object planted in one, by anyone who can write to
--output_dir (shared storage, by the README's advice), ran code on every node on --resume. Every command
forces weights-only loading process-wide (mmjudge.judge.cli.run), which reads tensors and plain data and refuses any
other global; `allow_checkpoint_types` adds the few types DeepSpeed's checkpoints hold. Before the model
loads, `unsafe_pickles` lists the globals of every pickle in the checkpoint, so that a planted one is named
with its file, not found half-way through a resume.
"""

from __future__ import annotations

import json
import re
import zipfile
from pathlib import Path

import torch

from mmjudge.judge.data import InputError, read_json
from mmjudge.judge.outputs import LOCK_FILE, overwritten_inputs
from mmjudge.train.config import CHECKPOINTS_DIR

TRAINER_STATE = "trainer_state.json"
_STEP = re.compile(r"^checkpoint-(\d+)$")


def resume_point(checkpoints: Path) -> tuple[Path | None, list[str]]:
    """The newest whole checkpoint (None if there is none), and a line for each newer one skipped."""
    found = sorted(((int(m.group(1)), p) for p in checkpoints.iterdir() if p.is_dir() and (m := _STEP.match(p.name))), reverse=True)
    skipped = []
    for step, path in found:
        if (reason := _unfinished(path, step)) is None:
            return path, skipped
        skipped.append(f"{path.name} was not saved whole ({reason}: a run stopped while saving it)")
    return None, skipped


def _unfinished(path: Path, step: int) -> str | None:
    state = path / TRAINER_STATE
    if not state.is_file():
        return f"no {TRAINER_STATE}"
    try:
        saved = json.loads(state.read_text(encoding="utf-8")).get("global_step")
    except (ValueError, AttributeError):  # torn mid-write, or no JSON object
        return f"{TRAINER_STATE} is cut short"
    return None if saved == step else f"{TRAINER_STATE} says step {saved}"


def allow_checkpoint_types() -> None:
    """Let weights-only loading read what DeepSpeed's own checkpoints hold besides tensors: its loss scaler,
    the ZeRO stage, and ZeRO-1/2's fragment addresses. The list is what real checkpoints hold (ZeRO-2, ZeRO-3
    and ZeRO-3 offload, saved by judge-train and their pickles' globals listed); a bf16 run holds the same
    static loss scaler. Without DeepSpeed installed there is none to allow."""
    try:
        from deepspeed.runtime.fp16.loss_scaler import LossScaler
        from deepspeed.runtime.zero.config import ZeroStageEnum
        from deepspeed.utils.tensor_fragment import fragment_address
    except ImportError:
        return
    torch.serialization.add_safe_globals([LossScaler, ZeroStageEnum, fragment_address])


def _outside_tag(checkpoint: Path) -> list[str]:
    """DeepSpeed loads its shards from the folder its `latest` file names, read as a path: one that names
    anything but a folder of this checkpoint would load pickles this scan never saw."""
    latest = checkpoint / "latest"
    if not latest.is_file():
        return []
    tag = latest.read_bytes().decode("utf-8", errors="replace").strip()
    if tag in ("", ".", "..") or Path(tag).name != tag or not (checkpoint / tag).is_dir():
        return [f"{latest}: names {tag[:200]!r}, not a folder of this checkpoint; DeepSpeed would load its shards from there (was it planted?)"]
    return []


def unsafe_pickles(checkpoint: Path) -> list[str]:
    """One problem for each pickle of the checkpoint (`*.pt`, `*.pth`) that holds a global weights-only
    loading refuses, read from the pickle's opcodes without running any. (training_args.bin, which the
    Trainer writes and never reads back, is not looked at.)"""
    from transformers.trainer_pt_utils import safe_globals  # the numpy types of the random states, as the Trainer allows them

    allow_checkpoint_types()
    problems = _outside_tag(checkpoint)
    with safe_globals():
        for file in sorted(p for p in checkpoint.rglob("*") if p.suffix in (".pt", ".pth") and p.is_file()):
            try:
                found = torch.serialization.get_unsafe_globals_in_checkpoint(file)
            except (ValueError, RuntimeError, zipfile.BadZipFile) as err:  # not the zip archive torch.save writes
                problems.append(f"{file}: not a checkpoint as torch.save writes it ({err}); refused, since unpickling it could run code")
                continue
            if found:
                problems.append(f"{file}: holds pickled {', '.join(sorted(found))}, which no checkpoint of judge-train holds; "
                                "refused, since unpickling it could run any code (was it planted?)")
    return problems


def run_problems(out: Path, resume: bool, deepspeed: str | None, inputs: list[tuple[str, str | Path | None]]) -> list[str]:
    """What --deepspeed, --resume and --output_dir ask that cannot work; `inputs` are the run's input files
    by flag, none of which may lie where the run writes.

    A fresh run needs a new or empty --output_dir: an earlier run's files would outlive it (after a
    --full_finetune run, judge-score would load the earlier LoRA adapter), and its checkpoints would be
    resumed later. Refusing is safer than deleting: a mistyped directory costs a message, not a judge.
    Every rank checks before any writes there: the Trainer writes only once all have joined the process group."""
    problems = []
    if deepspeed:
        try:
            read_json(deepspeed)
        except InputError as err:
            problems += [f"--deepspeed {problem}" for problem in err.problems]
    checkpoints = out / CHECKPOINTS_DIR
    if resume:
        checkpoint, skipped = resume_point(checkpoints) if checkpoints.is_dir() else (None, [])
        if checkpoint is None:
            problems.append(f"--resume: nothing to resume in {out}: no checkpoint saved whole in {checkpoints}"
                            + "".join(f"; {line}" for line in skipped) + "; drop --resume to start a fresh run in a new or empty --output_dir")
        else:
            problems += [f"--resume: {problem}" for problem in unsafe_pickles(checkpoint)]
    if not resume and out.is_dir() and any(p.name != LOCK_FILE for p in out.iterdir()):
        problems.append(f"--output_dir {out} is not empty (an earlier run?); give a new or empty directory, or --resume to continue that run")
    # Everything in --output_dir is the run's: an input there could be overwritten by a checkpoint or the judge.
    return problems + overwritten_inputs(out, ["**"], inputs)
