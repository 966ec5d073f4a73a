"""The load benchmark of judge-serve, small: it starts the server on loopback, runs each level and stops it."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from mmjudge.judge.testing import HANG_S

# The load benchmark starts judge-serve and sends it requests at three levels of concurrency.
pytestmark = pytest.mark.slow

BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "serve_load.py"


def test_the_load_benchmark_reports_each_level_and_batches_concurrent_clients(tmp_path):
    out = tmp_path / "load.json"
    # The first request of a round waits half a second for the others (the default, 20 ms, is shorter than a
    # client thread takes to start on a busy 2-core machine, where all eight then arrived one by one).
    cmd = [sys.executable, str(BENCHMARK), "--clients", "1", "4", "--requests", "8", "--new_tokens", "3", "--time_limit_s", "120",
           "--serve_flag=--batch_wait_ms=500", "--json", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=HANG_S)
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads(out.read_text())
    alone, together = figures["levels"]
    assert (alone["clients"], together["clients"]) == (1, 4)
    for level in figures["levels"]:
        assert level["requests"] == 8 and level["failed"] == 0 and level["requests_per_s"] > 0
        assert 0 < level["p50_s"] <= level["p90_s"] <= level["p99_s"]
    # one client: a prefill per request and a step per token after its first; four share both
    assert (alone["prefills"], alone["steps"]) == (8, 8 * 2)
    assert together["prefills"] < 8 and together["steps"] < 8 * 2
    assert "req/s" in done.stdout


def test_the_load_benchmark_measures_short_requests_beside_long_prompts_and_a_long_prompt_left_part_way(tmp_path):
    out = tmp_path / "long.json"
    cmd = [sys.executable, str(BENCHMARK), "--clients", "2", "--requests", "4", "--new_tokens", "3", "--time_limit_s", "300",
           "--long_prompt_tokens", "4000", "--cancel_long", "--cancel_after_s", "0", "--serve_flag=--max_num_batched_tokens=64", "--json", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=HANG_S)
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads(out.read_text())
    alone, beside = figures["levels"]
    assert (alone["long_prompt_tokens"], beside["long_prompt_tokens"]) == (None, 4000) and figures["serve_flags"] == ["--max_num_batched_tokens=64"]
    assert alone["requests"] == beside["requests"] == 4 and beside["failed"] == 0
    assert beside["prefill_tokens"] > alone["prefill_tokens"]  # the long prompts' chunks ran beside the short requests
    left = figures["cancelled_long"]
    # Left at once: stopped before its first chunk or after some, never prefilled whole (how many ran first is the machine's timing).
    assert left["steps"] == 0 and 0 <= left["prefill_tokens"] < 4000 and left["prefill_tokens"] == 64 * left["prefills"]
    assert "left after 0 s" in done.stdout
