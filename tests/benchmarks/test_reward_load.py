"""The reward load benchmark, small: one request of all the samples and one-sample requests from concurrent
clients answer every sample, with the same rewards."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mmjudge.judge.testing import HANG_S

pytestmark = pytest.mark.slow  # it starts judge-serve

BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "reward_load.py"


def test_the_reward_load_benchmark_answers_every_sample_both_ways_with_the_same_rewards(tmp_path):
    out = tmp_path / "figures.json"
    done = subprocess.run([sys.executable, str(BENCHMARK), "--samples", "12", "--clients", "4", "--json", str(out)],
                          capture_output=True, text=True, timeout=HANG_S)
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads(out.read_text())
    assert figures["batch"]["samples"] == figures["one_by_one"]["samples"] == 12 and figures["one_by_one"]["failed"] == 0
    assert figures["rewards_differing"] == 0 and figures["ratio"] > 0
    assert 0 < figures["one_by_one"]["p50_s"] <= figures["one_by_one"]["p99_s"]
    assert "samples/s" in done.stdout
