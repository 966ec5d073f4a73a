"""Checkpoints named by a Hugging Face Hub id (`OpenGVLab/InternVL2-4B`), resolved through huggingface_hub's
cache, as transformers resolves them: a local directory of the same name wins; otherwise the id's files at
`revision` come from the cache (`HF_HOME`, `HF_HUB_CACHE`), fetched first where missing unless
`HF_HUB_OFFLINE` is set, with huggingface_hub's progress bars.

Only the files the caller names are fetched (huggingface_hub's allow patterns): the loader names what it
reads, so a checkpoint's own Python code and pickled `.bin` weights never reach the disk. The cache keeps
each revision in `models--org--name/snapshots/<commit>/`, so the directory returned is pinned to a commit.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import constants, snapshot_download
from huggingface_hub.errors import (
    GatedRepoError,
    HFValidationError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import validate_repo_id

from mmjudge.judge.data import UsageError


@dataclass(frozen=True)
class Checkpoint:
    """Where a checkpoint's files are, and how others should name it: a local directory by its path, a
    Hub checkpoint by its id at the commit that was resolved."""

    path: Path
    hub_id: str | None = None
    commit: str | None = None


def resolve(name: str | Path, revision: str | None, allow_patterns: Sequence[str]) -> Checkpoint:
    """The checkpoint `name` names: a local directory, or else a Hub id whose files matching
    `allow_patterns` are fetched into the cache (or found there) at `revision` (default: main)."""
    repo_id = str(name)
    if problem := name_problem(repo_id):
        raise UsageError(problem)
    if Path(repo_id).is_dir():
        if revision is not None:
            print(f"note: {repo_id} is a local directory and is used as it is; revision {revision} applies to Hub ids only", file=sys.stderr)
        return Checkpoint(Path(repo_id))
    revision = revision or constants.DEFAULT_REVISION
    try:
        # Offline, the cache alone, said outright: huggingface_hub before 2.0 still lists a commit id's files
        # on the Hub when HF_HUB_OFFLINE is set, and fails there.
        snapshot = Path(snapshot_download(repo_id, revision=revision, allow_patterns=list(allow_patterns),
                                          local_files_only=constants.HF_HUB_OFFLINE))
    except GatedRepoError:
        raise UsageError(f"{repo_id}: a gated model on the Hugging Face Hub; accept its terms on its page, then log in with `hf auth login`") from None
    except RepositoryNotFoundError:
        raise UsageError(f"{repo_id}: no local directory of that name, and no model of that id on the Hugging Face Hub "
                         "(a private one needs `hf auth login`)") from None
    except RevisionNotFoundError:
        raise UsageError(f"{repo_id}: the Hugging Face Hub has no revision {revision!r} of it") from None
    except LocalEntryNotFoundError as err:  # offline, or the Hub unreachable, and the cache lacks it
        fix = f"`hf download {repo_id} --revision {revision}` where the Hub is reachable, into the same cache"
        if constants.HF_HUB_OFFLINE:
            why, fix = "HF_HUB_OFFLINE is set", f"unset HF_HUB_OFFLINE to fetch it, or {fix}"
        else:
            why = f"the Hub could not be reached: {type(err.__cause__ or err).__name__}"
        raise UsageError(f"{repo_id}: no local directory of that name, and revision {revision} of that Hub id is not (fully) in the "
                         f"Hugging Face cache {constants.HF_HUB_CACHE} ({why}); {fix}") from None
    damaged(repo_id, revision, snapshot)
    if os.environ.get("RANK", "0") == "0":  # under torchrun, once
        print(f"{repo_id} (revision {revision}): {snapshot}", file=sys.stderr)
    return Checkpoint(snapshot, repo_id, snapshot.name)


def name_problem(name: str) -> str | None:
    """What is wrong with a checkpoint's name that needs no Hub to tell (None: a local directory, or an id the Hub
    may hold): it names nothing here and cannot be a Hub id."""
    if not name:
        return "an empty checkpoint name: give a local directory or a Hugging Face Hub id (org/name)"
    if Path(name).is_dir():
        return None
    try:
        validate_repo_id(name)
    except HFValidationError:
        return f"{name}: not a local directory, nor a Hugging Face Hub id (org/name)"
    return None


def damaged(repo_id: str, revision: str, snapshot: Path) -> None:
    """Refuses a cache entry that huggingface_hub returns without a word, but that is no checkpoint folder:
    an empty refs file (the path of the snapshots folder itself) or a snapshot that is a file."""
    fix = f"remove it and fetch {repo_id} again (`hf download {repo_id} --revision {revision}`)"
    if snapshot.name == "snapshots":
        raise UsageError(f"{snapshot.parent / 'refs' / revision}: names no commit (an empty file in the Hugging Face cache); {fix}")
    if not snapshot.is_dir():
        raise UsageError(f"{snapshot}: a file where the Hugging Face cache keeps the folder of revision {revision}; {fix}")
