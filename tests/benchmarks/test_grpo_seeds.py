"""docs/grpo.md's table is benchmarks/grpo_seeds.py's rendering of its run's record, not typed by hand, and the
record is of at least three seeds, each an SFT judge that stopped short (below full test accuracy) and the GRPO
judge from it, with their steps and seconds."""

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_docs_table_is_the_record_s_of_three_seeds_or_more(benchmark_module):
    grpo_seeds = benchmark_module("grpo_seeds")
    record = json.loads((ROOT / "docs" / "benchmarks" / "grpo_seeds.json").read_text())
    page = (ROOT / "docs" / "grpo.md").read_text()
    assert page.split("<!-- grpo_seeds -->\n")[1].split("<!-- /grpo_seeds -->")[0] == grpo_seeds.markdown(record)
    seeds = record["seeds"]
    assert len({r["seed"] for r in seeds}) == len(seeds) >= 3
    for r in seeds:
        assert r["sft_accuracy"] < 1 and 0 <= r["grpo_accuracy"] <= 1  # SFT stopped short
        assert r["sft_steps"] > 0 and r["grpo_steps"] > 0 and r["sft_seconds"] > 0 and r["grpo_seconds"] > 0
        assert r["test_pairs"] == grpo_seeds.TEST_PAIRS
