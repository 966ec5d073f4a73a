"""The host-overhead benchmark (benchmarks/host_overhead.py): the engine as judge-score runs it, with the model's
forward passes replaced by the benchmark's stand-in, end to end on a CPU."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mmjudge.judge.testing import HANG_S

BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "host_overhead.py"


@pytest.mark.slow
def test_the_engine_runs_whole_around_the_stand_in_and_every_row_writes_its_tokens(tmp_path):
    out, phases = tmp_path / "figures.json", tmp_path / "phases.txt"
    cmd = [sys.executable, str(BENCHMARK), "--rows", "4", "--samples", "4", "--new_tokens", "5", "--max_tiles", "1", "--repeat", "1",
           "--profile", str(phases), "--json", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=HANG_S, cwd=BENCHMARK.parent)
    assert done.returncode == 0, done.stderr[-2000:]
    generate, logits = json.loads(out.read_text())["runs"]
    # 4 rows decoding at once: each writes its first token at its prefill and the 4 others in 4 steps of all 4 rows
    assert (generate["mode"], generate["samples"], generate["steps"]) == ("generate", 4, 4)
    assert generate["prefills"] >= 1 and generate["step_us"] > 0 and generate["prefill_us"] > 0
    assert (logits["mode"], logits["steps"]) == ("logits", 0) and logits["per_sample_us"] > 0
    assert generate["phase_shares"]["decoding steps in all (_decode)"] > 0
    assert "== generate, 4 rows ==" in phases.read_text()
