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

A checkpoint also holds `data_order.json`, written here: the RNG state the order of the epoch in progress
was drawn from (train.data.EpochOrder), plain JSON, so that a resume part-way through any epoch sees the
rest of that epoch in the order the run it resumes saw.
"""

from __future__ import annotations


import base64
import binascii
import importlib.util
import json
import os
import re
import reprlib
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

from mmjudge.judge.data import write_json_atomically

if TYPE_CHECKING:
    import torch  # loaded where used: judge-train's command line imports this before torch's threads are chosen (judge/cpu.py)

from mmjudge.judge.data import InputError, read_json
from mmjudge.judge.outputs import LOCK_FILE, overwritten_inputs
from mmjudge.train.config import CHECKPOINTS_DIR

TRAINER_STATE = "trainer_state.json"
DATA_ORDER = "data_order.json"
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


def write_data_order(checkpoint: Path, drawn: tuple[int, torch.Tensor]) -> None:
    epoch, rng_state = drawn
    write_json_atomically(checkpoint / DATA_ORDER, {"epoch": epoch, "rng_state": base64.b64encode(rng_state.numpy().tobytes()).decode("ascii")})


def read_data_order(checkpoint: Path) -> tuple[int, torch.Tensor] | None:
    """The epoch in progress at the checkpoint and the RNG state its order was drawn from; None where the
    checkpoint holds none (saved before judge-train wrote one). Anything else than what write_data_order
    writes is a CheckpointError naming the file."""
    import torch

    from mmjudge.judge.checkpoint import CheckpointError

    file = checkpoint / DATA_ORDER
    if not file.is_file():
        return None
    state_bytes = torch.get_rng_state().numel()
    if file.stat().st_size > 2 * state_bytes:  # its base64 and an epoch number: a bigger file is not one
        raise CheckpointError(f"{file}: {file.stat().st_size:,} bytes, not the data order judge-train writes (about {state_bytes * 4 // 3:,})")
    try:
        saved = json.loads(file.read_bytes())
        epoch, rng_state = saved["epoch"], base64.b64decode(saved["rng_state"], validate=True)
    except (ValueError, TypeError, KeyError, binascii.Error):
        raise CheckpointError(f"{file}: not the data order judge-train writes ({{\"epoch\": N, \"rng_state\": base64}}); "
                              "resume from an earlier checkpoint, or delete the file to draw the rest of this epoch afresh") from None
    if type(epoch) is not int or epoch < 0 or len(rng_state) != state_bytes:
        raise CheckpointError(f"{file}: epoch must be a whole number of at least 0 and rng_state {state_bytes:,} bytes, "
                              f"got {reprlib.repr(epoch)} and {len(rng_state):,} bytes")
    return epoch, torch.frombuffer(bytearray(rng_state), dtype=torch.uint8)


def data_order_problems(checkpoint: Path) -> list[str]:
    from mmjudge.judge.checkpoint import CheckpointError

    try:
        read_data_order(checkpoint)
    except CheckpointError as err:
        return [str(err)]
    return []


def allow_checkpoint_types() -> None:
    """Let weights-only loading read what DeepSpeed's own checkpoints hold besides tensors: its loss scaler,
    the ZeRO stage, and ZeRO-1/2's fragment addresses. The list is what real checkpoints hold (ZeRO-2, ZeRO-3
    and ZeRO-3 offload, saved by judge-train and their pickles' globals listed); a bf16 run holds the same
    static loss scaler. Without DeepSpeed installed there is none to allow."""
    import torch

    try:
        from deepspeed.runtime.fp16.loss_scaler import LossScaler
        from deepspeed.runtime.zero.config import ZeroStageEnum
        from deepspeed.utils.tensor_fragment import fragment_address
    except ImportError:
        return
    torch.serialization.add_safe_globals([LossScaler, ZeroStageEnum, fragment_address])


def _outside_tag(checkpoint: Path) -> list[str]:
    """DeepSpeed loads its shards from the folder its `latest` file names, read as a path: one that names
    anything but a folder of this checkpoint, or a folder here that is a link to elsewhere, would load
    pickles from outside the checkpoint."""
    latest = checkpoint / "latest"
    if not latest.is_file():
        return []
    with latest.open("rb") as f:  # a tag is a folder's name: a few bytes, whatever the file's size
        tag = f.read(4096).decode("utf-8", errors="replace").strip()
    folder = (checkpoint / tag).resolve()
    if tag in ("", ".", "..") or Path(tag).name != tag or not folder.is_dir() or folder.parent != checkpoint.resolve():
        return [f"{latest}: names {tag[:200]!r}, not a folder of this checkpoint; DeepSpeed would load its shards from there (was it planted?)"]
    return []


def _files(checkpoint: Path) -> list[Path]:
    """Every file of the checkpoint, behind links too (each folder once): a pickle is loaded through a link."""
    seen, files = set(), []
    for root, folders, names in os.walk(checkpoint, followlinks=True):
        if (real := Path(root).resolve()) in seen:
            folders.clear()
            continue
        seen.add(real)
        files += [Path(root) / name for name in names]
    return sorted(files)


def unsafe_pickles(checkpoint: Path) -> list[str]:
    """One problem for each pickle of the checkpoint (`*.pt`, `*.pth`) that holds a global weights-only
    loading refuses, read from the pickle's opcodes without running any. (training_args.bin, which the
    Trainer writes and never reads back, is not looked at.)"""
    import torch
    from transformers.trainer_pt_utils import safe_globals  # the numpy types of the random states, as the Trainer allows them

    allow_checkpoint_types()
    problems = _outside_tag(checkpoint)
    with safe_globals():
        for file in (p for p in _files(checkpoint) if p.suffix in (".pt", ".pth") and p.is_file()):
            try:
                found = torch.serialization.get_unsafe_globals_in_checkpoint(file)
            except (ValueError, RuntimeError, zipfile.BadZipFile) as err:  # not the zip archive torch.save writes
                problems.append(f"{file}: not a checkpoint as torch.save writes it ({err}); refused, since unpickling it could run code")
                continue
            if found:
                problems.append(f"{file}: holds pickled {', '.join(sorted(found))}, which no checkpoint of judge-train holds; "
                                "refused, since unpickling it could run any code (was it planted?)")
    return problems


def finished_problems(checkpoint: Path, max_steps: int | None, num_epochs: float | None) -> list[str]:
    """A run whose checkpoint is its last step is not trained further by --resume unless the settings ask for
    more steps (max_steps) or epochs: the Trainer ran a step past the end (step 9 of 8) and changed the
    weights the run had saved. None: the settings are not known (their own problems are named)."""
    if max_steps is None or num_epochs is None:
        return []
    try:
        state = json.loads((checkpoint / TRAINER_STATE).read_text(encoding="utf-8"))
        step, last, epoch = state["global_step"], state["max_steps"], float(state["epoch"])
    except (ValueError, TypeError, KeyError):  # an older Trainer's state: left to the Trainer
        return []
    if not isinstance(step, int) or not isinstance(last, int) or step < last or max_steps > step or (max_steps == -1 and num_epochs > epoch):
        return []
    return [f"--resume: the run is finished: {checkpoint.name} is its last step ({step} of {last}, epoch {epoch:g}), and resuming "
            f"would train past it and change the judge it saved; give --max_steps above {step} (or, without --max_steps, more "
            f"--num_epochs than {epoch:g}) to train it further"]


def kind_problem(checkpoint: Path, full_finetune: bool) -> str | None:
    """A checkpoint of the other kind than the run trains (a LoRA adapter, or weights trained in full): None where they agree."""
    adapter = (checkpoint / "adapter_config.json").is_file()
    if adapter != full_finetune:
        return None
    return (f"{checkpoint}: --resume: the checkpoint holds {'a LoRA adapter' if adapter else 'fully fine-tuned weights'}, "
            f"but this run trains {'in full (--full_finetune)' if adapter else 'a LoRA adapter'}; resume with the settings the run started with")


def run_problems(out: Path, resume: bool, deepspeed: str | None, inputs: list[tuple[str, str | Path | None]], max_steps: int | None,
                 num_epochs: float | None, full_finetune: bool | None = None) -> list[str]:
    """What --deepspeed, --resume and --output_dir ask that cannot work; `inputs` are the run's input files
    by flag, none of which may lie where the run writes, `max_steps` and `num_epochs` how long the run is
    to train (a finished run is not resumed past its end unless they ask), and `full_finetune` whether it trains
    in full or a LoRA adapter (a checkpoint of the other kind is refused; None: not known, the settings being wrong).

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
        if importlib.util.find_spec("deepspeed") is None:
            problems.append(f"--deepspeed {deepspeed}: DeepSpeed is not installed here; "
                            "in mmjudge's checkout, pip install --no-build-isolation '.[deepspeed]' (docs/quickstart.md)")
    checkpoints = out / CHECKPOINTS_DIR
    if resume:
        checkpoint, skipped = resume_point(checkpoints) if checkpoints.is_dir() else (None, [])
        if checkpoint is None:
            problems.append(f"--resume: nothing to resume in {out}: no checkpoint saved whole in {checkpoints}"
                            + "".join(f"; {line}" for line in skipped) + "; drop --resume to start a fresh run in a new or empty --output_dir")
        else:
            problems += [f"--resume: {problem}" for problem in unsafe_pickles(checkpoint) + data_order_problems(checkpoint)]
            problems += finished_problems(checkpoint, max_steps, num_epochs)
            if full_finetune is not None and (kind := kind_problem(checkpoint, full_finetune)) is not None:
                problems.append(kind)
    if not resume and out.is_dir() and any(p.name != LOCK_FILE for p in out.iterdir()):
        problems.append(f"--output_dir {out} is not empty (an earlier run?); give a new or empty directory, or --resume to continue that run")
    # Everything in --output_dir is the run's: an input there could be overwritten by a checkpoint or the judge.
    return problems + overwritten_inputs(out, ["**"], inputs)
