"""Which judge and which rubric a score came from, as fingerprints: judge-score writes them into every record
(`judge_fingerprint`, `rubric_fingerprint`), judge-calibrate copies them into calibrator.json, and judge-score
--calibrator compares them with its own, so that a map fitted on one judge's scores is not applied to
another's unnoticed (infer/run.py).

A judge's fingerprint is read from its weights' files without loading them: every tensor of the checkpoint's
safetensors files (and, for a LoRA adapter, of its base's), by name, dtype and shape, and its
bytes: the whole tensor up to SLICES x SLICE bytes, else SLICES slices of SLICE bytes spread evenly over it,
its first and last bytes included. That reads a few MB of a 4B-parameter judge instead of hashing 8 GB at each
start, and tells apart what training makes: a trained tensor changes throughout, so a trained judge and its
base differ. A copy of a checkpoint, moved, renamed or resharded, keeps its fingerprint; the same weights
saved in another layout (original InternVL2 format or transformers' native one) or dtype do not. It is a
fingerprint, not a checksum: a change confined to bytes it does not read goes unseen.

A rubric's fingerprint is its content: prompt, criteria, scale.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from pydantic import BaseModel

SLICES, SLICE = 64, 1024
LENGTH = 16  # hex digits kept: 64 bits, ample to tell a handful of judges apart


def weights_fingerprint(files: list[Path]) -> str:
    """The fingerprint of the weights in these safetensors files (a checkpoint's shards; an adapter's and its
    base's), checked whole beforehand (judge.model.weight_files)."""
    tensors = {}  # name -> (file, where its data starts, its header entry): one order however the weights are sharded
    for file in files:
        with file.open("rb") as f:
            size = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(size))
        tensors.update({name: (file, 8 + size, entry) for name, entry in header.items() if name != "__metadata__"})
    digest = hashlib.sha256(f"{len(tensors)} tensors\n".encode())
    handles = {}
    try:
        for name in sorted(tensors):
            file, data, entry = tensors[name]
            f = handles.get(file) or handles.setdefault(file, file.open("rb"))
            start, end = entry["data_offsets"]
            digest.update(json.dumps([name, entry["dtype"], entry["shape"]]).encode())
            for offset in _slice_starts(end - start):
                f.seek(data + start + offset)
                digest.update(f.read(min(SLICE, end - start - offset)))
    finally:
        for f in handles.values():
            f.close()
    return digest.hexdigest()[:LENGTH]


def _slice_starts(size: int) -> list[int]:
    """Where the slices of a tensor of `size` bytes start: all of it when small, else SLICES spread evenly."""
    if size <= SLICES * SLICE:
        return list(range(0, size, SLICE))
    return [round(k * (size - SLICE) / (SLICES - 1)) for k in range(SLICES)]


def rubric_fingerprint(rubric: BaseModel) -> str:
    return hashlib.sha256(json.dumps(rubric.model_dump(mode="json"), sort_keys=True).encode()).hexdigest()[:LENGTH]


def stamp(results: list, judge_fingerprint: str | None, rubrics: dict[str, BaseModel]) -> list:
    """The results (judge.data.JudgeResult), each with the fingerprints of the judge and of its category's rubric."""
    # of the results' categories only: a server stamps each request's few results, and hashing every rubric it has each time cost more
    fingerprints = {category: rubric_fingerprint(rubrics[category]) for category in {r.category for r in results}}
    for r in results:
        r.judge_fingerprint, r.rubric_fingerprint = judge_fingerprint, fingerprints[r.category]
    return results
