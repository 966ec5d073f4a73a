"""pyproject's runtime dependencies are true: each is imported by the toolkit's packages (or named below
with why it is needed without an import), and each third-party module they import is declared."""

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("judge", "infer", "train", "calibration", "demo", "serve")
# Needed at run time, though no module of ours imports it by name.
USED_THROUGH_OTHERS = {"tokenizers": "transformers reads InternVL2's tokenizer (and the tiny test one) with it",
                       "antlr4-python3-runtime": "sympy's LaTeX parser, which MEGA-Bench's numeric metric reads answers with, runs on it"}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def imported_modules() -> set[str]:
    names = set()
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    names |= {alias.name.split(".")[0] for alias in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0:
                    names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names) - {"mmjudge"}


def names(requirements: list[str]) -> set[str]:
    return {canonical(re.match(r"[A-Za-z0-9._-]+", requirement).group()) for requirement in requirements}


def test_declared_runtime_dependencies_are_the_imported_ones():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = names(project["dependencies"])
    # An extra's package is imported only where it is installed (liger-kernel on a GPU): declared there.
    optional = set().union(*(names(extra) for name, extra in project["optional-dependencies"].items() if name != "test"))
    distributions = packages_distributions()
    imported = {canonical(dist) for module in imported_modules() for dist in distributions.get(module, [module])}
    assert imported - declared - optional == set(), "imported but not declared"
    assert declared - imported - set(USED_THROUGH_OTHERS) == set(), "declared but not imported: a test-only or unused package?"
