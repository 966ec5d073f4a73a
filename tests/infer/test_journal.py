import json

import pytest

from infer.journal import Journal, clear, read_finished
from judge.data import UsageError
from judge.testing import judge_result


def test_results_survive_a_torn_last_line_and_are_not_duplicated(tmp_path):
    journal = Journal(tmp_path, "out.json", rank=0, run_fingerprint="abc")
    journal.append([judge_result("a", 1), judge_result("b", 2)])
    journal.close()
    with (tmp_path / "out.json.journal.rank0.jsonl").open("a") as f:
        f.write('{"id": "c", "sco')  # a kill -9 in the middle of a write
    assert set(read_finished(tmp_path, "out.json", "abc")) == {"a", "b"}
    again = Journal(tmp_path, "out.json", rank=0, run_fingerprint="abc")
    again.append([judge_result("c", 3), judge_result("a", 1)])
    again.close()
    lines = (tmp_path / "out.json.journal.rank0.jsonl").read_text().splitlines()
    assert all(json.loads(line) for line in lines)  # the torn line is gone, not glued to the next record
    finished = read_finished(tmp_path, "out.json", "abc")
    assert sorted(finished) == ["a", "b", "c"] and finished["c"].score == 3


def test_results_come_back_as_they_were_written(tmp_path):
    written = judge_result("SA_1", 4.5, model="m", criteria={"text_quality": 5, "image_quality": None},
                           score_distribution={"0": 0.25, "1": 0.75}, expected_score=0.75, truncated=["image 2 omitted"])
    journal = Journal(tmp_path, "r.json", rank=0, run_fingerprint="fp")
    journal.append([written])
    journal.close()
    assert read_finished(tmp_path, "r.json", "fp") == {"SA_1": written}


def test_journals_of_every_rank_are_read(tmp_path):
    for rank, ids in ((0, ["a"]), (1, ["b", "c"])):
        j = Journal(tmp_path, "r.json", rank=rank, run_fingerprint="fp")
        j.append([judge_result(i, None) for i in ids])
        j.close()
    assert sorted(read_finished(tmp_path, "r.json", "fp")) == ["a", "b", "c"]
    clear(tmp_path, "r.json")
    assert read_finished(tmp_path, "r.json", "fp") == {}


def test_other_settings_refuse_to_resume(tmp_path):
    Journal(tmp_path, "r.json", rank=0, run_fingerprint="one").close()
    with pytest.raises(UsageError, match="--no_resume"):
        read_finished(tmp_path, "r.json", "two")
