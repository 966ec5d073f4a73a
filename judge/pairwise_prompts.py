"""The pairwise benchmarks' judge prompts, read from their own code as data (parsed with `ast`, never run)
into pairwise rubrics, for `judge-rubric import --benchmark NAME`. The prompt text is kept byte for byte;
what the code puts around it (the chat message's parts, the answers' order, the verdict it asks for) becomes
the rubric's layout and verdict format.

    benchmark      file of its repository                        what is read
    vlrewardbench  prompt.py                                     the f-string its prompt() returns: query and the two answers
    mmrewardbench  scripts/1_run_model_as_judge_gpt4o.py          judge_prompt, a str.format template
    mmrb2          evaluate/generate_judgements/evaluator_apis/   each task's get_*_prompt(), and (from the local evaluator
                   llm_judges/evaluation_prompts.py               beside it) the message it builds: the prompt, then labelled
                                                                  prompt contents and responses
    opening        IntJudge_judge_AB.py                          SYSTEM_MESSAGE, the <INPUT>/<OUTPUT_A>/<OUTPUT_B> prefixes
                                                                  and the closing instruction

Each reads one file of the shape of the benchmark's (a commit its docs/benchmarks.md names); a file of
another shape is refused, naming what was not found, rather than imported wrong.
"""

from __future__ import annotations

import ast
from pathlib import Path
from string import Formatter

from pydantic import ValidationError

from mmjudge.judge.data import UsageError, missing_file, validation_problems
from mmjudge.judge.formats.mmrb2 import TASKS
from mmjudge.judge.prompts import Rubric

PAIR_FIELDS = ("question", "answer_a", "answer_b")
# A rubric fills its fields as text (judge/prompts.py): a conversion or a format spec in the benchmark's prompt
# is refused, not dropped, as Rubric refuses one in a template.
AS_TEXT = "a rubric fills its fields as text, with no conversion or format spec"


def parse(path: Path) -> ast.Module:
    if not path.is_file():
        raise UsageError(f"{path}: {missing_file(path)}")
    try:
        return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (OSError, SyntaxError, UnicodeDecodeError) as err:
        raise UsageError(f"{path}: cannot read it as Python ({err})") from None
    except (MemoryError, RecursionError):  # Python's parser gives up on nesting this deep
        raise UsageError(f"{path}: nested too deeply for Python's parser") from None


def _missing(path: Path, what: str) -> UsageError:
    return UsageError(f"{path}: found no {what}; is it the benchmark's own file?")


def _escaped(text: str) -> str:
    """A literal of a rubric template: its braces are text."""
    return text.replace("{", "{{").replace("}", "}}")


def _rubric(path: Path, **fields) -> Rubric:
    try:
        return Rubric(kind="pairwise", **fields)
    except ValidationError as err:
        reasons = "; ".join(p.message for p in validation_problems(path, None, None, err))
        raise UsageError(f"{path}: the prompt makes no valid rubric: {reasons}") from None


def _split_instructions(pieces: list[str | tuple[str]]) -> tuple[str, str]:
    """(instructions, template) of a prompt given as literal text and fields (1-tuples): the text before the
    first field is the instructions, as judge-rubric import makes MMIE's prompt's constant its instructions."""
    first = next(k for k, piece in enumerate(pieces) if isinstance(piece, tuple))
    instructions = "".join(pieces[:first])
    template = "".join(f"{{{piece[0]}}}" if isinstance(piece, tuple) else _escaped(piece) for piece in pieces[first:])
    return instructions, "{instructions}" + template


# -- VL-RewardBench -----------------------------------------------------------------------------------

def _vlrb_field(node: ast.expr) -> str | None:
    """`data_obj["query"]` is the question, `answers[0]` and `answers[1]` the answers in the order shown."""
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        key = node.slice.value
        if key == "query":
            return "question"
        if isinstance(node.value, ast.Name) and node.value.id == "answers" and key in (0, 1):
            return ("answer_a", "answer_b")[key]
    return None


def vlrewardbench(path: Path) -> list[Rubric]:
    tree = parse(path)
    for node in ast.walk(tree):
        if not isinstance(node, ast.JoinedStr):
            continue
        pieces: list[str | tuple[str]] = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                pieces.append(value.value)
            elif isinstance(value, ast.FormattedValue) and (name := _vlrb_field(value.value)):
                if value.conversion != -1 or value.format_spec is not None:
                    raise UsageError(f"{path}: line {value.lineno}: the prompt's {ast.unparse(value.value)} has a conversion or format spec; {AS_TEXT}")
                pieces.append((name,))
            else:
                break
        else:
            if {p for p in pieces if isinstance(p, tuple)} == {(f,) for f in PAIR_FIELDS}:
                instructions, template = _split_instructions(pieces)
                # inference_hf.py sends [prompt text, image] and reads "Overall Judgment: Answer N is better"
                return [_rubric(path, category="vlrewardbench", verdict_format="vlrewardbench", layout="parts", images="end",
                                instructions=instructions, template=template)]
    raise _missing(path, 'f-string of data_obj["query"], answers[0] and answers[1] (its prompt())')


# -- Multimodal RewardBench ---------------------------------------------------------------------------

def _string_assigned(tree: ast.Module, name: str) -> ast.Constant | None:
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                return node.value
    return None


def mmrewardbench(path: Path) -> list[Rubric]:
    prompt = _string_assigned(parse(path), "judge_prompt")
    if prompt is None:
        raise _missing(path, "judge_prompt string")
    try:
        parsed = list(Formatter().parse(prompt.value))
    except ValueError as err:  # a lone brace
        raise UsageError(f"{path}: line {prompt.lineno}: judge_prompt is no str.format template ({err})") from None
    pieces: list[str | tuple[str]] = []
    for literal, name, spec, conversion in parsed:
        pieces.append(literal)
        if name is not None:
            if name not in PAIR_FIELDS:
                raise UsageError(f"{path}: judge_prompt has a field {{{name}}}; Multimodal RewardBench's are {', '.join(PAIR_FIELDS)}")
            if spec or conversion:
                raise UsageError(f"{path}: line {prompt.lineno}: judge_prompt's field {{{name}}} has a conversion or format spec; {AS_TEXT}")
            pieces.append((name,))
    if missing := [name for name in PAIR_FIELDS if (name,) not in pieces]:
        raise UsageError(f"{path}: line {prompt.lineno}: judge_prompt has no field {', '.join(f'{{{name}}}' for name in missing)}; "
                         f"Multimodal RewardBench's prompt holds {', '.join(PAIR_FIELDS)}")
    instructions, template = _split_instructions(pieces)
    # its judge script sends [prompt text, image] and its scorer reads [[A]] or [[B]]
    return [_rubric(path, category="mmrewardbench", verdict_format="brackets", layout="parts", images="end",
                    instructions=instructions, template=template)]


# -- MMRB2 --------------------------------------------------------------------------------------------

def _returned_string(function: ast.FunctionDef) -> str | None:
    for node in function.body:
        if isinstance(node, ast.Return) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            return node.value.value
    return None


def _task_prompts(evaluate: ast.FunctionDef) -> dict[str, str]:
    """Task -> the get_*_prompt function its branch calls: `if task_type == "image": evaluation_prompt =
    get_image_gen_prompt()`, or `elif task_type in ("text", "reasoning"): ...`."""
    tasks = {}
    for node in ast.walk(evaluate):
        if not (isinstance(node, ast.If) and isinstance(node.test, ast.Compare) and isinstance(node.test.left, ast.Name)
                and node.test.left.id == "task_type"):
            continue
        compared = node.test.comparators[0]
        names = [compared.value] if isinstance(compared, ast.Constant) else [e.value for e in getattr(compared, "elts", []) if isinstance(e, ast.Constant)]
        calls = [s.value.func.id for s in node.body if isinstance(s, ast.Assign) and isinstance(s.value, ast.Call) and isinstance(s.value.func, ast.Name)]
        for name in names:
            if calls:
                tasks[name] = calls[0]
    return tasks


def _message_layout(evaluate: ast.FunctionDef) -> list[str | tuple[str]] | None:
    """The message the evaluator builds, as pieces: `content_list.append(["text", evaluation_prompt])` is the
    instructions, `content_list.append(["text", "[RESPONSE A:]"])` a literal, `content_list.extend(prompt_content)`
    the question and `extend(response_a)`, `extend(response_b)` the answers in the order shown."""
    fields = {"evaluation_prompt": "instructions", "prompt_content": "question", "response_a": "answer_a", "response_b": "answer_b"}
    pieces: list[str | tuple[str]] = []
    for node in ast.walk(evaluate):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "content_list" and len(node.args) == 1):
            continue
        arg = node.args[0]
        if node.func.attr == "extend" and isinstance(arg, ast.Name) and arg.id in fields:
            pieces.append((fields[arg.id],))
        elif node.func.attr == "append" and isinstance(arg, ast.List) and len(arg.elts) == 2:
            value = arg.elts[1]
            if isinstance(value, ast.Name) and value.id in fields:
                pieces.append((fields[value.id],))
            elif isinstance(value, ast.Constant) and isinstance(value.value, str):
                pieces.append(value.value)
    return pieces if {p for p in pieces if isinstance(p, tuple)} == {(f,) for f in fields.values()} else None


def mmrb2(path: Path) -> list[Rubric]:
    functions = {node.name: node for node in ast.walk(parse(path)) if isinstance(node, ast.FunctionDef)}
    prompts = {name: text for name, f in functions.items() if name.endswith("_prompt") and (text := _returned_string(f)) is not None}
    if not prompts:
        raise _missing(path, "get_*_prompt() returning a prompt")
    evaluator = path.with_name("local_pairwise_evaluator.py")  # the evaluator beside it builds the message
    evaluate = next((n for n in ast.walk(parse(evaluator)) if isinstance(n, ast.FunctionDef) and n.name == "pairwise_evaluate"), None)
    if evaluate is None:
        raise _missing(evaluator, "pairwise_evaluate()")
    layout = _message_layout(evaluate)
    if layout is None:
        raise _missing(evaluator, "message of evaluation_prompt, prompt_content, response_a and response_b (content_list)")
    template = "".join(f"{{{p[0]}}}" if isinstance(p, tuple) else _escaped(p) for p in layout)
    rubrics = []
    for task, function in _task_prompts(evaluate).items():
        if task == "text" or function not in prompts:  # "text" shares reasoning's prompt; MMRB2's files are its four tasks
            continue
        if task not in TASKS:  # the task names a rubric category: only MMRB2's own
            raise UsageError(f"{evaluator}: task_type {task!r} is none of MMRB2's four tasks ({', '.join(TASKS)}); is it the benchmark's own file?")
        # the message's parts are joined as the chat template joins them, with nothing between
        rubrics.append(_rubric(path, category=f"mmrb2_{task}", verdict_format="mmrb2", layout="parts", instructions=prompts[function],
                               template=template))
    if len(rubrics) != 4:
        raise _missing(path, "prompt of each of MMRB2's four tasks (image, edit, interleaved, reasoning)")
    return rubrics


# -- OpenING ------------------------------------------------------------------------------------------

def _prefix_of(tree: ast.AST, operand: str) -> str | None:
    """The string added before `operand[0]`: `"<INPUT>: " + input_text[0]`."""
    for node in ast.walk(tree):
        if (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) and isinstance(node.left, ast.Constant)
                and isinstance(node.left.value, str) and isinstance(node.right, ast.Subscript)
                and isinstance(node.right.value, ast.Name) and node.right.value.id == operand):
            return node.left.value
    return None


def _closing_text(function: ast.FunctionDef) -> str | None:
    """The text of the last `content.append({"type": "text", "text": "..."})` with a literal text."""
    found = None
    for node in ast.walk(function):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "append" and node.args:
            arg = node.args[0]
            if isinstance(arg, ast.Dict):
                entries = {k.value: v for k, v in zip(arg.keys, arg.values) if isinstance(k, ast.Constant)}
                text = entries.get("text")
                if isinstance(text, ast.Constant) and isinstance(text.value, str):
                    found = text.value
    return found


def opening(path: Path) -> list[Rubric]:
    tree = parse(path)
    system = _string_assigned(tree, "SYSTEM_MESSAGE")
    function = next((n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "get_gpt4answer"), None)
    if system is None or function is None:
        raise _missing(path, "SYSTEM_MESSAGE and get_gpt4answer()")
    prefixes = [_prefix_of(function, name) for name in ("input_text", "modelA_output_textl", "modelB_output_textl")]
    closing = _closing_text(function)
    if None in prefixes or closing is None:
        raise _missing(path, "<INPUT>, <OUTPUT_A> and <OUTPUT_B> prefixes and closing instruction in get_gpt4answer()")
    inputs, first, second = map(_escaped, prefixes)
    # IntJudge's message: its parts joined as Qwen2-VL's chat template joins them, each text before an image tagged <IMG_k></IMG_k>
    return [_rubric(path, category="opening", verdict_format="opening", layout="tagged", system_message=system.value, instructions=closing,
                    template=f"{inputs}{{question}}{first}{{answer_a}}{second}{{answer_b}}{{instructions}}")]


IMPORTERS = {"vlrewardbench": vlrewardbench, "mmrewardbench": mmrewardbench, "mmrb2": mmrb2, "opening": opening}
