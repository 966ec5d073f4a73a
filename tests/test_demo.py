"""judge-demo (`make demo`), run as a user runs it, at a reduced size: every step succeeds, the report is
written from splits that share no id, and a failing step stops the demo with its exit code."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from demo.cli import main as demo_main

BIN = Path(sys.executable).parent


def test_demo_runs_end_to_end_at_a_reduced_size(tmp_path):
    done = subprocess.run([str(BIN / "judge-demo"), "--output_dir", str(tmp_path), "--samples", "10", "--max_steps", "1"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert set(report["judges"]) == {"before", "after"} and (tmp_path / "report" / "report.html").is_file()
    assert re.search(r"before: Pearson .*\n +after: Pearson ", done.stdout)
    ids = {name: {r["id"] for r in json.loads((tmp_path / "data" / f"{name}.json").read_text())} for name in ("train", "validation", "test")}
    assert [len(part) for part in ids.values()] == [6, 2, 2]
    assert set.union(*ids.values()) == {r["id"] for r in json.loads((tmp_path / "data" / "data.json").read_text())}


def test_demo_stops_with_the_failing_steps_exit_code(tmp_path, capsys):
    (tmp_path / "base-judge").write_text("a file where the demo writes its judge")
    with pytest.raises(SystemExit) as stopped:
        demo_main(["--output_dir", str(tmp_path), "--samples", "10"])
    assert stopped.value.code == 1
    assert "FAILED" in capsys.readouterr().out and not (tmp_path / "data").exists()


def test_splits_too_small_to_hold_a_sample_are_refused_before_any_step(tmp_path, capsys):
    assert demo_main(["--output_dir", str(tmp_path / "out"), "--samples", "2"]) == 2
    assert "leave no sample for validation and test" in capsys.readouterr().err and not (tmp_path / "out").exists()
