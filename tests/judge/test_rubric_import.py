"""judge-rubric import on a file shaped like MMIE's prompts.py (placeholder wording of our own)."""

import importlib.util
import json

import pytest
from PIL import Image

from mmjudge.infer.cli import main as score_main
from mmjudge.judge.data import Sample
from mmjudge.judge.prompts import build_prompt, load_rubrics
from mmjudge.judge.rubric_cli import main
from mmjudge.judge.templates import get_template
from mmjudge.judge.testing import write_dataset, write_original_checkpoint
from mmjudge.judge.tiling import TilingConfig

PROMPTS_PY = '''
SA_SYSTEM_PROMPT = \'\'\'Rate the story. \\nTrailing spaces stay: \\n1) Text \\u2014 clear.\\nBegin with '### Feedback\\\\n', end with '### Score\\\\n'.\'\'\'

PBL_SYSTEM_PROMPT = \'\'\'Rate the method.\\nSteps must be clear.\'\'\'

MSR_PROMPT = \'\'\'Rate the maths.\'\'\'

def get_prompt(data_id):
    if "SA" in data_id:
        return SA_SYSTEM_PROMPT + "### Question\\n{question}\\n### Answer\\n{answer}\\n### Feedback\\n"
    elif "PBL" in data_id:
        return PBL_SYSTEM_PROMPT + "### Question\\n{question}\\n### Answer\\n{answer}\\n### Feedback\\n"
    elif 'MSR' in data_id:
        return MSR_PROMPT + "### Question\\n{question}\\n### Answer\\n{answer}\\n### Correct Answer\\nThe correct answer is: {gt_answer}\\n### Feedback\\n"
    else:
        print("Unrecognized data.")
'''


def mmie_flatten(segments, number, stop_at=None):
    """MMIE's dataset.py layout, written independently: a line per text and per image, images from 0; the
    answer is read only until the prompt holds `stop_at` images (this segment's text still counts)."""
    text = ""
    for segment in segments:
        if segment.get("text") is not None:
            text += segment["text"] + "\n"
        if stop_at is not None and number >= stop_at:
            break
        if segment.get("image") is not None:
            text += f"Image-{number}: <image>\n"
            number += 1
        if stop_at is not None and number >= stop_at:
            break
    return text, number


@pytest.fixture
def imported(tmp_path):
    source = tmp_path / "prompts.py"
    source.write_text(PROMPTS_PY)
    assert main(["import", str(source), "-o", str(tmp_path / "mmie.yaml")]) == 0
    return source, load_rubrics([tmp_path / "mmie.yaml"])


ANSWERS = [
    [{"text": "A text", "image": "a.png"}, {"text": None, "image": "a.png"}],
    # more answer images than MMIE reads: it stops at the third image of the prompt, and after it
    [{"text": "One", "image": "a.png"}, {"text": "Two", "image": "a.png"}, {"text": "Three", "image": "a.png"}, {"text": "Four", "image": None}],
    [{"text": "One", "image": "a.png"}, {"text": None, "image": "a.png"}, {"text": "Three", "image": "a.png"}],
]


@pytest.mark.parametrize("answer", ANSWERS)
@pytest.mark.parametrize("question_images", [0, 1, 3])
@pytest.mark.parametrize("sample_id", ["SA_0001", "PBL_0002", "MSR_0003"])
def test_imported_rubric_builds_the_prompt_mmie_builds(imported, tmp_path, sample_id, question_images, answer):
    source, rubrics = imported
    Image.new("RGB", (64, 64)).save(tmp_path / "a.png")
    question = [{"text": "Q text", "image": "a.png"}] * question_images + [{"text": "more", "image": None}]
    record = {
        "id": sample_id, "model": "m", "question": question, "answer": answer,
        "gt_answer": [{"text": "42", "image": None}, {"text": "ignored by MMIE", "image": None}],
    }
    spec = importlib.util.spec_from_file_location("mmie_prompts", source)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # our own fixture: running it gives the reference prompt
    question_text, n = mmie_flatten(record["question"], 0)
    answer_text, _ = mmie_flatten(record["answer"], n, stop_at=3)
    expected = module.get_prompt(sample_id).format(question=question_text, answer=answer_text, gt_answer="42")
    sample = Sample.model_validate(record)
    prompt = build_prompt(sample, rubrics[sample.category], get_template("phi3-chat"), None, tmp_path, TilingConfig(max_tiles=1, tokens_per_tile=1))
    assert prompt.text == get_template("phi3-chat").render(expected.replace("<image>", "<img><IMG_CONTEXT></img>"))
    assert len(prompt.images) == expected.count("<image>")  # no image is tiled that MMIE does not show
    assert bool(prompt.truncated) == (answer_text != mmie_flatten(record["answer"], n)[0])  # every cut recorded


def test_import_reads_without_executing_and_keeps_text_byte_for_byte(tmp_path):
    source = tmp_path / "prompts.py"
    source.write_text("raise SystemExit('never run me')\n" + PROMPTS_PY)
    assert main(["import", str(source), "-o", str(tmp_path / "out.yaml")]) == 0
    rubrics = load_rubrics([tmp_path / "out.yaml"])
    assert set(rubrics) == {"SA", "PBL", "MSR"}
    assert rubrics["SA"].instructions == "Rate the story. \nTrailing spaces stay: \n1) Text \u2014 clear.\nBegin with '### Feedback\\n', end with '### Score\\n'."
    assert rubrics["MSR"].use_reference and not rubrics["SA"].use_reference
    assert rubrics["MSR"].criteria == {} and rubrics["MSR"].scale == (0, 6)


def test_file_without_rubrics_is_a_clear_error(tmp_path, capsys):
    (tmp_path / "x.py").write_text("A = 1\n")
    (tmp_path / "bad.py").write_text("def (:\n")
    assert main(["import", str(tmp_path / "x.py"), "-o", str(tmp_path / "o.yaml")]) == 2
    assert "found no rubric" in capsys.readouterr().err
    assert main(["import", str(tmp_path / "bad.py"), "-o", str(tmp_path / "o.yaml")]) == 2
    assert "cannot read it as Python" in capsys.readouterr().err
    (tmp_path / "deep.py").write_text("-" * 200_000 + "1\n")  # a MemoryError in Python's parser, an internal failure
    assert main(["import", str(tmp_path / "deep.py"), "-o", str(tmp_path / "o.yaml")]) == 2
    assert capsys.readouterr().err == f"error: {tmp_path / 'deep.py'}: nested too deeply for Python's parser; not a prompts.py of MMIE's shape\n"


def test_a_prompt_without_the_answer_is_not_imported(tmp_path, capsys):
    # Every prompt would be the same, whatever the answer: refused at import, as at load.
    (tmp_path / "prompts.py").write_text(PROMPTS_PY.replace('"### Question\\n{question}\\n### Answer\\n{answer}\\n### Feedback\\n"\n    elif "PBL"',
                                                            '"### Question\\n{question}\\n### Feedback\\n"\n    elif "PBL"'))
    assert main(["import", str(tmp_path / "prompts.py"), "-o", str(tmp_path / "mmie.yaml")]) == 2
    assert "the SA prompt (line 9) makes no valid rubric: template: {answer} missing" in capsys.readouterr().err
    assert not (tmp_path / "mmie.yaml").exists()


def test_a_prompt_the_reader_would_refuse_is_not_imported(tmp_path, capsys):
    """issue 56: a lone surrogate (Python's "\\ud800" escape) was imported into a YAML file that judge-score then refused."""
    (tmp_path / "prompts.py").write_text(PROMPTS_PY.replace("Rate the maths.", "Rate the maths \\ud800."))
    assert main(["import", str(tmp_path / "prompts.py"), "-o", str(tmp_path / "mmie.yaml")]) == 2
    assert capsys.readouterr().err == (f"error: {tmp_path / 'prompts.py'}: the rubric it makes would be refused when read ([2].instructions: "
                                       "holds a lone surrogate (\\ud800): half of a UTF-16 pair, no character); nothing written\n")
    assert not (tmp_path / "mmie.yaml").exists()


def test_import_never_writes_over_the_file_it_reads(tmp_path, capsys):
    (tmp_path / "prompts.py").write_text(PROMPTS_PY)
    assert main(["import", str(tmp_path / "prompts.py"), "-o", str(tmp_path / "prompts.py")]) == 2
    assert f"import {tmp_path / 'prompts.py'}: this run would overwrite" in capsys.readouterr().err
    assert (tmp_path / "prompts.py").read_text() == PROMPTS_PY


def test_the_readme_recipe_scores_with_an_imported_rubric(imported, tmp_path):
    """README's exact-MMIE recipe: judge-rubric import, then judge-score --rubric mmie.yaml --max_tiles 12."""
    data = write_dataset(tmp_path / "data", 4, seed=1).parent
    checkpoint = write_original_checkpoint(tmp_path / "judge")
    out = tmp_path / "out"
    assert score_main(["--model_path", str(checkpoint), "--input_dir", str(data), "--input_file", "data.json", "--output_dir", str(out),
                       "--rubric", str(tmp_path / "mmie.yaml"), "--max_tiles", "12", "--max_new_tokens", "4"]) == 0
    results = json.loads((out / "eval_result.json").read_text())
    assert len(results) == 4 and all(r["criteria"] == {} for r in results)  # MMIE's prompts ask for the overall score only


def test_two_prompts_for_one_category_are_refused_not_written_twice(tmp_path, capsys):
    # The file was written with two SA rubrics, which judge-score then refused as "a second rubric for category SA".
    (tmp_path / "prompts.py").write_text(PROMPTS_PY + '''
def get_other_prompt(data_id):
    if "SA" in data_id:
        return PBL_SYSTEM_PROMPT + "### Question\\n{question}\\n### Answer\\n{answer}\\n### Feedback\\n"
''')
    assert main(["import", str(tmp_path / "prompts.py"), "-o", str(tmp_path / "mmie.yaml")]) == 2
    assert "two branches return a SA prompt (lines 9 and 19); keep the one MMIE's judge should use" in capsys.readouterr().err
    assert not (tmp_path / "mmie.yaml").exists()


def test_a_line_break_in_the_source_path_stays_inside_the_header_comment(tmp_path):
    # The path was written into the YAML comment as it is: its second line became YAML of its own.
    folder = tmp_path / "a\n- category: X"
    folder.mkdir()
    (folder / "prompts.py").write_text(PROMPTS_PY)
    assert main(["import", str(folder / "prompts.py"), "-o", str(tmp_path / "mmie.yaml")]) == 0
    assert set(load_rubrics([tmp_path / "mmie.yaml"])) == {"SA", "PBL", "MSR"}
    assert (tmp_path / "mmie.yaml").read_text().startswith(f"# Imported by judge-rubric from {json.dumps(str(folder / 'prompts.py'))};")
