"""The suite's markers, kept honest: a test not marked `slow` that starts a training, distributed or demo
run, or a wheel build (tens of seconds each, in the test or in a fixture it sets up) fails, so that
`pytest -m "not slow and not gpu"` stays the quick loop (pyproject.toml registers the markers); and
fixtures that tests of several packages share."""

import os
import sys
import time
from pathlib import Path

import pytest
import torch

# Where there is no GPU, Triton kernels (infer/split_kv_kernels.py) run in Triton's interpreter. Triton reads
# this as triton.language is imported (transformers imports it), so here, before any test module.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# What such a process runs: a module (`-m`), or a console script or launcher by name.
SLOW_MODULES = {"torch.distributed.run", "mmjudge.train.cli", "mmjudge.demo.cli", "mmjudge.serve.cli"}
SLOW_PROGRAMS = {"torchrun", "deepspeed", "judge-train", "judge-demo", "judge-serve", "train_throughput.py"}

_running: list[pytest.Item] = []


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _running.append(item)
    try:
        return (yield)
    finally:
        _running.pop()


def slow_launch(argv: list[str], env) -> str | None:
    """Why starting `argv` (with `env`) makes a test slow, or None."""
    argv = [os.fsdecode(a) for a in argv]
    if {"--help", "--version"} & set(argv):  # a question, not a run
        return None
    modules = {argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "-m"}
    if modules & SLOW_MODULES or {os.path.basename(a) for a in argv[:2]} & SLOW_PROGRAMS:
        return "a training, distributed, server or demo run"
    if "pip" in modules and "wheel" in argv:
        return "a wheel build"
    if env and env.get("WORLD_SIZE", "1") != "1":
        return "a rank of a distributed run"
    return None


def _refuse_unmarked_slow_launches(event: str, args: tuple) -> None:
    if event != "subprocess.Popen" or not _running or _running[-1].get_closest_marker("slow"):
        return
    _, argv, _, env = args
    reason = slow_launch(list(argv) if isinstance(argv, (list, tuple)) else [argv], env)
    if reason:
        raise RuntimeError(f"{_running[-1].nodeid} starts {reason} ({' '.join(map(os.fsdecode, argv))[:200]}): mark it @pytest.mark.slow")


sys.addaudithook(_refuse_unmarked_slow_launches)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny random judge in InternVL2's original format, written once per test module."""
    from mmjudge.judge.testing import write_original_checkpoint  # torch loads here, not when pytest starts

    return write_original_checkpoint(tmp_path_factory.mktemp("ckpt"), seed=0)


@pytest.fixture(scope="module")
def annotated(tmp_path_factory):
    """A synthetic annotated dataset of 12 samples and its images: train.json holds the first 10 records (second
    annotators included), heldout.json the rest, written once per test module."""
    import json

    from mmjudge.judge.testing import write_dataset

    root = tmp_path_factory.mktemp("data")
    records = json.loads(write_dataset(root, 12, seed=2, annotated=True).read_text())
    (root / "train.json").write_text(json.dumps(records[:10]))
    (root / "heldout.json").write_text(json.dumps(records[10:]))
    return root


@pytest.fixture
def wait_for_lines():
    """Waits until a file another process appends to (a journal mid-run) holds at least `n` lines, or that
    process has ended; returns whether the file holds them. No time limit: a busy machine is slow, not wrong."""
    def wait(path: Path, n: int, process) -> bool:
        def holds() -> bool:
            return path.exists() and len(path.read_text().splitlines()) >= n

        while not holds() and process.poll() is None:
            time.sleep(0.05)
        return holds()
    return wait
