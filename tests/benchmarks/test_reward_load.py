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
    assert figures["batch"]["prefill_tokens"] > 0 and figures["one_by_one"]["prefill_tokens"] > 0
    assert 0 < figures["one_by_one"]["p50_s"] <= figures["one_by_one"]["p99_s"]
    assert "samples/s" in done.stdout


def test_the_groups_benchmark_prefills_each_groups_shared_part_once_with_the_cache(tmp_path):
    """3 groups of 4 answers, with the prefix cache and without it: the same rewards to float32 rounding, and
    with the cache a group's shared part prefilled once (its other 3 prompts prefill their rest alone)."""
    out = tmp_path / "groups.json"
    done = subprocess.run([sys.executable, str(BENCHMARK), "--groups", "3", "--group_size", "4", "--clients", "2", "--json", str(out)],
                          capture_output=True, text=True, timeout=HANG_S)
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads(out.read_text())
    cached, whole = figures["prefix_cache"], figures["no_prefix_cache"]
    assert cached["samples"] == whole["samples"] == 12 and figures["largest_reward_difference"] < 1e-5
    assert cached["prefills"] == 3 * (2 + 3)  # per group: the shared part and the first answer's rest, then 3 rests
    assert cached["prefill_tokens"] < whole["prefill_tokens"] and figures["prefill_tokens_ratio"] < 0.5
