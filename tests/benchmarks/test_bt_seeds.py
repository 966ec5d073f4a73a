"""docs/reward-models.md's tables are the benchmarks' renderings of their runs' records (bt_seeds.py's,
judges_side_by_side.py's), not typed by hand, and the seed record meets the issue's bar: every seed 0-4 at 0.9
test accuracy or above."""

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def shown(table: str) -> str:
    page = (ROOT / "docs" / "reward-models.md").read_text()
    return page.split(f"<!-- {table} -->\n")[1].split(f"<!-- /{table} -->")[0]


def test_the_docs_table_is_the_record_s_and_every_seed_learnt(benchmark_module):
    record = json.loads((ROOT / "docs" / "benchmarks" / "bt_seeds.json").read_text())
    assert shown("bt_seeds") == benchmark_module("bt_seeds").markdown(record)
    assert [r["seed"] for r in record["seeds"]] == [0, 1, 2, 3, 4]
    assert all(r["test_accuracy"] >= record["min_accuracy"] == 0.9 for r in record["seeds"])


def test_the_side_by_side_table_is_the_record_s(benchmark_module):
    record = json.loads((ROOT / "docs" / "benchmarks" / "side_by_side.json").read_text())
    assert shown("side_by_side") == benchmark_module("judges_side_by_side").markdown(record)
