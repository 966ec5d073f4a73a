"""judge-rubric import: turn a Python rubric file such as MMIE's prompts.py into this toolkit's YAML.

    judge-rubric import MMIE/prompts.py -o rubrics/mmie.yaml
    judge-rubric import --benchmark vlrewardbench VL_RewardBench/prompt.py -o vlrewardbench.yaml

With --benchmark, the file is a pairwise benchmark's and its judge prompt becomes a pairwise rubric
(judge/pairwise_prompts.py says which file of each benchmark, and what is read from it).

The file is parsed with `ast` and never executed. It must have the shape of MMIE's: module-level string
constants holding each category's instructions, and a function whose branches read
`if "SA" in data_id: return SA_PROMPT + "### Question\\n{question}..."`. The prompt is kept byte for byte;
the reference-answer field `{gt_answer}` becomes this toolkit's `{reference}`. The rubrics also keep how
MMIE reads an answer (up to 3 images in the prompt), so that the prompt is MMIE's whatever the sample.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
import tempfile
from pathlib import Path

import yaml
from pydantic import ValidationError

from mmjudge.judge.cli import CommandParser, add_common_flags, run
from mmjudge.judge.data import InputError, UsageError, missing_file, validation_problems, write_text_atomically
from mmjudge.judge.outputs import overwritten_inputs
from mmjudge.judge.pairwise_prompts import IMPORTERS
from mmjudge.judge.parsing import ScoreScale
from mmjudge.judge.prompts import Rubric, load_rubrics

# MMIE's dataset.py stops reading an answer once the prompt holds 3 images; the imported rubrics keep that.
MMIE_ANSWER_STOP = 3


def _string_constants(tree: ast.Module) -> dict[str, str]:
    constants = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    constants[target.id] = node.value.value
    return constants


def _branch_category(test: ast.expr) -> str | None:
    """"SA" from `"SA" in data_id` (or 'SA' in ...)."""
    if isinstance(test, ast.Compare) and isinstance(test.left, ast.Constant) and isinstance(test.ops[0], ast.In):
        return test.left.value if isinstance(test.left.value, str) else None
    return None


def _returned_prompt(body: list[ast.stmt], constants: dict[str, str]) -> tuple[str, str] | None:
    """(instructions, layout) from `return CONSTANT + "layout"`."""
    for stmt in body:
        if isinstance(stmt, ast.Return) and isinstance(stmt.value, ast.BinOp) and isinstance(stmt.value.op, ast.Add):
            left, right = stmt.value.left, stmt.value.right
            if isinstance(left, ast.Name) and left.id in constants and isinstance(right, ast.Constant) and isinstance(right.value, str):
                return constants[left.id], right.value
    return None


def import_rubrics(path: Path, scale: tuple[int, int]) -> list[Rubric]:
    if not path.is_file():
        raise UsageError(f"{path}: {missing_file(path)}")
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (OSError, SyntaxError, UnicodeDecodeError) as err:
        raise UsageError(f"{path}: cannot read it as Python ({err})") from None
    except (MemoryError, RecursionError):  # Python's parser gives up on nesting this deep (200,000 unary minus signs)
        raise UsageError(f"{path}: nested too deeply for Python's parser; not a prompts.py of MMIE's shape") from None
    constants = _string_constants(tree)
    rubrics, lines = [], {}  # the line of each category's first branch
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and (category := _branch_category(node.test)):
            if (prompt := _returned_prompt(node.body, constants)) is None:
                continue
            if category in lines:  # a rubric set holds one rubric per category: which of the two is meant is the user's call
                first, second = sorted((lines[category], node.lineno))
                raise UsageError(f"{path}: two branches return a {category} prompt (lines {first} and {second}); keep the one MMIE's judge should use")
            lines[category] = node.lineno
            instructions, layout = prompt
            try:
                rubrics.append(Rubric(
                    category=category,
                    scale=scale,
                    criteria={},  # MMIE's judge gives one overall score
                    instructions=instructions,
                    template="{instructions}" + layout.replace("{gt_answer}", "{reference}"),
                    use_reference="{gt_answer}" in layout,
                    answer_stops_at_images=MMIE_ANSWER_STOP,
                ))
            except ValidationError as err:
                reasons = "; ".join(p.message for p in validation_problems(path, None, None, err))
                raise UsageError(f"{path}: the {category} prompt (line {node.lineno}) makes no valid rubric: {reasons}") from None
    if not rubrics:
        raise UsageError(
            f"{path}: found no rubric; expected string constants and branches like "
            "`if \"SA\" in data_id: return SA_PROMPT + \"### Question\\n{question}...\"`"
        )
    return rubrics


def build_parser() -> argparse.ArgumentParser:
    p = CommandParser(prog="judge-rubric", description=__doc__)
    add_common_flags(p)
    sub = p.add_subparsers(dest="command", required=True)
    imp = sub.add_parser("import", help="convert a prompts.py file into rubric YAML")
    imp.add_argument("path", path="file", help="the Python rubric file, e.g. MMIE's prompts.py")
    imp.add_argument("-o", "--output", required=True, path="output_file", help="the YAML file to write; missing folders are made")
    imp.add_argument("--scale", nargs=2, type=int, default=[ScoreScale.low, ScoreScale.high], metavar=("LOW", "HIGH"),
                     help=f"score scale the prompts ask for (default: {ScoreScale.low} {ScoreScale.high}, MMIE's)")
    imp.add_argument("--benchmark", choices=["mmie", *IMPORTERS], default="mmie",
                     help="whose prompt file it is: MMIE's prompts.py, or a pairwise benchmark's (judge-score --format of the same name "
                          "judges with the rubric) (default: %(default)s)")
    add_common_flags(imp)
    return p


def main(argv=None) -> int:
    return run(_main, argv)


def _main(argv) -> int:
    args = build_parser().parse_args(argv)
    output = Path(args.output)
    if problems := overwritten_inputs(output.parent, [output.name], [("import", args.path)]):
        raise UsageError(problems[0])
    if args.benchmark != "mmie" and args.scale != [ScoreScale.low, ScoreScale.high]:
        raise UsageError(f"--scale applies to MMIE's prompts; {args.benchmark}'s judge gives a verdict, not a score")
    rubrics = import_rubrics(Path(args.path), tuple(args.scale)) if args.benchmark == "mmie" else IMPORTERS[args.benchmark](Path(args.path))
    # quoted as JSON: a path with a line break in it would otherwise end the comment and write YAML of its own
    header = f"# Imported by judge-rubric from {json.dumps(args.path, ensure_ascii=False)}; the prompt text is kept byte for byte.\n"
    body = yaml.safe_dump([r.model_dump(mode="json") for r in rubrics], allow_unicode=True, sort_keys=False, width=10**6)
    read_back(header + body, args.path)
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomically(output, header + body)
    except OSError as err:
        raise UsageError(f"-o {args.output}: cannot write it ({err.strerror})") from None
    print(f"{args.output}: {', '.join(r.category for r in rubrics)}")
    return 0


def read_back(text: str, source: str) -> None:
    """The rubric file as judge-score reads it (load_rubrics), or a UsageError naming what the reader would refuse
    (a lone surrogate in a prompt, which Python's string escapes allow and no tokenizer takes): import writes
    only what reads back."""
    with tempfile.TemporaryDirectory(prefix="mmjudge-rubric-") as folder:
        written = Path(folder) / "rubric.yaml"
        written.write_text(text, encoding="utf-8")
        try:
            load_rubrics([written])
        except InputError as err:
            found = "; ".join(f"{p.field}: {p.message}" if p.field else p.message for p in err.problems)
            raise UsageError(f"{source}: the rubric it makes would be refused when read ({found}); nothing written") from None


if __name__ == "__main__":
    sys.exit(main())
