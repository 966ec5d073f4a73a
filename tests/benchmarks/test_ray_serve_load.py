"""The Ray Serve load benchmark's record and its table in docs/past-one-machine.md (the benchmark itself starts a Ray
cluster three times: tests/serve/test_ray_serve.py runs the same deployment, smaller)."""

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RECORD = ROOT / "docs" / "benchmarks" / "ray-serve" / "grpo-2-replicas.json"


def test_the_docs_table_is_the_recorded_run(benchmark_module):
    """docs/past-one-machine.md's table is markdown() of the recorded run, not typed by hand; the run answered every
    request, each reward the plain server's."""
    record = json.loads(RECORD.read_text())
    page = (ROOT / "docs" / "past-one-machine.md").read_text()
    assert page.split("<!-- ray_serve_load -->\n")[1].split("<!-- /ray_serve_load -->")[0] == benchmark_module("ray_serve_load").markdown(record)
    assert (record["questions"], record["answers"], record["clients"], record["replicas"]) == (32, 8, 64, 2)
    assert all(run["ray"]["failed"] == run["plain"]["failed"] == run["rewards_differing"] == 0 for run in record["runs"].values())
