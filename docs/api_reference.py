"""docs/api.md's reference, made from the API's signatures and docstrings, never by hand:

    .venv/bin/python docs/api_reference.py          # rewrites the reference section of docs/api.md

tests/test_api.py fails when the page differs from what this makes, so a keyword added, renamed or
described anew in the code reaches the page, and nothing on the page is left that the code lacks.
"""

import inspect
import re
import sys
from pathlib import Path

import mmjudge
from mmjudge.api import Judge

PAGE = Path(__file__).parent / "api.md"
BEGIN = "<!-- reference: made by docs/api_reference.py from the code's signatures and docstrings; edit those, not this -->"
END = "<!-- end of the reference -->"
# What the reference holds, in its order: the name a user writes, and the function.
DOCUMENTED = [("mmjudge.Judge.load", Judge.load), ("judge.score", Judge.score), ("judge.compare", Judge.compare),
              ("judge.score_one", Judge.score_one), ("judge.score_batches", Judge.score_batches),
              ("mmjudge.calibrate", mmjudge.calibrate), ("mmjudge.fine_tune", mmjudge.fine_tune)]
# A line that starts a parameter's description: `name:`, `a, b:` or `**options:`.
PARAMETER = re.compile(r"^(\*\*)?\w+(, \w+)*: ")


def signature(function) -> str:
    """The call as a user writes it: names and defaults, no annotations, no self."""
    parameters = [p.replace(annotation=inspect.Parameter.empty) for p in inspect.signature(function).parameters.values() if p.name != "self"]
    return str(inspect.Signature(parameters))


def as_markdown(doc: str) -> str:
    """A docstring's paragraphs as Markdown: a paragraph of `name: description` lines (continued indented) a
    list, the others as they are."""
    blocks = []
    for paragraph in inspect.cleandoc(doc).split("\n\n"):
        lines = paragraph.splitlines()
        if not PARAMETER.match(lines[0]):
            blocks.append(" ".join(line.strip() for line in lines))
            continue
        items = []
        for line in lines:
            if line.startswith(" ") and items:
                items[-1] += " " + line.strip()
            else:
                name, text = line.split(": ", 1)
                items.append(f"- `{name}`: {text}")
        blocks.append("\n".join(items))
    return "\n\n".join(blocks)


def reference() -> str:
    sections = [f"### `{name}{signature(function)}`\n\n{as_markdown(function.__doc__)}" for name, function in DOCUMENTED]
    return "\n\n".join([BEGIN, *sections, END])


def page_with_reference(text: str) -> str:
    """The page's text with its reference section made anew."""
    before, rest = text.split(BEGIN, 1)
    return before + reference() + rest.split(END, 1)[1]


def main() -> int:
    PAGE.write_text(page_with_reference(PAGE.read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
