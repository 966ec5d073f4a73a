"""VLMEvalKit's MathVista, LogicVista and WildVision judge code with `--judge gpt-4o` pointed at judge-serve:
VLMEvalKit's build_judge sends `--judge gpt-4o` as `gpt-4o-2024-05-13` (its map of short names to dated ones).

The judge path of each dataset's `evaluate` is run as that method runs it: the judge settings made by run.py's
own parse_args and get_judge_kwargs (taken from run.py's source, whose other imports need a GPU stack), the
judge built by build_judge with the dataset's own extra settings, its `working()` check, then the dataset's
own auxeval function on prediction records of the dataset's shape (MathVista_auxeval, LogicVista_auxeval,
WildVision_auxeval). The datasets' TSVs (downloads) are not read.

Only VLMEvalKit's smp, utils, api/gpt and the three datasets' modules are imported, from a checkout, in a small
venv (docs/harnesses.md, "Judge names"): `vlmeval`, `vlmeval.api`, `vlmeval.dataset` and
`vlmeval.dataset.utils` are made bare packages over the checkout, holding the names the datasets import from
them; build_judge's Qwen and Llama judge classes, which `--judge gpt-4o` never reaches, are placeholders that
fail if called. Nothing of this repository is imported.

    python docs/harnesses/vlmevalkit_names.py --vlmevalkit /tmp/harness-src/vlmeval \
        --judge-base-url http://127.0.0.1:8000/v1 --judge gpt-4o --judge-key none

Every flag after --vlmevalkit is one of run.py's. The script exits 1 when a call was not answered 200, or when
the dataset code was handed VLMEvalKit's failure string in place of an answer.
"""

import argparse
import ast
import base64
import importlib
import io
import json
import sys
import types
from pathlib import Path

import pandas as pd
import requests
from PIL import Image

from judge_calls import CallLog, observed_requests

FAIL_MSG = "Failed to obtain answer via API."  # what VLMEvalKit's API wrappers hand back for an answer they could not get

# Prediction records in each dataset's shape (its TSV's columns without the image, plus the model's prediction).
MATHVISTA = [
    {"index": 1, "question": "What is the value of the largest bar?", "answer": "7", "question_type": "free_form", "answer_type": "integer",
     "choices": "[]", "answer_option": None, "precision": None, "skills": "['statistical reasoning']", "task": "figure question answering",
     "prediction": "The largest bar reaches about seven."},
    {"index": 2, "question": "Which shape is shaded?", "answer": "circle", "question_type": "multi_choice", "answer_type": "text",
     "choices": "['circle', 'square', 'triangle']", "answer_option": "A", "precision": None, "skills": "['geometry reasoning']", "task": "geometry problem solving",
     "prediction": "I think the round one is shaded."},
]
LOGICVISTA = [
    {"index": 1, "question": "Which option completes the pattern? A. 1 B. 2 C. 3 D. 4", "answer": "b", "skill": "inductive",
     "prediction": "The second option fits the pattern."},
    {"index": 2, "question": "Which figures are rotations of the first? A. one B. two C. three D. four", "answer": "a, c", "skill": "spatial",
     "prediction": "The first and the third ones."},
]


def jpeg_base64(colour: str) -> str:
    """A small picture as WildVision's records carry their image: a JPEG, base64."""
    picture = io.BytesIO()
    Image.new("RGB", (64, 48), colour).save(picture, format="JPEG")
    return base64.b64encode(picture.getvalue()).decode()


WILDVISION = [
    {"index": 1, "question": "Describe the picture.", "A": "A dark square.", "B": "It is a photo of a sunny beach with people.", "image": jpeg_base64("navy")},
]


class Unreached:
    """build_judge's class for Qwen and Llama judges: `--judge gpt-4o` never makes one."""

    def __init__(self, *args, **kwargs):
        raise RuntimeError("build_judge made a Qwen or Llama judge, which this check does not load")


def bare_package(name: str, folder: Path, **names) -> types.ModuleType:
    package = types.ModuleType(name)
    package.__path__ = [str(folder)]
    package.__dict__.update(names)
    sys.modules[name] = package
    return package


def vlmeval_modules(checkout: Path):
    """build_judge and the three datasets' judge functions, imported from the checkout as VLMEvalKit imports them."""
    root = checkout / "vlmeval"
    bare_package("vlmeval", root)
    bare_package("vlmeval.dataset", root / "dataset", img_root_map=None)
    api = bare_package("vlmeval.api", root / "api")
    api.OpenAIWrapper = importlib.import_module("vlmeval.api.gpt").OpenAIWrapper
    api.HFChatModel = api.SiliconFlowAPI = Unreached
    utils = bare_package("vlmeval.dataset.utils", root / "dataset" / "utils")
    judge_util = importlib.import_module("vlmeval.dataset.utils.judge_util")
    utils.build_judge, utils.DEBUG_MESSAGE = judge_util.build_judge, judge_util.DEBUG_MESSAGE
    return (judge_util.build_judge, importlib.import_module("vlmeval.dataset.utils.mathvista"),
            importlib.import_module("vlmeval.dataset.utils.logicvista"), importlib.import_module("vlmeval.dataset.wildvision"))


def run_py_functions(checkout: Path) -> dict:
    """run.py's functions (parse_args, get_judge_kwargs and the helpers they call), from its source."""
    from vlmeval.smp import listinstr

    tree = ast.parse((checkout / "run.py").read_text())
    tree.body = [node for node in tree.body if isinstance(node, ast.FunctionDef)]
    namespace = {"argparse": argparse, "json": json, "listinstr": listinstr}
    exec(compile(tree, str(checkout / "run.py"), "exec"), namespace)
    return namespace


def main() -> int:
    checkout = Path(sys.argv[sys.argv.index("--vlmevalkit") + 1])
    del sys.argv[sys.argv.index("--vlmevalkit"):sys.argv.index("--vlmevalkit") + 2]
    build_judge, mathvista, logicvista, wildvision = vlmeval_modules(checkout)
    run_py = run_py_functions(checkout)
    args = run_py["parse_args"]()
    log = CallLog()
    requests.Session.send = observed_requests(requests.Session.send, log)
    failed = []

    def judged(name: str, dtype: str, settings: dict, auxeval, records: list) -> None:
        """The dataset's judge, built and checked as its evaluate does, then its auxeval on each record."""
        log.step = name
        judge_kwargs = run_py["get_judge_kwargs"](name, dtype, args)
        judge_kwargs.pop("nproc", None)
        model = build_judge(**{**judge_kwargs, **settings})
        print(f"{name}: judge model {model.model!r} (from --judge {judge_kwargs.get('model')}), working: {model.working()}")
        generate = model.generate

        def observed_generate(*args, **kwargs):  # what the dataset code is handed: the judge's answer, or the failure string
            answer = generate(*args, **kwargs)
            if FAIL_MSG in str(answer):
                failed.append(f"{name} {record['index']}")
            return answer

        model.generate = observed_generate
        for record in records:
            result = auxeval(model, pd.Series(record))
            print(f"{name} {record['index']}: {str(result)[:120]!r}")

    judged("MathVista_MINI", "VQA", {"max_tokens": 128}, mathvista.MathVista_auxeval, MATHVISTA)
    judged("LogicVista", "VQA", {"max_tokens": 128}, logicvista.LogicVista_auxeval, LOGICVISTA)
    judged("WildVision", "VQA", {"max_tokens": 4096, "system_prompt": wildvision.SYSTEM_PROMPT, "temperature": 0, "img_detail": "high",
                                 "timeout": 300}, wildvision.WildVision_auxeval, WILDVISION)
    problems = [f"records judged from VLMEvalKit's failure string: {failed}"] if failed else []
    return log.report(["MathVista_MINI", "LogicVista", "WildVision"], problems)


if __name__ == "__main__":
    sys.exit(main())
