"""Fixtures that tests of several packages share."""

import time
from pathlib import Path

import pytest


@pytest.fixture
def wait_for_lines():
    """Waits until a file another process appends to (a journal mid-run) holds at least `n` lines, or a
    timeout passes; returns whether it did."""
    def wait(path: Path, n: int, timeout_s: float = 120) -> bool:
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if path.exists() and len(path.read_text().splitlines()) >= n:
                return True
            time.sleep(0.05)
        return False
    return wait
