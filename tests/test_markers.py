"""tests/conftest.py keeps the `slow` marker honest: in a test not marked slow, starting a training,
distributed or demo run, or a wheel build, fails before the process starts, naming the marker."""

import subprocess
import sys

import pytest

PY = sys.executable


@pytest.mark.parametrize("argv, env", [
    ([PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "mmjudge.infer.cli"], None),
    (["torchrun", "--nproc_per_node", "2", "-m", "mmjudge.train.cli"], None),
    ([PY, "-m", "mmjudge.train.cli", "--train_file", "train.json"], None),
    (["/venv/bin/judge-train", "--config", "lora.yaml"], None),
    (["/venv/bin/judge-demo", "--output_dir", "out"], None),
    (["deepspeed", "--module", "mmjudge.train.cli"], None),
    ([PY, "benchmarks/train_throughput.py", "--tiny"], None),
    ([PY, "-m", "pip", "wheel", "--no-deps", "."], None),
    ([PY, "-m", "mmjudge.infer.cli", "--model_path", "judge"], {"WORLD_SIZE": "2", "RANK": "1"}),
])
def test_an_unmarked_test_cannot_start_a_slow_run(argv, env):
    with pytest.raises(RuntimeError, match=r"test_markers\.py::.* starts .*: mark it @pytest\.mark\.slow"):
        subprocess.run(argv, env=env)


def test_an_unmarked_test_starts_other_processes():
    assert subprocess.run([PY, "-c", "print('ran')"], capture_output=True, text=True, env={"WORLD_SIZE": "1"}).stdout == "ran\n"
    # a command asked for its help or version is no run: the guard lets it start (and the missing program fails)
    with pytest.raises(FileNotFoundError):
        subprocess.run(["/nonexistent/bin/judge-train", "--help"])

