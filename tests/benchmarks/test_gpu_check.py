"""The GPU check (benchmarks/gpu_check.sh): its wiring end to end in its CPU rehearsal, and its table, which
must say which step left no figures rather than fail or leave a row out."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mmjudge.judge.testing import HANG_S

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def report(folder: Path) -> str:
    done = subprocess.run([sys.executable, str(BENCHMARKS / "gpu_report.py"), str(folder)], capture_output=True, text=True, timeout=HANG_S)
    assert done.returncode == 0, done.stderr[-2000:]
    return (folder / "summary.md").read_text()


def test_the_table_reads_each_steps_figures_and_names_the_steps_that_left_none(tmp_path):
    (tmp_path / "limits.json").write_text(json.dumps({"device": "NVIDIA H100 80GB HBM3", "matmul_tflops": 778.5, "copy_tb_s": 3.03}))
    (tmp_path / "gpu_tests.xml").write_text('<testsuites><testsuite name="pytest" errors="0" failures="1" skipped="0" tests="5"/></testsuites>')
    (tmp_path / "train.json").write_text(json.dumps({"ms_per_step": 321.4, "mfu": 0.2999, "peak_gpu_memory_gib": 28.7}))
    table = report(tmp_path)
    assert "| matrix products (bf16) | 778 TFLOP/s |" in table and "| copy bandwidth | 3.03 TB/s |" in table
    assert "| GPU tests (pytest) | 4 passed, 1 failed, 0 errors, 0 skipped |" in table
    assert "| LoRA step | 321 ms, MFU 30.0%, peak 28.7 GiB |" in table
    for step in ("scoring benchmark", "LoRA step, ZeRO-2", "judge-serve load"):
        assert f"| {step} | did not finish (log.txt) |" in table
    assert json.loads((tmp_path / "summary.json").read_text())["score"] is None


def test_the_table_shows_the_decoding_attention_its_passes_and_the_sdpa_comparison(tmp_path):
    """A scoring run without the reference loop (--reference_samples 0) and with --compare_sdpa."""
    score = {"decoding_attention": "split-KV", "engine_samples_per_s": 1.157, "speedup": None, "mmie_hours_generate": 4.83,
             "decode_steps": 1536, "prefill_passes": 21, "generate_floor_ratio": 3.15, "mmie_hours_generate_floor": 1.53,
             "engine_samples_per_s_sdpa": 1.139, "logits_samples_per_s": 6.47, "prefill_utilisation": 0.511, "mmie_hours_logits": 0.86,
             "greedy_agreement": "0/0"}
    (tmp_path / "score.json").write_text(json.dumps(score))
    table = report(tmp_path)
    assert ("| generate mode (split-KV decoding) | 1.16 samples/s, 4.83 h for MMIE, 1,536 decoding steps, 21 prefill passes |"
            in table), table
    assert "| ... with SDPA decoding | 1.14 samples/s |" in table and "| greedy agreement with the reference loop | not run |" in table


def test_the_table_shows_what_deterministic_scoring_costs_and_how_many_records_differ_alone(tmp_path):
    """A run on a GPU, where scoring is deterministic by default, with --compare_deterministic."""
    score = {"decoding_attention": "split-KV", "deterministic": True, "engine_samples_per_s": 1.19, "speedup": None,
             "mmie_hours_generate": 4.65, "generate_floor_ratio": 3.0, "mmie_hours_generate_floor": 1.5, "logits_samples_per_s": 6.85,
             "prefill_utilisation": 0.5, "mmie_hours_logits": 0.86, "greedy_agreement": "0/0",
             "engine_samples_per_s_other": 1.17, "logits_samples_per_s_other": 7.54, "deterministic_cost_generate": 0.98,
             "deterministic_cost_logits": 1.1, "invariance_samples": 64, "generate_tokens_differ": 0, "generate_distribution_differs": 0,
             "logits_score_differs": 0, "logits_max_distribution_gap": 0.0}
    (tmp_path / "score.json").write_text(json.dumps(score))
    table = report(tmp_path)
    assert "| generate mode (split-KV decoding, deterministic) | 1.19 samples/s, 4.65 h for MMIE |" in table, table
    assert ("| ... not deterministic | generate 1.17 samples/s, logits 7.54 samples/s; deterministic takes 0.98x the time in generate "
            "mode, 1.10x in logits mode |" in table)
    assert ("| bf16 batch invariance, deterministic | 0 of 64 generated texts differ alone (0 score distributions); logits: 0 scores "
            "differ, largest gap 0 |" in table)


@pytest.mark.slow
def test_the_rehearsal_runs_every_step_and_ends_with_the_table(tmp_path):
    """GPU_CHECK_SMOKE: the same steps on a CPU with a tiny judge, from an empty folder, with this Python
    and the installed package (no wheels to install). Each step's time limit is a GPU's: stretched here, as
    is the whole run's, to within the suite's hang limit (at the GPU's limits the rehearsal failed beside two
    busy loops, a step killed at its limit: a verdict that depended on the machine's load)."""
    env = {**os.environ, "GPU_CHECK_SMOKE": "1", "PYTHON": sys.executable, "GPU_CHECK_WHEELS": str(tmp_path / "no-wheels"),
           "GPU_CHECK_STRETCH": "3", "GPU_CHECK_SECONDS": str(int(HANG_S) - 300)}
    done = subprocess.run(["bash", str(BENCHMARKS / "gpu_check.sh"), str(tmp_path / "out")], capture_output=True, text=True, env=env,
                          timeout=HANG_S)
    assert done.returncode == 0, done.stderr[-2000:]
    steps = (tmp_path / "out" / "steps.txt").read_text().splitlines()
    assert [line.split()[:2] for line in steps] == [[name, "rc=0"] for name in
                                                   ("versions", "limits", "gpu_tests", "score", "train", "train_zero2", "serve", "profile", "report")]
    # within the eight files the device tool brings back
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["log.txt", "profile.txt", "steps.txt", "summary.json", "summary.md"]
    score = json.loads((tmp_path / "out" / "summary.json").read_text())["score"]
    # Each ratio is there and positive. Not "above 1": on a CPU shared with other work, the limits measured at one
    # moment and the run at another can differ twice over (0.51 in a clean-clone run beside another job); on the
    # GPU the step measures both on an idle device.
    assert all(0 < score[ratio] < math.inf for ratio in ("generate_floor_ratio", "logits_floor_ratio"))
    table = done.stdout
    # the quick tests of the split-KV and batch-invariant kernels in Triton's interpreter; test_decoding_gpu.py's ten skipped
    assert "| GPU tests (pytest) | 6 passed, 0 failed, 0 errors, 10 skipped |" in table and "did not finish" not in table
    assert "| judge-serve, 4 clients |" in table
