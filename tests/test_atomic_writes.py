"""Files a later command reads (calibrator.json, judge_config.json, eval_history.json) are replaced whole:
a write cut short, here by a full disk at the last moment, leaves the previous file as it was."""

import errno
import json
import os
from dataclasses import replace

import pytest

from mmjudge.judge.calibrator import Calibrator
from mmjudge.judge.checkpoint import JudgeSettings
from mmjudge.judge.model import read_settings, write_settings
from mmjudge.judge.templates import TEMPLATES
from mmjudge.judge.testing import write_native_checkpoint
from mmjudge.judge.tiling import TilingConfig
from mmjudge.train.recipe import append_history

BASE = JudgeSettings(TEMPLATES["Hermes-2"], None, TilingConfig())  # every field of the file is read over it


@pytest.fixture
def full_disk(monkeypatch):
    def fail():
        def no_space(fd):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(os, "fsync", no_space)

    return fail


def test_a_calibrator_cut_short_leaves_the_previous_one(tmp_path, full_disk):
    path = tmp_path / "calibrator.json"
    first = Calibrator(method="linear", source="score", x=[0, 6], y=[1, 5], scale=(0, 6), fitted_on=None)
    first.save(path)
    full_disk()
    with pytest.raises(OSError):
        Calibrator(method="linear", source="score", x=[0, 6], y=[0, 6], scale=(0, 6), fitted_on=None).save(path)
    assert Calibrator.load(path) == first
    assert [p.name for p in tmp_path.iterdir()] == ["calibrator.json"]


def test_judge_settings_cut_short_leave_the_previous_ones(tmp_path, full_disk):
    checkpoint = write_native_checkpoint(tmp_path / "judge")
    settings = read_settings(checkpoint, BASE)
    before = (checkpoint / "judge_config.json").read_text()
    full_disk()
    with pytest.raises(OSError):
        write_settings(replace(settings, template=TEMPLATES["internlm2-chat"]), checkpoint)
    assert (checkpoint / "judge_config.json").read_text() == before
    assert read_settings(checkpoint, BASE) == settings


def test_an_evaluation_history_cut_short_keeps_the_evaluations_before(tmp_path, full_disk):
    path = tmp_path / "eval_history.json"
    append_history(path, {"step": 100, "overall_pearson": 0.5})
    full_disk()
    with pytest.raises(OSError):
        append_history(path, {"step": 200, "overall_pearson": 0.6})
    assert json.loads(path.read_text()) == [{"step": 100, "overall_pearson": 0.5}]
