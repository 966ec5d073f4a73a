"""The throughput benchmark: its CPU smoke run (end to end, both sides agree), and what of its full-size
setup a CPU can check."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mmjudge.judge.testing import HANG_S, write_tokenizer

BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "score_throughput.py"


@pytest.mark.slow  # each imports transformers in a process of its own
@pytest.mark.parametrize("name", ["score_throughput", "profile_score", "host_overhead"])
def test_the_engine_benchmarks_take_judge_scores_cpu_threads_before_torch_loads(name):
    """They run the engine in their own process: with torch's own choice of threads, 2 spinning on a 2-core machine
    beside other work, a CPU run took many times as long as judge-score's (judges_side_by_side.py: 35x). Imported
    before torch, each sets OpenMP's threads and waiting as the commands do (judge/cpu.py's use_free_cores)."""
    code = (f"import os, sys; sys.path.insert(0, {str(BENCHMARK.parent)!r}); import {name}, torch; "
            "print(os.environ.get('OMP_WAIT_POLICY'), torch.get_num_threads() == int(os.environ['OMP_NUM_THREADS']))")
    env = {key: value for key, value in os.environ.items() if not key.startswith("OMP_")}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=HANG_S)
    assert done.stdout.split() == ["PASSIVE", "True"], done.stderr[-2000:]


@pytest.mark.slow
def test_benchmark_runs_on_cpu_with_a_tiny_judge(tmp_path):
    out = tmp_path / "figures.json"
    cmd = [sys.executable, str(BENCHMARK), "--tiny", "--samples", "4", "--reference_samples", "2", "--new_tokens", "3",
           "--max_tiles", "1", "--device", "cpu", "--invariance_samples", "4", "--compare_deterministic",
           "--json", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=HANG_S)
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads(out.read_text())
    assert figures["samples"] == 4 and figures["device"] == "cpu"
    assert figures["greedy_agreement"] == "2/2"  # the engine's batched output equals the reference loop's
    assert figures["reference_samples_per_s"] > 0 and figures["engine_samples_per_s"] > 0 and figures["prefill_tflops"] > 0
    assert "speedup" in done.stdout
    # scored alone, the same records: on a CPU in fp32 batching changes nothing
    assert figures["generate_tokens_differ"] == 0 and figures["logits_score_differs"] == 0
    assert figures["logits_max_distribution_gap"] < 1e-5
    # on a CPU scoring is not deterministic unless asked: asked, it runs a prefill pass per sample
    assert figures["deterministic"] is False and figures["other_prefill_passes"] == 4
    assert figures["engine_samples_per_s_other"] > 0 and figures["deterministic_cost_logits"] > 0


@pytest.mark.slow
def test_the_profile_runs_on_cpu_and_names_where_time_goes(tmp_path):
    out = tmp_path / "profile.txt"
    cmd = [sys.executable, str(BENCHMARK.parent / "profile_score.py"), "--tiny", "--samples", "3", "--new_tokens", "3",
           "--max_tiles", "1", "--device", "cpu", "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=HANG_S)
    assert done.returncode == 0, done.stderr[-2000:]
    text = out.read_text()
    assert "== generate: 3 samples" in text and "== logits: 3 samples" in text and "aten::mm" in text


def test_the_full_size_judge_is_built_from_the_shared_config(monkeypatch, tmp_path):
    """Both benchmarks build InternVL2-4B from configs/model/internvl2-4b.json; on the meta device the
    4 billion parameters take no memory."""
    monkeypatch.syspath_prepend(str(BENCHMARK.parent))
    from score_throughput import full_size_judge, vision_tokens_per_tile

    judge = full_size_judge("meta", tmp_path / "tokenizer")
    assert 4.1e9 < sum(p.numel() for p in judge.model.parameters()) < 4.2e9
    assert (judge.settings.template.name, judge.settings.images.max_tiles, judge.settings.images.tokens_per_tile) == ("phi3-chat", 12, 256)
    assert vision_tokens_per_tile(judge) == 1025


def test_workload_texts_are_500_to_1200_tokens_of_the_judges_tokenizer(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(BENCHMARK.parent))
    from score_throughput import write_workload

    tokenizer = write_tokenizer(tmp_path / "tokenizer")
    samples = json.loads((write_workload(tmp_path / "data", 6, 0, tokenizer) / "data.json").read_text())
    for sample in samples:
        texts = [sample["question"][0]["text"], sample["answer"][0]["text"]]
        n = sum(len(tokenizer(text, add_special_tokens=False).input_ids) for text in texts)
        assert 500 <= n <= 1201  # the answer, tokenized apart from the question, may start with a word-start marker
