"""YAML a user gives (rubrics, presets, criteria) that would take the machine's memory is refused with one
line naming the file."""

import pytest

from mmjudge.infer.cli import main as score_main
from mmjudge.judge.data import InputError
from mmjudge.judge.prompts import load_rubrics
from mmjudge.judge.yamlfile import MAX_YAML_BYTES, read_yaml

# Seven lines that stand for 9**7 (4.8 million) strings once the aliases are expanded.
ALIAS_BOMB = "".join(f"{name}: &{name} [{', '.join([f'*{prev}' if prev else 'lol'] * 9)}]\n"
                     for prev, name in zip(["", "a", "b", "c", "d", "e", "f"], "abcdefg"))


def test_an_alias_bomb_as_a_preset_is_one_short_line(tmp_path, capsys):
    # It once made an 80-MB error message (the setting's value, printed), then a MemoryError.
    (tmp_path / "preset.yaml").write_text(ALIAS_BOMB + "max_tiles: *g\n")
    assert score_main(["--model_path", str(tmp_path / "no-model"), "--input_dir", str(tmp_path), "--input_file", "none.json",
                       "--format", "mmie", "--config", str(tmp_path / "preset.yaml")]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {tmp_path / 'preset.yaml'}: more than 1,000,000 values (aliases expanded); no input of this toolkit holds so many\n"


def test_a_few_aliases_as_yaml_dump_writes_them_are_read(tmp_path):
    (tmp_path / "c.yaml").write_text("shared: &s {judge_model_type: text only}\ntask_a: *s\ntask_b: *s\n")
    assert read_yaml(tmp_path / "c.yaml")["task_b"] == {"judge_model_type": "text only"}


def test_a_rubric_larger_than_any_real_one_is_refused_before_it_is_parsed(tmp_path):
    # A 30-MB rubric once took 8.4 GB while PyYAML parsed it.
    text = "category: SA\ntemplate: '{instructions}{question}{answer}'\ninstructions: '" + "x" * MAX_YAML_BYTES + "'\n"
    (tmp_path / "big.yaml").write_text(text)
    with pytest.raises(InputError, match=rf"big.yaml: {len(text):,} bytes; a YAML file read here holds at most {MAX_YAML_BYTES:,}"):
        load_rubrics([tmp_path / "big.yaml"])


@pytest.mark.slow
def test_deeply_nested_yaml_is_refused_not_a_crash(tmp_path):
    (tmp_path / "deep.yaml").write_text("category: SA\ninstructions: " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(InputError, match="deep.yaml: nested more than 100 levels deep"):
        load_rubrics([tmp_path / "deep.yaml"])


def test_a_key_given_twice_is_named_not_silently_replaced(tmp_path):
    # A rubric with two `instructions:` was read with the second alone, the first lost without a word.
    (tmp_path / "r.yaml").write_text("category: X\ninstructions: first\nscale: [0, 6]\ninstructions: second\n")
    with pytest.raises(InputError) as err:
        load_rubrics([tmp_path / "r.yaml"])
    assert str(err.value.problems[0]) == (f"{tmp_path / 'r.yaml'}: invalid YAML at line 4, column 1: the key 'instructions' a second time "
                                          "in one mapping (first at line 2); give it once")
    # a merge key's values are defaults that the mapping's own keys override, as YAML means them
    (tmp_path / "m.yaml").write_text("base: &b {max_tiles: 1, seed: 2}\npreset:\n  <<: *b\n  max_tiles: 4\n")
    assert read_yaml(tmp_path / "m.yaml")["preset"] == {"max_tiles": 4, "seed": 2}
