"""docs/reward-models.md's tables are the benchmarks' renderings of their runs' records (bt_seeds.py's,
judges_side_by_side.py's), not typed by hand, and the seed record meets the issue's bar: every seed 0-4 at 0.9
test accuracy or above."""

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def benchmark(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def shown(table: str) -> str:
    page = (ROOT / "docs" / "reward-models.md").read_text()
    return page.split(f"<!-- {table} -->\n")[1].split(f"<!-- /{table} -->")[0]


def test_the_docs_table_is_the_record_s_and_every_seed_learnt():
    record = json.loads((ROOT / "docs" / "benchmarks" / "bt_seeds.json").read_text())
    assert shown("bt_seeds") == benchmark("bt_seeds").markdown(record)
    assert [r["seed"] for r in record["seeds"]] == [0, 1, 2, 3, 4]
    assert all(r["test_accuracy"] >= record["min_accuracy"] == 0.9 for r in record["seeds"])


def test_the_side_by_side_table_is_the_record_s():
    record = json.loads((ROOT / "docs" / "benchmarks" / "side_by_side.json").read_text())
    assert shown("side_by_side") == benchmark("judges_side_by_side").markdown(record)
