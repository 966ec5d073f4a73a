"""benchmarks/plain_transformers.py with this venv's transformers (the newest pyproject allows, as `make setup`
installs it): every family's reward export, loaded by benchmarks/plain_rewards.py as docs/reward-models.md says,
with no mmjudge import, gives mmjudge's prompt ids and rewards on pairs with images. The fresh venvs of the newest
transformers on the index are the docs' recorded runs."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_every_familys_export_gives_mmjudges_rewards_in_plain_transformers(tmp_path):
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "plain_transformers.py"), "--python", sys.executable, "--out", str(tmp_path),
                          "--pairs", "2"], capture_output=True, text=True, timeout=900)
    rows = [line for line in run.stdout.splitlines() if line.startswith("| ") and "of" in line]
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    assert [row.split(" | ")[0] for row in rows] == ["| internvl2-4b", "| qwen2.5-vl-3b", "| qwen3-vl-4b", "| qwen3.5-4b"]
    assert all(" 4 of 4 " in row and row.split(" | ")[2] != "0" for row in rows), rows  # 2 pairs: 4 answers, some with images
