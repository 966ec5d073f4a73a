"""The README's commands as a user runs them: every console script pyproject.toml declares, started from the
environment's bin/, answers --version and explains each flag with its default in --help."""

import re
import subprocess
import sys
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest
from mmjudge.judge.testing import HANG_S


# Each test starts the commands as processes: seconds each, more than the quick loop affords.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
SCRIPTS = sorted(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"])
SUBCOMMANDS = {"judge-rubric": ["import"], "judge-train": ["merge"]}
HELP_RUNS = [[name, *sub] for name in SCRIPTS for sub in ([[]] + [[s] for s in SUBCOMMANDS.get(name, [])])]


@pytest.fixture(scope="module")
def outputs() -> dict[tuple[str, ...], subprocess.CompletedProcess]:
    """Every --help and --version run, started together: most of their time is interpreter and torch start-up."""
    commands = [(*run, "--help") for run in HELP_RUNS] + [(name, "--version") for name in SCRIPTS]
    started = {c: subprocess.Popen([str(BIN / c[0]), *c[1:]], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for c in commands}
    return {c: subprocess.CompletedProcess(p.args, p.wait(timeout=HANG_S), *p.communicate()) for c, p in started.items()}


def test_the_readme_commands_are_the_declared_scripts():
    assert SCRIPTS == ["judge-calibrate", "judge-demo", "judge-rubric", "judge-score", "judge-serve", "judge-train"]
    readme = (ROOT / "README.md").read_text()
    assert all(f"`{name}" in readme for name in SCRIPTS)


@pytest.mark.parametrize("name", SCRIPTS)
def test_version(outputs, name):
    done = outputs[(name, "--version")]
    assert done.returncode == 0 and done.stdout.strip() == f"{name} {version('mmjudge')}", done.stderr


def options_without_default(help_text: str) -> list[str]:
    """The optional flags of an argparse --help whose text states no default (a required flag has none)."""
    usage = help_text.split("\n\n", 1)[0]
    while re.search(r"\[[^\[\]]*\]", usage):  # drop the optional groups, innermost first
        usage = re.sub(r"\[[^\[\]]*\]", "", usage)
    required = set(re.findall(r"(?<!\w)--?[\w-]+", usage))
    options = help_text.split("\noptions:\n", 1)[1].split("\n\n", 1)[0]
    missing = []
    for entry in re.split(r"\n(?=  -)", options):
        invocation = re.split(r"\s{2,}", entry.strip())[0]  # "-o OUTPUT, --output OUTPUT"
        flags = re.findall(r"(?:^|, )(--?[\w-]+)", invocation)
        if set(flags) & ({"-h", "--help", "--version"} | required):
            continue
        if "(default:" not in " ".join(entry.split()):
            missing.append(flags[-1])
    return missing


@pytest.mark.parametrize("run", [pytest.param(run, id=" ".join(run)) for run in HELP_RUNS])
def test_help_states_every_default(outputs, run):
    done = outputs[(*run, "--help")]
    assert done.returncode == 0, done.stderr
    assert options_without_default(done.stdout) == []


def test_the_command_lines_are_read_before_transformers_loads(tmp_path):
    """--help, --version and a bad flag's message must not wait for transformers (seconds): the command
    modules and their settings import without it, and the parsers build without it."""
    code = ("import sys, mmjudge.infer.cli, mmjudge.train.cli, mmjudge.serve.cli; mmjudge.infer.cli.build_parser(); mmjudge.train.cli.build_parser(); mmjudge.train.cli.merge_parser(); "
            "mmjudge.serve.cli.build_parser(); "
            "print(sorted(m for m in ('transformers', 'peft', 'deepspeed') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr
