"""What the benchmarks' tests share: a benchmark script loaded as a module from the checkout's benchmarks/ folder,
wherever pytest runs (the installed wheel's test run has no `benchmarks` package on its path)."""

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="session")
def benchmark_module():
    def load(name: str) -> ModuleType:
        sys.path.insert(0, str(BENCHMARKS))  # a benchmark imports the ones beside it (reward_load, serve_load)
        try:
            spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        finally:
            sys.path.remove(str(BENCHMARKS))
        return module
    return load
