"""How many CPU threads a command computes with: the cores free when it starts, not every core there is.

torch starts one OpenMP thread per core and, between parallel regions, lets them spin waiting for work. On a
machine others also use (CI runners, laptops, a shared server) those threads wait on cores that are busy, and
every small operation waits for the slowest of them: on 2 cores with other work running (load about 3), small
matrix products ran 30 times slower on torch's 2 threads than on 1 (150/s against 4,417/s), the demo's training
went from 0.11 to 2.3 s a step, and the suite's demo test ran out of its time. So every command, before torch
loads (judge.cli.run; no command imports torch before it), and the Python API's Judge.load and fine_tune, sets

- OMP_NUM_THREADS: the cores this process may use (its CPU affinity, within its cgroup's CPU quota) less the
  ones busy with other work (the 1-minute load average), at least 1;
- OMP_WAIT_POLICY=PASSIVE: a thread with no work sleeps rather than spins, so that a machine that becomes busy
  after the start costs this run a wake-up, not a core (2 threads under load: 2,167/s rather than 150/s).

Either variable set by the user is kept as it is (OMP_NUM_THREADS=N picks the threads), and a process that
imported torch already (a Python program calling a command's main or the API) keeps the threads it chose
(torch.set_num_threads): OpenMP reads its settings when torch loads. Child processes (DataLoader workers,
the demo's steps) inherit the choice.
docs/performance.md has the figures before and after, on a busy core.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

CGROUP_V2_MAX = Path("/sys/fs/cgroup/cpu.max")
CGROUP_V1 = Path("/sys/fs/cgroup/cpu")


def cores_allowed() -> float:
    """The cores this process may run on: its CPU affinity, within a cgroup's CPU quota where one is set (a
    container given 2 CPUs of a 64-core host would otherwise start 64 threads)."""
    cores = float(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    quota = _cgroup_quota()
    return min(cores, quota) if quota else cores


def _cgroup_quota() -> float | None:
    """CPUs' worth of time per period the cgroup allows (v2's cpu.max, v1's cfs quota); None if unlimited or unknown."""
    try:
        if CGROUP_V2_MAX.is_file():
            quota, period = CGROUP_V2_MAX.read_text().split()[:2]
        else:
            quota, period = ((CGROUP_V1 / f"cpu.cfs_{name}_us").read_text().strip() for name in ("quota", "period"))
        return None if quota in ("max", "-1") else int(quota) / int(period)
    except (OSError, ValueError):
        return None


def free_cores(allowed: float, load: float) -> int:
    """Threads for `allowed` cores when `load` of them are busy: what is left, rounded, and at least 1."""
    return max(1, min(math.floor(allowed), math.floor(allowed - load + 0.5)))


def use_free_cores() -> None:
    """Set OpenMP's threads and waiting for the cores free now (module docstring), unless the user set them or
    torch has loaded already."""
    if "torch" in sys.modules:
        return
    if "OMP_NUM_THREADS" not in os.environ:
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
        os.environ["OMP_NUM_THREADS"] = str(free_cores(cores_allowed(), load))
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
