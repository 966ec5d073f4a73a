"""judge-serve as a child process on a free loopback port, for the tests and the load benchmark."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx2


def free_port() -> int:
    """A port no other process listens on now: a fixed one collides with other runs on the machine."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(flags: list[str], port: int, log: Path, env: dict | None = None, timeout_s: float = 3600) -> subprocess.Popen:
    """`judge-serve FLAGS --port PORT` started and answering /health, its output in `log`; an error as soon as
    it exits, and the server stopped again if it does not answer within the timeout: a bound on a hang only,
    since a busy machine can take minutes to load a model."""
    with log.open("ab") as out:
        process = subprocess.Popen([sys.executable, "-m", "mmjudge.serve.cli", *flags, "--port", str(port)], stdout=out, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if httpx2.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return process
        except httpx2.TransportError:
            pass
        time.sleep(0.2)
    process.kill()
    process.wait()
    raise RuntimeError(f"judge-serve did not start on port {port} within {timeout_s:g} s (exit code {process.returncode}):\n{log.read_text()[-3000:]}")
