"""Reading the YAML files a user gives (rubrics, presets, criteria): a file that does not parse is one
problem that names the file and the line, where PyYAML's own message speaks of "<unicode string>"; a file
no real rubric or preset comes near in size, nesting or (through aliases) values is refused before it can
take the machine's memory."""

from __future__ import annotations

from pathlib import Path

import yaml

from mmjudge.judge.data import TOO_DEEP, InputError, Problem, field_name, read_text, value_problems

# PyYAML's pure-Python parser takes some 300 bytes of memory per byte of YAML (a 30 MB rubric took 8 GB);
# the largest file read here, a MEGA-Bench criteria file, is some 100 KB.
MAX_YAML_BYTES = 4 * 2**20
# A few lines of aliases (*name) can stand for billions of values; a rubric or preset holds hundreds.
MAX_YAML_VALUES = 1_000_000


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key given twice in one mapping: PyYAML keeps the last silently, so a
    rubric with two `instructions:` lost the first without a word (YAML itself says keys are unique)."""

    def construct_mapping(self, node, deep=False):
        first = {}
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":  # `<<:` keys may override
                key = self.construct_object(key_node)
                if key in first:
                    raise yaml.constructor.ConstructorError(None, None, f"the key {key!r} a second time in one mapping (first at line "
                                                                        f"{first[key].line + 1}); give it once", key_node.start_mark)
                first[key] = key_node.start_mark
        return super().construct_mapping(node, deep)


def read_yaml(path: Path) -> object:
    if (size := Path(path).stat().st_size) > MAX_YAML_BYTES:
        raise InputError([Problem(str(path), f"{size:,} bytes; a YAML file read here holds at most {MAX_YAML_BYTES:,}")])
    try:
        value = yaml.load(read_text(path), Loader=_Loader)  # noqa: S506 - a safe loader
    except yaml.MarkedYAMLError as err:
        raise InputError([Problem(str(path), _describe(err))]) from None
    except yaml.reader.ReaderError as err:  # a character YAML does not allow (a NUL, a control character)
        raise InputError([Problem(str(path), f"invalid YAML: character {err.character!r} at position {err.position}: {err.reason}")]) from None
    except RecursionError:  # PyYAML composes and constructs recursively, once per level
        raise InputError([Problem(str(path), TOO_DEEP)]) from None
    if problems := value_problems(value, max_values=MAX_YAML_VALUES):
        raise InputError([Problem(str(path), message, field=field_name(where) or None) for where, message in problems])
    return value


def _describe(err: yaml.MarkedYAMLError) -> str:
    where = lambda mark: f"line {mark.line + 1}, column {mark.column + 1}"  # noqa: E731  (PyYAML counts from 0)
    message = f"invalid YAML at {where(err.problem_mark)}: {err.problem}"
    if err.context and err.context_mark:
        message += f" ({err.context} at {where(err.context_mark)})"
    return message
