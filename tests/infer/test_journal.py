import json

import pytest

from mmjudge.infer.journal import Journal, clear, fingerprint, read_finished, setting_fingerprints
from mmjudge.judge.data import UsageError
from mmjudge.judge.testing import judge_result


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


def test_a_refusal_names_the_settings_that_changed_where_the_header_records_them(tmp_path):
    before = {"mode": "generate", "max_new_tokens": 512, "deterministic": True, "images": "abc", "extra": 1}
    after = {"mode": "generate", "max_new_tokens": 256, "images": "abd", "extra": 1}
    Journal(tmp_path, "r.json", rank=0, run_fingerprint=fingerprint(before), settings=setting_fingerprints(before)).close()
    with pytest.raises(UsageError, match=r"other settings \(deterministic scoring, the images \(a file's size or time\), --max_new_tokens\); "):
        read_finished(tmp_path, "r.json", fingerprint(after), settings=setting_fingerprints(after))
    assert read_finished(tmp_path, "r.json", fingerprint(before), settings=setting_fingerprints(before)) == {}  # the same: resumed
    # the pair options named are those the fingerprint holds (PAIR_OPTIONS), --top_p among them
    pairs = tmp_path / "pairs"
    pairs.mkdir()
    one, other = {"pairs": {"top_p": 1.0}}, {"pairs": {"top_p": 0.2}}
    Journal(pairs, "r.json", rank=0, run_fingerprint=fingerprint(one), settings=setting_fingerprints(one)).close()
    with pytest.raises(UsageError, match=r"other settings \(the pair options \(--pair_rule, .*--top_p, --seed\)\)"):
        read_finished(pairs, "r.json", fingerprint(other), settings=setting_fingerprints(other))


@pytest.mark.parametrize("content", [b"", b'{"fingerpr'])  # killed before its header was written whole
def test_a_journal_without_a_whole_header_holds_no_result_and_is_started_again(tmp_path, content):
    (tmp_path / "r.json.journal.rank0.jsonl").write_bytes(content)
    assert read_finished(tmp_path, "r.json", "fp") == {}  # it was refused "as written by a run with other settings"
    journal = Journal(tmp_path, "r.json", rank=0, run_fingerprint="fp")
    journal.append([judge_result("a", 1)])
    journal.close()
    assert list(read_finished(tmp_path, "r.json", "fp")) == ["a"]


def test_damaged_lines_are_named_and_their_samples_scored_again(tmp_path, capsys):
    journal = Journal(tmp_path, "r.json", rank=0, run_fingerprint="fp")
    journal.append([judge_result("a", 1)])
    journal.close()
    infinite = judge_result("d", 2).model_dump_json().replace('"score":2', '"score":1e400').encode()  # inf: it crashed the merge
    assert b"1e400" in infinite
    damage = [b'{"id": "b", "score": "not a result"}', b"\xff\xfe not UTF-8", b"[" * 100_000, b'{"id": ' + b"9" * 5000 + b"}", b"[1, 2]", infinite]
    with (tmp_path / "r.json.journal.rank0.jsonl").open("ab") as f:
        f.write(b"\n".join(damage) + b"\n")
    journal = Journal(tmp_path, "r.json", rank=0, run_fingerprint="fp")
    journal.append([judge_result("c", 3)])
    journal.close()
    assert sorted(read_finished(tmp_path, "r.json", "fp")) == ["a", "c"]
    assert f"{tmp_path / 'r.json.journal.rank0.jsonl'}: line(s) 3, 4, 5, 6, 7, 8 hold no result (a damaged journal)" in capsys.readouterr().err


def test_a_result_line_with_bytes_that_are_not_utf8_is_damage_not_feedback(tmp_path, capsys):
    """A result whole but for one byte: it was taken, with U+FFFD in its feedback where the byte was."""
    journal = Journal(tmp_path, "r.json", rank=0, run_fingerprint="fp")
    journal.append([judge_result("a", 1), judge_result("b", 2)])
    journal.close()
    path = tmp_path / "r.json.journal.rank0.jsonl"
    lines = path.read_bytes().split(b"\n")
    lines[2] = lines[2].replace(b'"feedback": "', b'"feedback": "\xe9', 1)
    assert lines[2] != path.read_bytes().split(b"\n")[2]
    path.write_bytes(b"\n".join(lines))
    assert list(read_finished(tmp_path, "r.json", "fp")) == ["a"]
    assert f"{path}: line(s) 3 hold no result (a damaged journal)" in capsys.readouterr().err


def test_a_journal_whose_first_line_is_no_header_is_named_as_damaged(tmp_path):
    (tmp_path / "r.json.journal.rank0.jsonl").write_text('{"id": "a"}\n')
    with pytest.raises(UsageError, match="its first line is not a journal header"):
        read_finished(tmp_path, "r.json", "fp")


def test_with_the_rubrics_a_score_or_criterion_off_its_scale_or_an_unknown_category_is_damage(tmp_path, capsys):
    from mmjudge.judge.prompts import load_rubrics

    rubrics = load_rubrics()  # MMIE's: 0-6
    journal = Journal(tmp_path, "r.json", rank=0, run_fingerprint="fp")
    journal.append([judge_result("a", 6, criteria={"text_quality": 0}), judge_result("b", 999), judge_result("c", 3, criteria={"text_quality": 7}),
                    judge_result("d", 2, category="ZZ"), judge_result("e", None)])
    journal.close()
    assert sorted(read_finished(tmp_path, "r.json", "fp", rubrics=rubrics)) == ["a", "e"]
    assert "line(s) 3, 4, 5 hold no result (a damaged journal)" in capsys.readouterr().err
    assert sorted(read_finished(tmp_path, "r.json", "fp")) == ["a", "b", "c", "d", "e"]  # as a record, each is whole
