"""Every command computes on the cores free when it starts (judge/cpu.py): the mechanism, checked in fresh
processes with the machine's load played by the test, never timed (docs/performance.md has the timings)."""

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from mmjudge.judge import cpu

ROOT = Path(__file__).resolve().parents[2]
COMMAND_MODULES = sorted({target.split(":")[0] for target in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"].values()})


@pytest.mark.parametrize("allowed, load, threads", [
    (2, 0.0, 2), (2, 0.4, 2), (2, 1.2, 1), (2, 3.0, 1),  # the machine: 2 cores, load about 3
    (16, 3.4, 13), (16, 40.0, 1), (0.5, 0.0, 1), (2.5, 0.0, 2),
])
def test_threads_are_the_cores_left_free_and_at_least_one(allowed, load, threads):
    assert cpu.free_cores(allowed, load) == threads


def test_a_cgroup_quota_bounds_the_cores_of_a_container(tmp_path, monkeypatch):
    """Docker's --cpus 2 on a 64-core host: affinity says 64, cpu.max says 2."""
    (tmp_path / "cpu.max").write_text("200000 100000\n")
    monkeypatch.setattr(cpu, "CGROUP_V2_MAX", tmp_path / "cpu.max")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    assert cpu.cores_allowed() == 2.0
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cpu.cores_allowed() == 64.0


def test_no_command_loads_torch_before_its_threads_are_chosen():
    """OpenMP reads its settings when torch loads: a command module importing torch would start its pool first."""
    code = f"import importlib, sys\nfor m in {COMMAND_MODULES!r}:\n    importlib.import_module(m)\nprint(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert len(COMMAND_MODULES) == 6 and done.stdout.strip() == "[]", done.stdout[:2000]


def threads_under(load: float, **env: str) -> dict:
    """What a command run in a fresh process computes with, the 1-minute load average being `load`."""
    code = ("import json, os\n"
            f"os.getloadavg = lambda: ({load}, {load}, {load})\n"
            "from mmjudge.judge.cli import run\n"
            "def main(argv):\n"
            "    import torch\n"
            "    print(json.dumps({'torch': torch.get_num_threads(), 'wait': os.environ.get('OMP_WAIT_POLICY')}))\n"
            "run(main, [])\n")
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OMP_")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**clean, **env}, check=True)
    return json.loads(done.stdout)


@pytest.mark.parametrize("call", ["mmjudge.Judge.load('no-such-judge', max_new_tokens=0)", "mmjudge.fine_tune('no-such-judge', 'a.json', 'out', lora_r=0)"])
def test_the_python_apis_doors_choose_the_threads_as_the_commands_do(call):
    """Judge.load and fine_tune, called first in a program: their threads chosen before they load torch (each
    call here is refused, after the choice)."""
    code = ("import json, os\n"
            "os.getloadavg = lambda: (40.0, 40.0, 40.0)\n"
            "import mmjudge\n"
            "from mmjudge.judge.data import UsageError\n"
            "try:\n"
            f"    {call}\n"
            "except UsageError:\n"
            "    pass\n"
            "import torch\n"
            "print(json.dumps({'torch': torch.get_num_threads(), 'wait': os.environ.get('OMP_WAIT_POLICY')}))\n")
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OMP_")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean, check=True)
    assert json.loads(done.stdout) == {"torch": 1, "wait": "PASSIVE"}, done.stderr[-2000:]


def test_a_command_on_a_busy_machine_computes_on_one_sleeping_thread():
    assert threads_under(load=40.0) == {"torch": 1, "wait": "PASSIVE"}


def test_a_command_on_an_idle_machine_takes_every_core_it_may_use():
    assert threads_under(load=0.0) == {"torch": cpu.free_cores(cpu.cores_allowed(), 0.0), "wait": "PASSIVE"}


def test_the_users_own_settings_are_kept():
    assert threads_under(load=40.0, OMP_NUM_THREADS="2", OMP_WAIT_POLICY="ACTIVE") == {"torch": 2, "wait": "ACTIVE"}  # not 1


def test_a_program_that_loaded_torch_keeps_its_threads(monkeypatch):
    """A command's main called from Python: the caller's torch.set_num_threads stands, and nothing is set for it."""
    import torch

    from mmjudge.judge.cli import run

    for name in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(os, "getloadavg", lambda: (40.0, 40.0, 40.0))
    before = torch.get_num_threads()
    assert run(lambda argv: 0, []) == 0
    assert torch.get_num_threads() == before and "OMP_NUM_THREADS" not in os.environ and "OMP_WAIT_POLICY" not in os.environ
