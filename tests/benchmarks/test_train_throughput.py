"""The training benchmark's CPU smoke run, plain and under DeepSpeed ZeRO-2 (world size 1)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("deepspeed", [[], ["--deepspeed", str(ROOT / "configs" / "deepspeed" / "zero2.json")]])
def test_train_benchmark_runs_on_cpu(tmp_path, deepspeed):
    out = tmp_path / "figures.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "train_throughput.py"), "--tiny", "--steps", "2", "--seq_len", "600", "--tiles", "1",
           "--device", "cpu", "--json", str(out), *deepspeed]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads(out.read_text())
    assert figures["seq_len"] == 600 and figures["tokens_per_s"] > 0 and figures["ms_per_step"] > 0
    assert figures["deepspeed"] == (deepspeed[1] if deepspeed else None)
