"""The throughput benchmark's CPU smoke run: it must run end to end and the two sides must agree."""

import json
import subprocess
import sys
from pathlib import Path

BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "score_throughput.py"


def test_benchmark_runs_on_cpu_with_a_tiny_judge(tmp_path):
    out = tmp_path / "figures.json"
    cmd = [sys.executable, str(BENCHMARK), "--tiny", "--samples", "4", "--reference_samples", "2", "--new_tokens", "3",
           "--max_tiles", "1", "--device", "cpu", "--json", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads(out.read_text())
    assert figures["samples"] == 4 and figures["device"] == "cpu"
    assert figures["greedy_agreement"] == "2/2"  # the engine's batched output equals the reference loop's
    assert figures["reference_samples_per_s"] > 0 and figures["engine_samples_per_s"] > 0 and figures["prefill_tflops"] > 0
    assert "speedup" in done.stdout
