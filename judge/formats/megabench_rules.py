"""What MEGA-Bench computes without a judge, for the open-set tasks that need it.

    response --parser--> each answer field's part   answer_string (one field), dummy (the whole text), json
    a field's part --metric--> its score 0-1         the judge for gpt_4o_as_judge fields; general_single_numerical_match
    field scores --aggregation--> the query's score  mean (weighted) or min over the fields scored (>= 0); -1 if none

Written from MEGA-Bench's megabench/metrics/ (parsing/, scoring/general_numerical_match.py, aggregation/)
and checked against it on real responses (docs/benchmarks.md): the quirks are kept, since the score must
be the one MEGA-Bench's evaluator gives. Two deliberate differences, both for safety on untrusted text:
where MEGA-Bench runs Python's eval() on a model's answer (in a subprocess, 5 s), `_arithmetic` evaluates
the same text as numbers and + - * / // % ** only (a name other than E, a call, anything else is no
number, as eval's NameError is); and an answer whose parsing raises (deep nesting, a huge literal) counts
as unparsed where MEGA-Bench would crash.
"""

from __future__ import annotations

import ast
import json
import math
import operator
import re
import warnings

import numpy as np
import regex

NUMERIC_MATCH = "general_single_numerical_match"
PARSERS = ("answer_string", "dummy", "json")
SINGLE_FIELD_PARSERS = ("answer_string",)
AGGREGATIONS = ("mean", "min")
UNSCORED = -1  # MEGA-Bench's mark of a field or query without a score

_JSON_CANDIDATE = r"(\{(?:[^{}]|(?R))*\}|\[(?:[^{}]|(?R))*\])"  # balanced braces: the `regex` package's recursion
_JSON_STRING = r'"(?:\\.|[^"\\])*"'
_JSON_TIMEOUT = 0.1  # seconds MEGA-Bench allows the search before it gives up on the response


# ---------------------------------------------------------------- parsing


def parse_response(parser: str, response: str, answer: dict[str, object]) -> dict[str, object] | str:
    """Each answer field's part of the response, as MEGA-Bench's evaluator hands it to the field's metric:
    a dict by field, or (dummy) the whole stripped text for every field."""
    if parser == "dummy":
        return response.strip()
    if parser in SINGLE_FIELD_PARSERS:
        [key] = answer_fields(answer)
        return {key: _answer_string(response, single_line="\n" not in str(answer[key]))}
    parsed = parse_json(response)
    if isinstance(parsed, dict) and parsed:
        return {key: unquoted(value) for key, value in parsed.items()}
    return dict.fromkeys(answer, response)  # MEGA-Bench's fallback: every field reads the raw response


def field_part(parsed: dict[str, object] | str, field: str) -> object:
    return parsed.get(field) if isinstance(parsed, dict) else parsed


def answer_fields(answer: dict[str, object]) -> list[str]:
    """The fields an answer parser fills: MEGA-Bench treats `##`-prefixed ones as metadata."""
    return [key for key in answer if not key.startswith("##")]


def unquoted(value: object) -> object:
    """A text that is a quoted Python string, unquoted (MEGA-Bench's evaluate_as_string); anything else as it is."""
    try:
        evaluated = ast.literal_eval(value)
    except MemoryError:
        return ""
    except Exception:  # noqa: BLE001 - MEGA-Bench catches ValueError and SyntaxError; deeper failures mean the same here
        return value
    return evaluated if isinstance(evaluated, str) else value


def _answer_string(response: str, single_line: bool) -> str:
    content = _after_last_answer(response or "")
    content, in_code = _code_block(content)
    if not in_code and single_line:
        content = _first_paragraph_if_short(content)
    if content.startswith(("{", "[")):
        parsed = parse_json(content)
        if (parsed == {} and "{}" not in content) or (parsed == [] and "[]" not in content):
            return content
        return str(parsed)
    return unquoted(content)


def _after_last_answer(text: str) -> str:
    """What follows the last "Answer:" (earlier ones are deleted). As in MEGA-Bench, "**Answer:** x" reads
    as empty: the bold form's lazy group closes at once."""
    text = text.replace("answer:", "Answer:")
    last = text.rfind("Answer:")
    if last != -1:
        text = text[:last].replace("Answer:", "") + text[last:]
    match = re.search(r"\*\*?Answer:\s*(.*?)\*\*?|\bAnswer:\s*(.*)", text, re.DOTALL)
    if match:
        text = match.group(1) or match.group(2) or ""
    return text.strip()


def _code_block(text: str, language: str | None = None) -> tuple[str, bool]:
    pattern = rf"```{language}\s*\n*(.*?)\s*```" if language else r"```\w*\s*\n*(.*?)\s*```"
    match = re.search(pattern, text, flags=re.DOTALL)
    return (match.group(1).strip(), True) if match else (text, False)


def _first_paragraph_if_short(text: str) -> str:
    """MEGA-Bench's guess at a one-line answer followed by explanation: keep the first paragraph alone
    when it looks like a word, a list of words, "x." or "(x)" and the text is not one multi-line answer."""
    first = text.split("\n\n")[0].strip()
    short = re.search(r"^(?:(?:[a-zA-Z0-9_-]+)(?:,\s*[a-zA-Z0-9_-]+)*|(?:[a-zA-Z0-9_-]+)\.|\((?:[a-zA-Z0-9_-]+)\)$)", first)
    return first if short and first and not _multiline(text) else text


def _multiline(text: str) -> bool:
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.strip():
            return not (i + 1 < len(lines) and not lines[i + 1].strip())
    return False


def parse_json(response: str) -> object:
    """The last JSON (or Python literal) object or list in the response, after an "Answer:" at a line's
    start and inside a ```json block; {} or [] when there is none."""
    match = re.search(r"^(?:\*\*Answer:|Answer:)\s*(.+)", response, re.MULTILINE)
    text = match.group(1).strip() if match else response.strip()
    text, _ = _code_block(text, "json")
    empty = [] if text.startswith("[") else {}
    try:
        candidates = regex.findall(_JSON_CANDIDATE, text, timeout=_JSON_TIMEOUT)
    except TimeoutError:
        return empty
    found = [value for candidate in candidates for value in _json_values(candidate)]
    return found[-1] if found else empty


def _json_values(candidate: str) -> list[object]:
    """Every reading of one candidate that parses, in MEGA-Bench's order (the last one wins)."""
    text = candidate.replace('\\"', "__DOUBLE_QUOTE__").replace("\\'", "__SINGLE_QUOTE__")
    for literal in regex.findall(_JSON_STRING, text):  # a string that holds JSON is inlined as JSON
        inner = literal[1:-1].replace("__DOUBLE_QUOTE__", '"').replace("__SINGLE_QUOTE__", "'")
        nested = _loads(inner)
        if isinstance(nested, (dict, list)):
            text = text.replace(literal, json.dumps(nested))
    text = text.replace("__DOUBLE_QUOTE__", '\\"').replace("__SINGLE_QUOTE__", "\\'")
    values = []
    if (value := _loads(text)) is not None or (value := _loads(re.sub(r"(?<!\w)\'|\'(?!\w)", '"', text))) is not None:
        values.append(value)
    if (value := _literal(text)) is not None or (value := _literal(text.replace('\\"', '\\\\"').replace("\\'", "\\\\'"))) is not None:
        values.append(value)
    return values


def _loads(text: str) -> object | None:
    try:
        return json.loads(text)
    except Exception:  # noqa: BLE001 - a decode error, or nesting too deep for the decoder: not JSON either way
        return None


def _literal(text: str) -> object | None:
    try:
        return ast.literal_eval(text)
    except Exception:  # noqa: BLE001 - as _loads
        return None


# ---------------------------------------------------------------- general_single_numerical_match


def numeric_match(response: object, target: object) -> float | int:
    """1 when the response's number is within 1% of the target's (lists: the same numbers, in any order),
    else a string match without spaces, hyphens and periods; MEGA-Bench's general_single_numerical_match."""
    response = _assigned(_without_math_brackets(str(response)))
    target = _assigned(_without_math_brackets(str(target)))
    got, wanted = _number(response), _number(target)
    if got is None or wanted is None:
        return _simple_str_match(response, target)
    if isinstance(got, list) and isinstance(wanted, list):
        return float(_same_numbers(got, wanted))
    if isinstance(got, tuple) and isinstance(wanted, tuple):
        return 0.0  # MEGA-Bench compares lists only: two tuples never match
    return float(_close(got, wanted))


def _without_math_brackets(text: str) -> str:
    # MEGA-Bench's `$...$` pattern reads "$" as the end of the string, so it always "finds" math and always
    # strips \( \) and \[ \]; `$` signs themselves go later, with the units.
    text = re.sub(r"\\\((.*?)\\\)", r"\1", text)
    return re.sub(r"\\\[(.*?)\\\]", r"\1", text)


def _assigned(text: str) -> str:
    """What follows the first =, ≈ or \\approx, on its line."""
    match = re.search(r"(?:=|≈|\\approx)\s*(.+)", text)
    return match.group(1).strip() if match else text


def _without_units(text: str) -> str:
    text = text.replace("\\pi", "π")
    text = re.sub(r"(?<![\d}])\\?π", "3.14", text)
    text = re.sub(r"(\d)(\\?π)", r"\1*3.14", text)
    text = re.sub(r"\{(\\?π)\}", "3.14", text)
    text = re.sub(r"\*(\\?π)", "*3.14", text)
    for unit, replacement in (("%", "/100"), ("$", ""), ("¥", ""), ("°C", ""), (" C", ""), ("°", "")):
        text = text.replace(unit, replacement)
    return text


def _number(text: str) -> int | float | list | tuple | None:
    text = _without_units(text)
    try:
        from sympy.parsing.latex import parse_latex  # MEGA-Bench reads LaTeX with sympy's parser (antlr4 4.11)

        text = str(parse_latex(text))
    except Exception:  # noqa: BLE001 - MEGA-Bench keeps the text as it is when the parser fails, whatever the reason
        pass
    if (number := _float(text)) is not None:
        return number
    value = _arithmetic(text)
    return value if isinstance(value, (list, tuple)) else _float(value)


def _float(value: object) -> int | float | None:
    try:
        number = float(value)
        return round(number) if number.is_integer() else number
    except Exception:  # noqa: BLE001 - not a number, of whatever type
        return None


_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
              ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_NAMES = {"E": 2.718}  # the one name MEGA-Bench's eval() finds in its module
_MAX_EXPONENT = 10_000  # beyond, eval would outlast MEGA-Bench's 5 s limit: no number either way


def _arithmetic(text: str) -> object:
    """The value Python's eval gives a text of numbers and arithmetic, or None for any other text."""
    try:
        with warnings.catch_warnings():  # "invalid decimal literal" and the like: the text is simply no number
            warnings.simplefilter("ignore", SyntaxWarning)
            tree = ast.parse(text.strip(), mode="eval")
        return _evaluate(tree.body)
    except Exception:  # noqa: BLE001 - a syntax error, a name, a division by zero, an overflow: eval fails too
        return None


def _evaluate(node: ast.AST) -> object:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.Name) and node.id in _NAMES:
        return _NAMES[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        value = _evaluate(node.operand)
        return value if isinstance(node.op, ast.UAdd) else -value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and isinstance(right, (int, float)) and abs(right) > _MAX_EXPONENT:
            raise OverflowError("exponent too large")
        return _OPERATORS[type(node.op)](left, right)
    if isinstance(node, (ast.Tuple, ast.List)):
        values = [_evaluate(element) for element in node.elts]
        return tuple(values) if isinstance(node, ast.Tuple) else values
    raise ValueError(f"not arithmetic: {type(node).__name__}")


def _close(got: object, wanted: object) -> bool:
    try:
        return not math.isnan(got) and wanted - abs(wanted) * 0.01 <= got <= wanted + abs(wanted) * 0.01
    except Exception:  # noqa: BLE001 - a list against a number, and the like: no match
        return False


def _same_numbers(got: list, wanted: list) -> bool:
    if len(got) != len(wanted) or any(not isinstance(x, (int, float)) for x in got):
        return False
    try:
        return all(_close(g, w) for g, w in zip(sorted(got), sorted(wanted)))
    except TypeError:
        return False


def _simple_str_match(response: str, target: str) -> int:
    response, target = (re.sub(r"[ \-\n\t.]", "", text).lower() for text in (response, target))
    if len(target) == 1 and target.isalpha() and len(response) > 1:
        letter = re.match(r"^\(?([A-Za-z])\)?(?:\s*\.\s*|\.)?(.*)", response)
        response = letter.group(1) if letter else response
    return 1 if response == target else 0


# ---------------------------------------------------------------- aggregation


def aggregate(function: str, scores: dict[str, float], weights: dict[str, float]) -> float:
    """The query's score from its field scores: those >= 0 only, UNSCORED when none is."""
    scored = {name: score for name, score in scores.items() if score >= 0}
    if not scored:
        return UNSCORED
    if function == "min":
        return min(scored.values())
    return float(np.average(list(scored.values()), weights=[weights[name] for name in scored]))
