"""Progress bars that move while the work does and count every rank: judge-score's and judge-train's
evaluation.

The scoring engine reports a sample's progress token by token (infer/engine.py: 1 / max_new_tokens of a
sample per token written, the rest when it finishes, so a judge that stops early jumps ahead): a batch that
holds every sample, as on a CPU, moves the bar at each decoding step rather than all at once at its end.

Under torchrun each rank scores its share, and rank 0's bar shows the whole run: every rank adds its
progress to a counter in the key-value store the process group met through (a TCPStore at MASTER_ADDR:
MASTER_PORT, torchrun's own), at most every FLUSH_S seconds and once at the end, and rank 0 shows the sum.
Done with its own share, rank 0 keeps its bar going until every rank is done.

Every bar of judge-score and judge-train (its training bar too) is made by `progress_bar`: redrawn in place on
a terminal; on anything else (a log file, a pipe: each of the demo's steps) a whole line every LINE_EVERY_S
seconds and one at the end, with no carriage return or cursor move, so a log holds a few readable lines
rather than every redraw.
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Iterable, Iterator
from datetime import timedelta
from typing import TypeVar

from tqdm import tqdm

FLUSH_S = 0.5  # how often a rank adds its progress to the shared counter, and rank 0 reads it
UNITS = 1000  # bars and the shared counter count whole numbers: thousandths of a sample, shown as samples
STALLED_S = 1800.0  # rank 0 stops waiting for ranks whose progress has not moved this long (gloo's own timeout)
LINE_EVERY_S = 5.0  # on an output that is not a terminal, at most a line this often
# n as a whole number: tqdm would print 12.3456/80 for a bar that counts parts of samples
FORMAT = "{desc}: {percentage:3.0f}%|{bar}| {n:.0f}/{total:.0f} [{elapsed}<{remaining}, {rate_fmt}{postfix}]"


class Bar:
    """A bar of `total` samples (every rank's, under torchrun) on rank 0's stderr; `update` adds this rank's
    progress in samples, fractions included; `close` (or the end of a `with`) waits on rank 0 for the others.
    `show=False` draws nothing (a caller that asked for no bars) and still counts.
    `key` names the run's counter in the store: one per bar and run, so that a rerun or a second pass
    never adds to another's."""

    def __init__(self, desc: str, total: int, rank: int = 0, world: int = 1, key: str = "", leave: bool = True, show: bool = True):
        self.rank, self.total = rank, total
        self.store = shared_store() if world > 1 else None
        self.key = f"mmjudge/progress/{key}/{desc}/restart{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
        self.bar = progress_bar(total=total * UNITS, desc=desc, unit="sample", unit_scale=1 / UNITS, bar_format=FORMAT, leave=leave,
                                disable=rank != 0 or not show)
        self.done = 0.0  # this rank's progress, in samples
        self.sent = 0  # of it, what the bar (one process) or the shared counter holds, in UNITS
        self.flushed = time.monotonic()

    def __enter__(self) -> Bar:
        return self

    def __exit__(self, kind, error, trace) -> None:
        self.close(wait=kind is None)  # a rank that failed does not wait for the others

    def update(self, amount: float) -> None:
        self.done += amount
        if self.store is None:
            self.bar.update(self._unsent())
        elif time.monotonic() - self.flushed >= FLUSH_S:
            self._flush()

    def close(self, wait: bool = True) -> None:
        if self.store is not None:
            self._flush()
            if wait and self.rank == 0:
                self._follow_the_others()
        self.bar.close()

    def _unsent(self) -> int:
        units = round(self.done * UNITS)
        unsent, self.sent = units - self.sent, units
        return unsent

    def _flush(self) -> None:
        """This rank's progress into the shared counter; on rank 0, the counter onto the bar."""
        self.flushed = time.monotonic()
        everyone = self.store.add(self.key, self._unsent())
        if self.rank == 0:
            self.bar.update(everyone - self.bar.n)

    def _follow_the_others(self) -> None:
        last, moved = self.bar.n, time.monotonic()
        while self.bar.n < self.total * UNITS and time.monotonic() - moved < STALLED_S:
            time.sleep(FLUSH_S)
            self._flush()
            if self.bar.n != last:
                last, moved = self.bar.n, time.monotonic()


def progress_bar(**options) -> tqdm:
    """A tqdm bar on stderr (tqdm's keyword options): redrawn in place on a terminal, as whole lines elsewhere."""
    if sys.stderr.isatty():
        return tqdm(file=sys.stderr, **options)
    return tqdm(file=Lines(sys.stderr), mininterval=LINE_EVERY_S, **options)


def quiet_library_bars() -> None:
    """transformers' own bars ("Loading weights": a second's work) off where stderr is no terminal, where they
    would write their carriage-return redraws into the log between this module's lines."""
    if not sys.stderr.isatty():
        from transformers.utils import logging as transformers_logging  # loaded by then: the judge is about to load

        transformers_logging.disable_progress_bar()


class Lines:
    """A stream that takes tqdm's redraws (a carriage return, the bar, padding; newlines and cursor moves
    between nested bars) and writes each bar it is given as a line of its own."""

    REDRAW = re.compile(r"\r|\x1b\[A")  # what moves the cursor back: the start of a line, the line above

    def __init__(self, stream):
        self.stream = stream

    def write(self, text: str) -> None:
        for line in self.REDRAW.sub("\n", text).split("\n"):
            if line.strip():
                self.stream.write(line.rstrip() + "\n")

    def flush(self) -> None:
        self.stream.flush()


T = TypeVar("T")


def counted(items: Iterable[T], bar: Bar) -> Iterator[T]:
    """The items, each counted on the bar once it has been used."""
    for item in items:
        yield item
        bar.update(1)


def shared_store():
    """A client of the store the process group met through: torchrun's (or rank 0's, without torchrun)."""
    import torch.distributed as dist  # torch loads here, where a distributed run needs it

    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timedelta(seconds=60))
