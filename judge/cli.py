"""What every command shares on the command line: the exit codes and how errors reach the user.

A user's mistake (bad file, bad flag value, unusable checkpoint) is one clear message naming the file,
and exit code 2; a failure of the toolkit itself is an "internal failure", exit code 1, with the
traceback shown only under --verbose.
"""

from __future__ import annotations

import argparse
import sys
import traceback
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import fields
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from pydantic import TypeAdapter, ValidationError

from judge.data import InputError, field_name
from judge.yamlfile import read_yaml

EXIT_BAD_INPUT = 2
EXIT_FAILURE = 1


class UsageError(Exception):
    """A flag or setting the user gave that cannot work; the message says what to give instead."""


def package_version() -> str:
    try:
        return version("mmjudge")
    except PackageNotFoundError:
        return "unknown (not installed)"


def add_common_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--verbose", action="store_true", help="show full tracebacks on errors (default: off)")
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")


def add_revision_flag(parser: argparse.ArgumentParser, of: str = "--model_path") -> None:
    parser.add_argument("--revision", help=f"branch, tag or commit of {of} where it is a Hugging Face Hub id (default: main)")


def add_settings_flags(parser: argparse.ArgumentParser, defaults, shown_default: Callable[[str], str] | None = None) -> None:
    """One flag per field of a settings dataclass (a field whose metadata says `flag: False` has none),
    spelled with underscores or hyphens, with the help in the field's metadata. The default shown is the
    field's value in `defaults`, or `shown_default(name)` where the default depends on more than one
    preset. The flags themselves default to None: settings_from_config applies only the ones the user
    gave, over the --config file."""
    hints = typing.get_type_hints(type(defaults))
    for f in fields(defaults):
        if not f.metadata.get("flag", True):
            continue
        value = getattr(defaults, f.name)
        shown = shown_default(f.name) if shown_default else " ".join(map(str, value)) if isinstance(value, (list, tuple)) else value
        names = [f"--{f.name}"] + ([f"--{f.name.replace('_', '-')}"] if "_" in f.name else [])
        help_text = f"{f.metadata['help']} (default: {shown})"
        kind = hints[f.name]
        if kind is bool:
            parser.add_argument(*names, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        elif typing.get_origin(kind) is typing.Literal:
            parser.add_argument(*names, choices=typing.get_args(kind), default=None, help=help_text)
        elif typing.get_origin(kind) is tuple:  # fixed length, e.g. scale: LOW HIGH
            items = typing.get_args(kind)
            parser.add_argument(*names, nargs=len(items), type=items[0], default=None, help=help_text)
        elif typing.get_origin(kind) is list:
            parser.add_argument(*names, nargs="+", type=typing.get_args(kind)[0], default=None, help=help_text)
        else:
            args = [a for a in typing.get_args(kind) if a is not type(None)] if isinstance(kind, types.UnionType) else [kind]
            parser.add_argument(*names, type=args[0], default=None, help=help_text)


def settings_from_config(cls, config: str | Path, args: argparse.Namespace):
    """A settings dataclass from a YAML preset whose keys are its fields, each overridden by the flag of
    the same name when the user gave it (flags default to None for this reason). Values are checked
    against the fields' types, so that YAML's surprises (`1e-4` is a string) are named here rather than
    failing deep inside a run."""
    try:
        return TypeAdapter(cls).validate_python(config_values(cls, config, args))
    except ValidationError as err:
        raise UsageError(f"--config {config}: " + "; ".join(f"{field_name(e['loc'])}: {e['msg']}" for e in err.errors())) from None


def setting_problems(cls, values: dict) -> list[str]:
    """Every value in `values` for a field of the settings dataclass `cls` that cannot work, each with what
    would: a Literal's choices, a bool, and a number's range where the field's metadata gives a `minimum`
    (and a `below`, a bound it must stay under). Other fields are left to their types' checks."""
    hints = typing.get_type_hints(cls)
    problems = []
    for f in fields(cls):
        value, hint, minimum = values.get(f.name, f.default), hints[f.name], f.metadata.get("minimum")
        if typing.get_origin(hint) is typing.Literal:
            ok, wanted = value in typing.get_args(hint), "one of " + ", ".join(typing.get_args(hint))
        elif hint is bool:
            ok, wanted = isinstance(value, bool), "true or false"
        elif minimum is not None:  # a number, or none where the type allows it
            ok, wanted = _in_range(value, hint, minimum, f.metadata.get("below"))
        else:
            continue
        if not ok:
            problems.append(f"{f.name} must be {wanted}, got {value!r}")
    return problems


def _in_range(value, hint, minimum, below) -> tuple[bool, str]:
    """Whether `value` is a number of the field's kind within [minimum, below), and what that means in words."""
    optional = type(None) in typing.get_args(hint)
    whole = int in (typing.get_args(hint) or (hint,))
    kinds = (int,) if whole else (int, float)
    number = type(value) in kinds and value >= minimum and (below is None or value < below)  # NaN fails both
    wanted = f"{'a whole number' if whole else 'a number'} of at least {minimum:g}" + (f" and below {below:g}" if below is not None else "")
    return (optional and value is None) or number, wanted + (" or none" if optional else "")


def config_values(cls, config: str | Path, args: argparse.Namespace) -> dict:
    """The values `settings_from_config` builds `cls` from, for a caller that checks them first."""
    config = Path(config)
    if not config.is_file():
        raise UsageError(f"--config {config}: file not found")
    values = read_yaml(config) or {}
    if not isinstance(values, dict):
        raise UsageError(f"--config {config}: expected a mapping of setting: value, got a YAML {type(values).__name__}")
    known = {f.name for f in fields(cls)}
    if unknown := set(values) - known:
        raise UsageError(f"{config}: unknown setting(s) {sorted(unknown)}; known: {sorted(known)}")
    values.update({k: v for k, v in vars(args).items() if k in known and v is not None})
    return values


def run(main: Callable[[Sequence[str] | None], int | None], argv: Sequence[str] | None = None) -> int:
    """Call a command's main, turning known errors into a message and an exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    verbose = "--verbose" in args
    try:
        return main(args) or 0
    except (InputError, UsageError) as err:
        print(f"error: {_user_message(err)}", file=sys.stderr)
        if verbose:
            traceback.print_exc()
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # the last line of defence: one line for the user, the trace on request
        print(f"error: internal failure: {type(err).__name__}: {err}", file=sys.stderr)
        if verbose:
            traceback.print_exc()
        else:
            print("(run again with --verbose for the full traceback)", file=sys.stderr)
        return EXIT_FAILURE


def _user_message(err: InputError | UsageError) -> str:
    """One problem on one line; several under a heading that counts them."""
    if isinstance(err, InputError) and len(err.problems) == 1:
        return str(err.problems[0])
    return str(err)
