"""The reward load benchmark, small: one request of all the samples and one-sample requests from concurrent
clients answer every sample, with the same rewards."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mmjudge.infer.options import MAX_PREFIX_CACHE
from mmjudge.judge.testing import HANG_S


ROOT = Path(__file__).resolve().parents[2]
BENCHMARK = ROOT / "benchmarks" / "reward_load.py"


@pytest.mark.slow  # it starts judge-serve
def test_the_reward_load_benchmark_answers_every_sample_both_ways_with_the_same_rewards(tmp_path, benchmark_module):
    """With the prefix cache and without it, back to back: every sample answered both ways, with the same rewards.
    Without the cache each way prefills every prompt whole; with it the one-sample requests find the questions'
    shared parts the one request left in the cache and prefill only the rest."""
    out = tmp_path / "figures.json"
    done = subprocess.run([sys.executable, str(BENCHMARK), "--samples", "12", "--clients", "4", "--json", str(out)],
                          capture_output=True, text=True, timeout=HANG_S)
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads(out.read_text())
    assert [run["prefix_cache"] for run in figures["runs"]] == [None, 0] and figures["rewards_differing"] == 0
    # unasked, the tiny judge's cache holds what 6 GiB of its keys and values do (more than MAX_PREFIX_CACHE), not 16,384 tokens
    assert [run["prefix_cache_tokens"] for run in figures["runs"]] == [MAX_PREFIX_CACHE, 0]
    for run in figures["runs"]:
        assert run["batch"]["samples"] == run["one_by_one"]["samples"] == 12 and run["one_by_one"]["failed"] == 0 and run["ratio"] > 0
        assert 0 < run["one_by_one"]["p50_s"] <= run["one_by_one"]["p99_s"]
    cached, whole = figures["runs"]
    assert whole["batch"]["prefill_tokens"] == whole["one_by_one"]["prefill_tokens"]
    assert 0 < cached["one_by_one"]["prefill_tokens"] < cached["batch"]["prefill_tokens"] <= whole["batch"]["prefill_tokens"]
    assert "samples/s" in done.stdout and benchmark_module("reward_load").markdown(figures).count("\n") == 2 + 2 * 2


def test_the_docs_table_is_the_recorded_runs(benchmark_module):
    """docs/rewards.md's 1,024-sample table is markdown() of docs/rewards/reward_load.json, not typed by hand."""
    record = json.loads((ROOT / "docs" / "rewards" / "reward_load.json").read_text())
    page = (ROOT / "docs" / "rewards.md").read_text()
    assert page.split("<!-- reward_load -->\n")[1].split("<!-- /reward_load -->")[0] == benchmark_module("reward_load").markdown(record)
    assert record["rewards_differing"] == 0 and {run["prefix_cache"] for run in record["runs"]} >= {None, 0}


def test_the_docs_groups_table_is_the_recorded_runs(benchmark_module):
    """docs/rewards.md's groups table is groups_markdown() of docs/rewards/reward_groups.json, not typed by hand."""
    record = json.loads((ROOT / "docs" / "rewards" / "reward_groups.json").read_text())
    page = (ROOT / "docs" / "rewards.md").read_text()
    assert page.split("<!-- reward_groups -->\n")[1].split("<!-- /reward_groups -->")[0] == benchmark_module("reward_load").groups_markdown(record)
    assert record["largest_reward_difference"] < 1e-5 and record["prefix_cache"]["prefix_cache"] > 0 == record["no_prefix_cache"]["prefix_cache"]


@pytest.mark.slow  # it starts judge-serve
def test_the_groups_benchmark_prefills_each_groups_shared_part_once_with_the_cache(tmp_path):
    """3 groups of 4 answers, with the prefix cache and without it: the same rewards to float32 rounding, and
    with the cache a group's shared part prefilled once, and its answers' rests together: at most two passes a group
    (fewer where a round of the server takes two groups)."""
    out = tmp_path / "groups.json"
    done = subprocess.run([sys.executable, str(BENCHMARK), "--groups", "3", "--group_size", "4", "--clients", "2", "--json", str(out)],
                          capture_output=True, text=True, timeout=HANG_S)
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads(out.read_text())
    cached, whole = figures["prefix_cache"], figures["no_prefix_cache"]
    assert cached["samples"] == whole["samples"] == 12 and figures["largest_reward_difference"] < 1e-5
    assert cached["prefills"] <= 3 * 2  # per group: the shared part, then the 4 rests in one pass
    assert cached["prefill_tokens"] < whole["prefill_tokens"] and figures["prefill_tokens_ratio"] < 0.5
