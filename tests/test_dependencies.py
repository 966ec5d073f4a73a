"""pyproject's dependencies are true, and are what is tested:
- each is imported by the toolkit's packages (or named below with why it is needed without an import), and
  each third-party module they import is declared;
- every module a real run imports (third-party code's own imports included) comes with a declared dependency,
  not with one that the lock, a test tool or a neighbour happens to install;
- requirements/lock.txt, which `make test` runs the whole suite on, pins each declared dependency at the
  lower bound of its range, so that the lower bounds are tested versions (`make test-installed` tests the
  newest)."""

import ast
import importlib.util
import json
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from mmjudge.judge.testing import HANG_S

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("judge", "infer", "train", "calibration", "demo", "serve")  # installed as mmjudge.<folder>
# Needed at run time, though no module of ours imports it by name.
USED_THROUGH_OTHERS = {"tokenizers": "transformers reads InternVL2's tokenizer (and the tiny test one) with it",
                       "antlr4-python3-runtime": "sympy's LaTeX parser, which MEGA-Bench's numeric metric reads answers with, runs on it",
                       "protobuf": "transformers reads a SentencePiece tokenizer.model (InternVL2's) with it, to convert it on load",
                       "accelerate": "transformers' Trainer (judge-train) runs on it, at 1.3 or newer (1.4: TRL's least)",
                       "httptools": "uvicorn parses judge-serve's HTTP with it where it is installed (h11 otherwise)",
                       "uvloop": "uvicorn runs judge-serve's event loop on it where it is installed (asyncio's otherwise)"}
# The extras whose packages the lock holds and the suite runs with; gpu's (liger-kernel) need a GPU.
TESTED_EXTRAS = ("test", "deepspeed", "rl")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def package_sources():
    """The .py files of the packages under test, wherever they are imported from (the checkout under an
    editable install, site-packages under a regular one)."""
    for package in PACKAGES:
        for folder in importlib.util.find_spec(f"mmjudge.{package}").submodule_search_locations:
            yield from Path(folder).rglob("*.py")


def imported_modules() -> set[str]:
    names = set()
    for path in package_sources():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names) - {"mmjudge"}


def names(requirements: list[str]) -> set[str]:
    return {canonical(Requirement(requirement).name) for requirement in requirements}


def test_declared_runtime_dependencies_are_the_imported_ones():
    declared = names(project()["dependencies"])
    # An extra's package is imported only where it is installed (liger-kernel on a GPU): declared there.
    optional = set().union(*(names(extra) for name, extra in project()["optional-dependencies"].items() if name != "test"))
    distributions = metadata.packages_distributions()
    imported = {canonical(dist) for module in imported_modules() for dist in distributions.get(module, [module])}
    assert imported - declared - optional == set(), "imported but not declared"
    assert declared - imported - set(USED_THROUGH_OTHERS) == set(), "declared but not imported: a test-only or unused package?"


def installed_closure(requirements: list[str]) -> set[str]:
    """The distributions these requirements install: each, and in turn what each requires (with the extras
    named, under this interpreter's markers), as far as it is installed here."""
    found, pending = set(), [Requirement(r) for r in requirements]
    while pending:
        requirement = pending.pop()
        key = (canonical(requirement.name), frozenset(requirement.extras))
        if key in found:
            continue
        found.add(key)
        try:
            requires = metadata.requires(requirement.name) or []
        except metadata.PackageNotFoundError:  # an extra not installed here (liger-kernel without a GPU)
            continue
        for spec in map(Requirement, requires):
            if spec.marker is None or any(spec.marker.evaluate({"extra": extra}) for extra in requirement.extras | {""}):
                pending.append(spec)
    return {name for name, _ in found}


# A fresh interpreter does what a user's run does: imports every module of the toolkit, then loads a judge in
# InternVL2's original format, whose SentencePiece tokenizer.model transformers converts on load.
RUN = """
import importlib, json, pkgutil, sys
from mmjudge.judge.model import load_judge
for package in {packages}:
    module = importlib.import_module("mmjudge." + package)
    for found in pkgutil.walk_packages(module.__path__, module.__name__ + "."):
        if not found.name.endswith("__main__"):
            importlib.import_module(found.name)
load_judge(sys.argv[1])
print(json.dumps(sorted({{name.split(".")[0] for name in sys.modules}})))
"""


@pytest.mark.slow
def test_every_module_a_run_imports_comes_with_a_declared_dependency(checkpoint, tmp_path):
    """protobuf was missing: only the lock installed it, and a fresh `pip install mmjudge` could not read
    InternVL2's tokenizer (transformers then asked for tiktoken)."""
    done = subprocess.run([sys.executable, "-c", RUN.format(packages=PACKAGES), str(checkpoint)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=HANG_S)
    assert done.returncode == 0, done.stderr[-3000:]
    modules = set(json.loads(done.stdout.splitlines()[-1])) - set(sys.stdlib_module_names)
    distributions = metadata.packages_distributions()
    used = {canonical(dist) for module in modules for dist in distributions.get(module, [])} - {"mmjudge"}
    extras = [r for name, extra in project()["optional-dependencies"].items() if name != "test" for r in extra]
    # What the test tools install, third-party code may import where it finds it (httpcore2 takes sniffio,
    # which openai brings): such an import is no need, and a fresh install without the test extra shows any
    # that is (`make test-installed` runs the README's commands before it adds the extra).
    by_test_tools = installed_closure(project()["optional-dependencies"]["test"])
    assert used - installed_closure(project()["dependencies"] + extras) - by_test_tools == set(), "imported at run time, but no declared dependency installs it"


def lower_bound(requirement: Requirement) -> Version:
    bounds = [Version(s.version.removesuffix(".*")) for s in requirement.specifier if s.operator in (">=", "==")]
    assert len(bounds) == 1, f"{requirement}: one lower bound (>= or ==), the version tested"
    return bounds[0]


def test_the_lock_pins_every_declared_dependency_at_its_lower_bound():
    lock = {}
    for line in (ROOT / "requirements" / "lock.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            lock[canonical(name)] = Version(version)
    # torch and DeepSpeed are installed by the Makefile (torch's CPU build first, DeepSpeed built against it).
    makefile = (ROOT / "Makefile").read_text()
    for variable in ("TORCH", "DEEPSPEED"):
        name, version = re.search(rf"^{variable} \?= ([\w-]+)==(\S+)$", makefile, re.M).groups()
        lock[canonical(name)] = Version(version)
    declared = [Requirement(r) for r in project()["dependencies"] + [r for e in TESTED_EXTRAS for r in project()["optional-dependencies"][e]]]
    assert {canonical(r.name): lock.get(canonical(r.name)) for r in declared} == {canonical(r.name): lower_bound(r) for r in declared}


def test_requires_python_admits_the_python_this_suite_runs_on_and_no_other():
    """CI runs the suite on one Python, 3.11 (`make test`, `make test-installed`; Debian's packages have no
    other): 3.10 was declared and never run. A second Python in CI goes into the range with this test."""
    declared = SpecifierSet(project()["requires-python"])
    admitted = [f"3.{minor}" for minor in range(8, 20) if f"3.{minor}.0" in declared]
    assert admitted == [f"{sys.version_info.major}.{sys.version_info.minor}"]
