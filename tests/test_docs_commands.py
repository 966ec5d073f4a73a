"""Every ```bash block of README.md and of the pages directly under docs/ runs verbatim, in order, in one fresh
folder per page (not the checkout), with the venv's commands first on PATH and no network: a command that exits
non-zero fails its page's test, naming the page, the block's line, the command and its output.

What the folder holds before the first block is what the docs assume a reader has (STAND_INS): the Hub ids the
docs name, as local folders of a tiny random judge (a local folder works wherever a Hub id does), and a few
annotated samples under the file names the docs use. A block that cannot run here at all (it needs a GPU,
several machines, Hub weights or another project's code) is preceded by exactly the line
`<!-- docs-test: skip: REASON -->`; a few command lines are not run inside this test for the reason NOT_RUN
gives (CI runs them itself). Both lists are printed at the end of the run. A server is started in the background
(`judge-serve ... &`) and the block waits for it with curl; every process a page started is ended with its page.
"""

import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SKIP = re.compile(r"^<!-- docs-test: skip: (\S.*?) -->$")
PAGE_TIMEOUT_S = 600  # a hang, not a budget: all pages took 401 s wall, 228 CPU s (2 cores, load average 4-6)
SERVER_PORT = 8000  # judge-serve's default


def ports(page_blocks: list["Block"]) -> set[int]:
    """The ports the page's servers take: judge-serve's default and every --port the blocks give (none: it starts no
    judge-serve)."""
    run = [b.text for b in page_blocks if b.skip is None]
    if not any("judge-serve" in text for text in run):
        return set()
    return {SERVER_PORT} | {int(p) for text in run for p in re.findall(r"--port[= ](\d+)", text)}

# Command lines this test does not run inside itself, each for its reason (CI runs them: .ci/run).
NOT_RUN = {
    r"make test\b": "make test is CI itself, and runs this test",
    r"make setup\b": "make setup built the venv this test runs in",
    r"make docs\b|\.venv-docs/bin/mkdocs\b": "make docs is CI's first step (mkdocs serve: the same site, served)",
    r"make demo\b|judge-demo\b|(\.venv/bin/)?python benchmarks/docs_figures\.py\b":
        "the demo runs end to end in tests/test_docs.py::test_the_figures_script_runs_the_demo_and_writes_the_pages",
    r"pip install (--no-build-isolation )?'?\.(\[|\s|$)": "make test-installed (CI) installs the wheel and its extras into a fresh venv",
    r"(\.venv/bin/)?python -m pytest\b": "the suite runs in make test itself",
}
NOT_RUN_LINE = re.compile(r"^\s*(?:" + "|".join(f"(?:{p})" for p in NOT_RUN) + ")")
# Hub ids the docs name, read from a local folder of the same path: the tiny judge
HUB_IDS = ["MMIE/MMIE-Score", "OpenGVLab/InternVL2-4B"]


@dataclass
class Block:
    page: str
    line: int  # the line of the opening fence
    text: str
    skip: str | None  # the skip marker's reason


def blocks(page: Path) -> list[Block]:
    """The page's ```bash blocks, in order, each with the skip marker's reason when the line before it (blank
    lines apart) is one."""
    lines, found, start = page.read_text().splitlines(), [], None
    for number, line in enumerate(lines, 1):
        if start is None and re.fullmatch(r"\s*```bash\s*", line):
            start = number
        elif start is not None and line.strip() == "```":
            before = next((previous.strip() for previous in reversed(lines[:start - 1]) if previous.strip()), "")
            marker = SKIP.match(before)
            found.append(Block(str(page.relative_to(ROOT)) if page.is_relative_to(ROOT) else page.name, start,
                               textwrap.dedent("\n".join(lines[start:number - 1])), marker.group(1) if marker else None))
            start = None
    return found


def not_run(text: str) -> tuple[str, list[str]]:
    """The block with each NOT_RUN command line (a line continued by a backslash included) left out, and those lines."""
    kept, left_out, lines = [], [], text.split("\n")
    i = 0
    while i < len(lines):
        j = i
        while lines[j].endswith("\\") and j + 1 < len(lines):
            j += 1
        logical = lines[i:j + 1]
        if NOT_RUN_LINE.match(logical[0]):
            left_out.append(logical[0].strip())
            kept += [": # not run here: " + line.replace("\\", "") for line in logical]
        else:
            kept += logical
        i = j + 1
    return "\n".join(kept), left_out


def script(page_blocks: list[Block], status: Path) -> str:
    """One bash script for the page: each block in turn, its number written to `status` first, each command
    to `status`.command as it starts (a DEBUG trap: what a timeout interrupted, or what failed), and `set -e` so
    that the first failure ends the page."""
    parts = ["set -e", f"trap 'echo \"$BASH_COMMAND\" > {status}.command' DEBUG"]
    for number, block in enumerate(page_blocks):
        if block.skip is None:
            parts += [f"echo {number} > {status}", not_run(block.text)[0]]
    return "\n".join(parts) + "\n"


@pytest.fixture(scope="session")
def stand_ins(tmp_path_factory):
    return write_stand_ins(tmp_path_factory.mktemp("stand-ins"))


def write_stand_ins(root: Path) -> Path:
    """What furnish copies into each page's folder: the tiny judge, and data/ with 4 annotated samples as
    answers.json and heldout.json and 4 annotated pairs as pairs.json, with their images."""
    python = [sys.executable, "-m", "mmjudge.judge.testing"]
    subprocess.run([*python, "checkpoint", str(root / "tiny-judge")], check=True, capture_output=True)
    subprocess.run([*python, "pairs", "--pairs", "4", "--annotated", str(root / "data")], check=True, capture_output=True)
    subprocess.run([*python, "dataset", "--samples", "4", "--annotated", str(root / "samples")], check=True, capture_output=True)
    for image in (root / "samples" / "images").iterdir():
        shutil.copyfile(image, root / "data" / "images" / image.name)
    samples = (root / "samples" / "data.json").read_text()
    for name in ["answers.json", "heldout.json"]:
        (root / "data" / name).write_text(samples)
    shutil.rmtree(root / "samples")
    (root / "data" / "data.json").unlink()  # the pairs' own dataset: a page's blocks write data/data.json themselves
    return root


def furnish(folder: Path, stand_ins: Path):
    """The reader's files the docs assume: a copy of the tiny judge at each Hub id the docs name (a page's own,
    whatever it writes there), the stand-ins' data/, and beside data/, for the flags read from the working
    directory, ratings.json, train.json, heldout.json and people.json (the samples), pairs.json, pairs_train.json
    and pairs_heldout.json (the pairs)."""
    for hub_id in HUB_IDS:
        shutil.copytree(stand_ins / "tiny-judge", folder / hub_id)
    shutil.copytree(stand_ins / "data", folder / "data")
    for name, source in [("ratings.json", "heldout.json"), ("train.json", "heldout.json"), ("heldout.json", "heldout.json"),
                         ("people.json", "heldout.json"), ("pairs.json", "pairs.json"), ("pairs_train.json", "pairs.json"),
                         ("pairs_heldout.json", "pairs.json")]:
        shutil.copyfile(folder / "data" / source, folder / name)


def run_page(page_blocks: list[Block], folder: Path, timeout: float = PAGE_TIMEOUT_S) -> str | None:
    """Runs the page's blocks in `folder`; None when every command exited 0, else what failed and its output."""
    status = folder.parent / f"{folder.name}.status"
    status.write_text("")
    Path(f"{status}.command").write_text("")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", "HF_HUB_OFFLINE": "1",
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}
    log = folder.parent / f"{folder.name}.log"  # a file, not a pipe: a server left running keeps a pipe open
    with log.open("w") as out:
        process = subprocess.Popen(["bash", "-c", script(page_blocks, status)], cwd=folder, env=env, stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        try:
            process.wait(timeout=timeout)
            failure = None if process.returncode == 0 else f"exit {process.returncode}"
        except subprocess.TimeoutExpired:
            failure = (f"still running after {timeout:.0f} s (a server in the foreground? start it with `&` and wait for it with "
                       "`curl --retry-connrefused`, as the other pages do)")
        finally:
            end_group(process)
    if failure is None:
        return None
    output = log.read_text(errors="replace")
    number = status.read_text().strip()
    block = page_blocks[int(number)] if number else None
    command = Path(f"{status}.command").read_text().strip()
    where = f"{block.page}:{block.line} (the ```bash block opened on line {block.line})" if block else page_blocks[0].page
    return f"{where}: {failure}; the command: {command}\n--- its output (last 4000 characters) ---\n{output[-4000:]}"


def end_group(process: subprocess.Popen):
    """Ends every process of the page's session (its servers included), politely first."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        deadline = 10
        while deadline > 0:  # the group outlives its leader while a server shuts down
            try:
                os.killpg(process.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)
            deadline -= 0.2


def port_free(port: int) -> bool:
    import socket
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) != 0


RUN_PAGES = [page for page in PAGES if any(block.skip is None for block in blocks(page))]
# Pages run at once: a page's commands are one process after another, each mostly Python starting up on one core
# (a judge-score of 4 samples: 6 CPU s, 2.3 of them importing), so two pages keep CI's two cores busy. Pages whose
# servers take the same port wait for each other (run_pages). This module on the 2-core Xeon beside other sessions'
# work: one page at a time 1,321 s wall, 346 CPU s (load 12-18); two at once 878 s wall, 321 CPU s (load 11-14), and
# 360 s wall, 293 CPU s at load 4-5 (one at a time: 401 s, 228 CPU s at load 4-6, the earlier record below).
PAGES_AT_ONCE = 2


@pytest.fixture(scope="module")
def page_runs(request, stand_ins, tmp_path_factory) -> dict[Path, Future]:
    """Every selected page's run, started at once in PAGES_AT_ONCE threads; each test waits for its own page."""
    selected = [item.callspec.params["page"] for item in request.session.items
                if getattr(item, "originalname", "") == "test_the_pages_commands_run_verbatim"]
    pool = ThreadPoolExecutor(PAGES_AT_ONCE)
    yield run_pages(pool, selected, stand_ins, tmp_path_factory.mktemp("pages"))
    pool.shutdown(cancel_futures=True)  # the pages not started when the run stopped (-x)


def run_pages(pool: ThreadPoolExecutor, pages: list[Path], stand_ins: Path, root: Path) -> dict[Path, Future]:
    """Each page run in `pool` in a folder of its own under `root`, holding its servers' ports while it runs:
    its failure, or None."""
    held = {port: threading.Lock() for page in pages for port in ports(blocks(page))}
    serving = [page for page in pages if ports(blocks(page))]
    others = [page for page in pages if page not in serving]
    pages = [page for pair in itertools.zip_longest(serving, others) for page in pair if page]  # a server's page beside another

    def run(page: Path, folder: Path) -> str | None:
        page_blocks = blocks(page)
        locks = [held[port] for port in sorted(ports(page_blocks))]  # in one order: no two pages wait for each other
        for lock in locks:
            lock.acquire()
        try:
            if taken := sorted(port for port in ports(page_blocks) if not port_free(port)):
                return f"{page.relative_to(ROOT)}'s servers listen on 127.0.0.1:{taken}, which something else holds: stop it"
            folder.mkdir(parents=True)
            furnish(folder, stand_ins)
            return run_page(page_blocks, folder)
        finally:
            for lock in locks:
                lock.release()

    return {page: pool.submit(run, page, root / f"{number}-{page.stem}" / "reader") for number, page in enumerate(pages)}


@pytest.mark.slow
@pytest.mark.parametrize("page", RUN_PAGES, ids=[str(p.relative_to(ROOT)) for p in RUN_PAGES])
def test_the_pages_commands_run_verbatim(page, page_runs):
    failure = page_runs[page].result()
    assert failure is None, failure


def test_every_block_and_line_not_run_is_listed_and_every_marker_is_well_formed(request):
    skipped = [f"{b.page}:{b.line}: {b.skip}" for page in PAGES for b in blocks(page) if b.skip]
    unrun = [f"{b.page}:{b.line}: {line}" for page in PAGES for b in blocks(page) if not b.skip for line in not_run(b.text)[1]]
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is not None and capture is not None:
        with capture.global_and_fixture_disabled():  # printed in make test's output, not captured with the test's
            reporter.write_line(f"\ndocs blocks not run ({len(skipped)}, <!-- docs-test: skip -->):\n  " + "\n  ".join(skipped))
            reporter.write_line(f"docs command lines not run inside the test ({len(unrun)}, NOT_RUN):\n  " + "\n  ".join(unrun))
    for page in PAGES:  # a marker not directly before a block is a typo that would leave its block running
        text = page.read_text()
        markers = list(re.finditer(r"^[ \t]*<!-- docs-test.*$", text, re.MULTILINE))
        followed = [m for m in markers if re.match(r"\s*```bash", text[m.end():])]
        assert len(markers) == len(followed) and all(SKIP.match(m.group(0).strip()) for m in markers), \
            f"{page.relative_to(ROOT)}: a docs-test marker that is not `<!-- docs-test: skip: REASON -->` right before a ```bash block"


def test_a_failing_command_is_named_with_its_page_block_and_output(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# P\n\n```bash\necho one > one.txt\n```\n\n<!-- docs-test: skip: needs a GPU -->\n```bash\nexit 7\n```\n\n"
                    "```bash\ncat one.txt\nmake test   # not run\necho about to fail\nls no-such-file\necho never\n```\n")
    found = blocks(page)
    assert [(b.line, b.skip) for b in found] == [(3, None), (8, "needs a GPU"), (12, None)]
    folder = tmp_path / "reader"
    folder.mkdir()
    failure = run_page(found, folder, timeout=30)
    assert failure.startswith("page.md:12 (the ```bash block opened on line 12): exit 2; the command: ls no-such-file")
    assert "one\n" in failure and "about to fail" in failure and "No such file" in failure and "never" not in failure
    page.write_text("```bash\nsleep 60 &\nsleep 60\n```\n")
    failure = run_page(blocks(page), folder, timeout=2)
    assert "still running after 2 s (a server in the foreground?" in failure and "; the command: sleep 60\n" in failure
