"""Progress that moves while the work does: the engine reports each token's share of a sample, a decoding step's
at once, so a batch that holds every sample (a CPU run) moves the bar at each step, before it ends; under several ranks, rank 0's bar counts them all."""

import os
import re
import socket
import sys

import pytest
import torch.multiprocessing as mp

from mmjudge.infer import progress
from mmjudge.infer.engine import Scorer, prepare
from mmjudge.infer.options import ScoreOptions
from mmjudge.judge.data import load_samples
from mmjudge.judge.model import load_judge
from mmjudge.judge.prompts import load_rubrics
from mmjudge.judge.testing import write_dataset


@pytest.fixture(scope="module")
def prepared(checkpoint, tmp_path_factory):
    data = write_dataset(tmp_path_factory.mktemp("data"), 6, seed=0).parent
    judge = load_judge(checkpoint)
    rubrics = load_rubrics()
    samples = list(enumerate(load_samples(data / "data.json", data)))
    return judge, rubrics, prepare(judge, samples, rubrics, data, ScoreOptions(max_new_tokens=8, max_tiles=1))


def test_every_token_moves_the_bar_before_its_batch_ends_and_the_samples_add_up_to_one_each(prepared):
    judge, rubrics, items = prepared
    told, seen_at_first_result = [], None
    runs = Scorer(judge, rubrics, ScoreOptions(max_new_tokens=8, max_tiles=1, ignore_stop=True), "cpu").run(items, progress=told.append)
    results = []
    for batch in runs:
        if seen_at_first_result is None:
            seen_at_first_result = sum(told[:-1])  # before the finished samples' rest
        results += batch
    assert len(results) == len(items) == 6
    # One batch holds all six (a CPU run): 7 of each sample's 8 tokens are told as they are written, each an eighth,
    # a decoding step's six at once.
    assert seen_at_first_result == pytest.approx(6 * 7 / 8) and told[:-1] == [6 / 8] * 7
    assert sum(told) == pytest.approx(len(items))


def test_a_bar_of_one_process_ends_on_its_total_exactly(capsys):
    with progress.Bar("scoring", 3) as bar:
        for _ in range(3 * 7):
            bar.update(1 / 7)
    assert bar.bar.n == 3 * progress.UNITS  # thousandths add up exactly: no 2.9999/3 at the end
    assert re.findall(r"scoring: 100%\|\S+\| 3/3 ", capsys.readouterr().err)



def test_on_an_output_that_is_not_a_terminal_a_bar_writes_a_whole_line_every_few_seconds(capsys, monkeypatch):
    """A log gets a line at the start, one per LINE_EVERY_S seconds and one at the end, not every redraw: 300
    updates over 30 s (tqdm's clock, counted here) write 8 lines, none with a carriage return or a cursor move."""
    import tqdm.std

    now = [0.0]
    monkeypatch.setattr(tqdm.std, "time", lambda: now[0])
    assert not sys.stderr.isatty()  # captured, as a log or a pipe is
    with progress.Bar("scoring", 300) as bar:
        for _ in range(300):
            now[0] += 0.1
            bar.update(1)
    err = capsys.readouterr().err
    assert "\r" not in err and "\x1b" not in err
    lines = err.splitlines()
    assert all(line.startswith("scoring: ") for line in lines) and re.search(r"100%\|\S+\| 300/300 ", lines[-1])
    assert 6 <= len(lines) <= 9  # 0 s, every 5 s to 30 s, and the end


def test_transformers_bars_are_off_where_stderr_is_no_terminal():
    """judge-score loading a judge-train output drew transformers' "Loading weights" bar, redraws and all, into
    the demo's log (the demo's test finds them there)."""
    from transformers.utils import logging as transformers_logging

    # The switch is global: a judge-score run earlier in this process (tests/infer/test_score.py) has turned it off.
    was_on = transformers_logging.is_progress_bar_enabled()
    transformers_logging.enable_progress_bar()
    assert not sys.stderr.isatty()
    try:
        progress.quiet_library_bars()
        assert not transformers_logging.is_progress_bar_enabled()
    finally:
        (transformers_logging.enable_progress_bar if was_on else transformers_logging.disable_progress_bar)()  # as found


def _rank(rank: int, port: int, shares: list[float], errors) -> None:
    """One rank of two, in its own process: a process group over gloo, then its share of a bar of 10."""
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    sys.stderr = errors
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        with progress.Bar("scoring", 10, rank, 2, key="test") as bar:
            for part in shares:
                bar.update(part)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_under_two_ranks_rank_0s_bar_counts_both(tmp_path):
    # Rank 0 does 3 samples; rank 1 does 7, in parts: rank 0's bar follows it to 10 of 10.
    port, shares = free_port(), {0: [1.0] * 3, 1: [0.25] * 28}
    logs = {rank: tmp_path / f"rank{rank}.err" for rank in (0, 1)}
    context = mp.get_context("fork")  # a spawned child could not import this test module by name
    ranks = [context.Process(target=_run_rank, args=(rank, port, shares[rank], str(logs[rank]))) for rank in (0, 1)]
    for p in ranks:
        p.start()
    for p in ranks:
        p.join(120)
    assert [p.exitcode for p in ranks] == [0, 0], [log.read_text()[-2000:] for log in logs.values()]
    shown = logs[0].read_text()
    assert re.findall(r"scoring: 100%\|\S+\| 10/10 ", shown)
    assert "/3 " not in shown  # never rank 0's share alone
    assert logs[1].read_text() == ""  # the other ranks draw no bar


def _run_rank(rank: int, port: int, shares: list[float], log: str) -> None:
    with open(log, "w") as errors:
        _rank(rank, port, shares, errors)
