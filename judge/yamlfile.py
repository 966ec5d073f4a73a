"""Reading the YAML files a user gives (rubrics, presets): a file that does not parse is one problem that
names the file and the line, where PyYAML's own message speaks of "<unicode string>"."""

from __future__ import annotations

from pathlib import Path

import yaml

from judge.data import InputError, Problem, read_text


def read_yaml(path: Path) -> object:
    try:
        return yaml.safe_load(read_text(path))
    except yaml.MarkedYAMLError as err:
        raise InputError([Problem(str(path), _describe(err))]) from None


def _describe(err: yaml.MarkedYAMLError) -> str:
    where = lambda mark: f"line {mark.line + 1}, column {mark.column + 1}"  # noqa: E731  (PyYAML counts from 0)
    message = f"invalid YAML at {where(err.problem_mark)}: {err.problem}"
    if err.context and err.context_mark:
        message += f" ({err.context} at {where(err.context_mark)})"
    return message
