"""The Ray Serve load benchmark's record and its table in docs/past-one-machine.md (the benchmark itself starts a Ray
cluster three times: tests/serve/test_ray_serve.py runs the same deployment, smaller)."""

import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCHMARK = ROOT / "benchmarks" / "ray_serve_load.py"
RECORD = ROOT / "docs" / "benchmarks" / "ray-serve" / "grpo-2-replicas.json"


def load_benchmark():
    sys.path.insert(0, str(BENCHMARK.parent))  # it imports reward_load beside it
    try:
        spec = importlib.util.spec_from_file_location("ray_serve_load", BENCHMARK)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCHMARK.parent))
    return module


def test_the_docs_table_is_the_recorded_run():
    """docs/past-one-machine.md's table is markdown() of the recorded run, not typed by hand; the run answered every
    request, each reward the plain server's."""
    record = json.loads(RECORD.read_text())
    page = (ROOT / "docs" / "past-one-machine.md").read_text()
    assert page.split("<!-- ray_serve_load -->\n")[1].split("<!-- /ray_serve_load -->")[0] == load_benchmark().markdown(record)
    assert (record["questions"], record["answers"], record["clients"], record["replicas"]) == (32, 8, 64, 2)
    assert all(run["ray"]["failed"] == run["plain"]["failed"] == run["rewards_differing"] == 0 for run in record["runs"].values())
