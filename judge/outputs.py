"""Where a command writes: one run at a time in an output directory, and no output in place of an input.

Every command that writes into a directory holds a lock on it for the run (`locked`): a second run on the
same directory is refused with the first one's name, instead of both writing the same journal or report.
The lock is an flock on `LOCK_FILE`, which the kernel releases when the process ends, however it ends, so a
run killed with kill -9 leaves nothing stale behind.

Before anything is written, `overwritten_inputs` names every input that an output would replace or
delete: an input file that happens to be called summary.json in --output_dir was silently overwritten.
A directory written as a whole (an exported checkpoint) appears only once it is complete (`written_whole`).
"""

from __future__ import annotations

import errno
import fcntl
import os
import secrets
import shutil
import socket
import stat
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from fnmatch import fnmatchcase
from pathlib import Path

from mmjudge.judge.data import UsageError

LOCK_FILE = ".mmjudge.lock"


@contextmanager
def locked(output_dir: Path, command: str) -> Iterator[None]:
    """Hold `output_dir` (created if missing) for the life of the block; a second run on it is refused, and a
    directory that cannot be written is refused here, before any model loads."""
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UsageError(f"--output_dir {output_dir}: cannot write there ({err.strerror})") from None
    fd = open_own_file(output_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, "--output_dir")
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another run"
            raise UsageError(f"--output_dir {output_dir} is in use by {holder}; wait for it to end, or give another --output_dir") from None
        except OSError as err:  # a filesystem without locks (some NFS or Lustre mounts): say so, and go on
            if err.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                raise
            print(f"note: --output_dir {output_dir} cannot be locked ({err.strerror}): make sure no other run uses it", file=sys.stderr)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{command} (pid {os.getpid()} on {socket.gethostname()})\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


def open_own_file(path: Path, flags: int, flag: str) -> int:
    """A file the run keeps in its output directory (its lock, a journal), opened only where it is a regular
    file of its own: a link planted there would have the run empty or append to the file it points at, and
    a FIFO would hang it. `flag` names where it lies in the refusal."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise UsageError(f"{flag} {path.parent}: {path.name} there is a link, and the run writes only files of its own; "
                             f"remove it, or give another {flag}") from None
        if err.errno == errno.ENXIO:  # a FIFO that no process reads, opened to write without blocking
            raise UsageError(f"{flag} {path.parent}: {path.name} there is not a regular file; remove it, or give another {flag}") from None
        raise UsageError(f"{flag} {path.parent}: cannot write there ({err.strerror})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UsageError(f"{flag} {path.parent}: {path.name} there is not a regular file; remove it, or give another {flag}")
    os.set_blocking(fd, True)
    return fd


@contextmanager
def written_whole(out_dir: Path) -> Iterator[Path]:
    """A hidden sibling directory to write `out_dir`'s files into, renamed to `out_dir` (new or empty) when
    the block ends without error: a run stopped half-way by an error or a full disk leaves no half-written
    `out_dir` that looks like a checkpoint and makes a rerun refuse a non-empty directory. (After kill -9,
    only the hidden `.NAME.*.tmp` sibling is left.)"""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = out_dir.with_name(f".{out_dir.name}.{secrets.token_hex(8)}.tmp")
    staging.mkdir()
    try:
        yield staging
        try:
            os.replace(staging, out_dir)  # rename(2) replaces an empty directory, never a non-empty one
        except OSError as err:
            if err.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
                raise
            raise UsageError(f"--output_dir {out_dir}: something was written there while this run wrote (another run?); "
                             "give a new or empty directory") from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def overwritten_inputs(output_dir: Path, written: Iterable[str], inputs: Iterable[tuple[str, str | Path | None]]) -> list[str]:
    """One problem for each input that an output would replace or delete. `written` are the run's outputs as
    patterns relative to `output_dir` (`*` within one name; `**` alone: anything below it); `inputs` are
    (flag, path) pairs, a directory standing for the files in it (a checkpoint, a folder of rubrics)."""
    out = output_dir.resolve()
    patterns = [*written, LOCK_FILE]
    problems = []
    for flag, given in inputs:
        for file in _files(Path(given)) if given else []:
            try:
                where = file.resolve().relative_to(out).as_posix()
            except ValueError:  # not under --output_dir
                continue
            if any(pattern == "**" or (where.count("/") == pattern.count("/") and fnmatchcase(where, pattern)) for pattern in patterns):
                problems.append(f"{flag} {given}: this run would overwrite {file}, one of its inputs; "
                                "give another output directory, or move the input")
    return problems


def _files(path: Path) -> list[Path]:
    if path.is_dir():
        return sorted(p for p in path.iterdir() if p.is_file())
    return [path] if path.is_file() else []
