"""The Trainer's checkpoints in --output_dir/checkpoints, as judge-train --resume reads them.

A checkpoint is whole once the Trainer has written its trainer_state.json, which it writes last (after the
weights, the DeepSpeed shards, the optimizer, the scheduler and the random states). A run killed while
saving leaves a newer checkpoint without it: --resume takes the newest whole one and says which it skipped.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

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
