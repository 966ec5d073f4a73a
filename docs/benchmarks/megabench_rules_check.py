"""judge/formats/megabench_rules.py against MEGA-Bench's own metric code: for docs/benchmarks.md.

    python docs/benchmarks/megabench_rules_check.py MEGA-Bench/

Run in a venv with MEGA-Bench's metric dependencies (its requirements.txt; sympy, antlr4-python3-runtime
4.11, regex, numpy, datasets). It imports MEGA-Bench's megabench/metrics from the checkout, unchanged, and
this toolkit's megabench_rules.py by its path (it needs nothing of the toolkit's), then compares:

1. every query of the real Grok-2 open-set scored file in MEGA-Bench's repository: each answer field's
   part of the response under the task's parser (from the repository's task list), and the rule-based
   field's score, both sides, and MEGA-Bench's score with the one the file records;
2. general_single_numerical_match on 1,800 generated (response, target) pairs of numbers, LaTeX,
   units, lists, tuples, letters and junk (seeded).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import random
import re
import sys
import warnings
from pathlib import Path

GROK = "megabench/results/SI_results/Grok-2-vision-1212/data_with_scores_open.json"


def ours():
    spec = importlib.util.spec_from_file_location("megabench_rules", Path(__file__).resolve().parents[2] / "judge/formats/megabench_rules.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def task_list(repo: Path) -> dict[str, tuple[dict, str]]:
    found = {}
    for readme in repo.glob("task_examples/**/README.md"):
        text = readme.read_text()
        functions = ast.literal_eval(re.search(r"\*\*Field Score Function\*\*: (\{.*\})", text).group(1))
        found[readme.parent.name] = (functions, re.search(r"\*\*Response Parse Function\*\*: (.*)", text).group(1).strip())
    return found


def real_queries(repo: Path, mine) -> None:
    from metrics import ResponseParseType
    from metrics.parsing.common.utils import evaluate_as_string
    from metrics.scoring.general_numerical_match import GeneralSingleNumericalMatch

    tasks = task_list(repo)
    compared = same = with_rule = recorded = 0
    for task in json.loads((repo / GROK).read_text())["data"]:
        functions, parser_name = tasks[task["task_name"]]
        if parser_name not in mine.PARSERS:
            continue  # ascii_answer_string: ascii_art_30, which judge-score refuses
        parser = ResponseParseType.from_string(parser_name)
        for query in task["query_response"]:
            answer = query["correct_answer"]
            if parser.is_single_field_parser():
                key = [f for f in answer if not f.startswith("##")][0]
                theirs = parser.parse(query["response"], key, is_single_line_ans="\n" not in answer[key])
            else:
                theirs = parser.parse(query["response"])
                if parser == ResponseParseType.JSON and (not isinstance(theirs, dict) or not theirs):
                    theirs = dict.fromkeys(answer, query["response"])
            parsed = mine.parse_response(parser_name, query["response"], answer)
            parts = [(theirs.get(f) if isinstance(theirs, dict) else theirs, mine.field_part(parsed, f)) for f in answer]
            rule = [f for f, m in functions.items() if m == mine.NUMERIC_MATCH]
            their_scores = [GeneralSingleNumericalMatch.match(theirs.get(f), evaluate_as_string(answer[f])) for f in rule]
            my_scores = [mine.numeric_match(mine.field_part(parsed, f), mine.unquoted(answer[f])) for f in rule]
            compared += 1
            same += all(str(a) == str(b) for a, b in parts) and their_scores == my_scores
            with_rule += bool(rule)
            recorded += bool(rule) and their_scores == [query["scores"]["field"][f] for f in rule]
    print(f"real queries: {compared} compared, {same} with the same parts and rule-based scores; of the {with_rule} with a "
          f"rule-based field, MEGA-Bench's score equals the one its file records on {recorded}")


def generated_pairs(mine) -> None:
    from metrics.scoring.general_numerical_match import GeneralSingleNumericalMatch

    rng = random.Random(12)
    atoms = ["1", "0.5", "3.14", "-2", "1,000", "1e3", "\\frac{1}{3}", "\\frac{2\\pi}{15}", "\\pi", "\\sqrt{2}", "\\sqrt[3]{8}", "2^3", "x",
             "E", "e", "(1, 2)", "[1, 2]", "[2, 1]", "50%", "$", "\\(", "\\)", "\\[", "\\]", " = ", "\\approx", "°C", " C", "¥", "\\boxed{",
             "}", " ", "-", ".", "\\,", "\\text{m}", "A", "(B)", "abc", "1/0", "10**400", "nan", "inf", "True", "'x'", "{", "\\times",
             "\\cdot", "*", "+", "/"]
    cases = ["", "0", "1", "1.0", "A", "(a)", "b.", "1 000", "1.01", "0.99", "$0.695635$", "\\(0.69\\)", "x = 0.695", "E", "[0.5, 1]", "(0.5, 1)"]
    cases += ["".join(rng.choice(atoms) for _ in range(rng.randint(1, 5))) for _ in range(700)]
    pairs = [(rng.choice(cases), rng.choice(cases)) for _ in range(1500)] + [(c, c) for c in cases[:300]]
    differ = [(r, t, a, b) for r, t in pairs if (a := GeneralSingleNumericalMatch.match(r, t)) != (b := mine.numeric_match(r, t))]
    print(f"generated pairs: {len(pairs)} compared, {len(pairs) - len(differ)} with the same score")
    for response, target, theirs, mine_ in differ:
        print(f"  differ: {response!r} vs {target!r}: MEGA-Bench {theirs!r}, megabench_rules {mine_!r}")


def main() -> None:
    repo = Path(sys.argv[1])
    sys.path.insert(0, str(repo / "megabench"))
    warnings.filterwarnings("ignore")
    mine = ours()
    real_queries(repo, mine)
    generated_pairs(mine)


if __name__ == "__main__":
    main()
