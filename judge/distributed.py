"""The end of a multi-process run, shared by judge-score and judge-train."""

from __future__ import annotations

import torch.distributed as dist


def end_process_group() -> None:
    """Tear the process group down before the process exits: a gloo rank that exits with its group alive
    can abort ('terminate called without an active exception') and turn a clean exit into a crash."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
