"""The fairness benchmark, small: a large request of a few images and small requests beside it, every one answered,
the small ones with the rewards they get alone; and docs/serving.md's table is its recorded run."""

import json
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from mmjudge.judge.testing import HANG_S

ROOT = Path(__file__).resolve().parents[2]
BENCHMARK = ROOT / "benchmarks" / "fair_preparing.py"


def markdown(record: dict) -> str:
    """The benchmark's own markdown() of `record` (it imports reward_load and serve_load beside it)."""
    sys.path.insert(0, str(BENCHMARK.parent))
    try:
        return runpy.run_path(str(BENCHMARK))["markdown"](record)
    finally:
        sys.path.remove(str(BENCHMARK.parent))


@pytest.mark.slow  # it starts judge-serve
def test_the_fairness_benchmark_answers_the_large_request_and_the_small_ones_beside_it(tmp_path):
    out = tmp_path / "figures.json"
    done = subprocess.run([sys.executable, str(BENCHMARK), "--images", "3", "--megapixels", "1", "--clients", "2", "--pause_s", "0.2",
                           "--json", str(out)], capture_output=True, text=True, timeout=HANG_S, cwd=BENCHMARK.parent)
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads(out.read_text())
    assert record["large"]["status"] == 200 and record["small_requests"] >= 2 and record["small_rewards_differing"] == 0
    assert 0 < record["small_p50_s"] <= record["small_max_s"] and "small requests beside it" in done.stdout


def test_the_docs_table_is_the_recorded_run():
    """docs/serving.md's table is markdown() of docs/benchmarks/fair_preparing.json, not typed by hand."""
    record = json.loads((ROOT / "docs" / "benchmarks" / "fair_preparing.json").read_text())
    page = (ROOT / "docs" / "serving.md").read_text()
    assert page.split("<!-- fair_preparing -->\n")[1].split("<!-- /fair_preparing -->")[0] == markdown(record)
    assert record["images"] == 64 and record["megapixels"] == 40 and record["large"]["status"] == 200
