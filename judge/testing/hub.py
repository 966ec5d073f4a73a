"""A Hugging Face Hub cache written here, offline, in the layout huggingface_hub documents (its guide
"Understand caching"), so that a checkpoint named by a Hub id loads through the real resolution path:

    <cache>/models--<org>--<name>/
        blobs/<sha256>                                   each file's bytes, once
        refs/<revision>                                  the commit the revision points at
        snapshots/<commit>/<file> -> ../../blobs/<sha256>  relative links, one tree per commit

huggingface_hub names an LFS file's blob by its sha256 and other files by their git blob id; readers only
follow the links, so every blob is named by its sha256 here.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def write_hub_cache(cache_dir: str | Path, repo_id: str, checkpoint: str | Path, revision: str = "main") -> Path:
    """Put the files of the directory `checkpoint` into the cache as `repo_id` at `revision`; returns the
    snapshot directory. The commit id is a hash of the files, so the same files give the same commit."""
    files = sorted(p for p in Path(checkpoint).rglob("*") if p.is_file())
    repo = Path(cache_dir) / ("models--" + repo_id.replace("/", "--"))
    commit = hashlib.sha1(b"".join(str(p.relative_to(checkpoint)).encode() + hashlib.sha256(p.read_bytes()).digest() for p in files)).hexdigest()
    snapshot = repo / "snapshots" / commit
    for file in files:
        data = file.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = snapshot / file.relative_to(checkpoint)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / revision).write_text(commit)  # no newline: huggingface_hub reads the file whole
    return snapshot
