"""What every command shares on the command line: the exit codes and how errors reach the user.

A user's mistake (bad file, bad flag value, unusable checkpoint) is one clear message naming the file,
and exit code 2; a failure of the toolkit itself is an "internal failure", exit code 1, with the
traceback shown only under --verbose.
"""

from __future__ import annotations

import argparse
import errno
import os
import reprlib
import sys
import traceback
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import MISSING, fields
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from pydantic import TypeAdapter, ValidationError

from mmjudge.judge.data import InputError, UsageError, missing_file, validation_problems
from mmjudge.judge.yamlfile import read_yaml

EXIT_BAD_INPUT = 2
EXIT_FAILURE = 1


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


def add_settings_flags(parser: argparse.ArgumentParser, cls, applied: dict) -> None:
    """One flag per field of the settings dataclass `cls` (a field whose metadata says `flag: False` has
    none), spelled with underscores or hyphens, with the help in the field's metadata. The default shown
    is the value a run would use, `applied[name]` (config_values' result, or a text where it depends on
    the format). The flags themselves default to None: settings_from_config applies only the ones the user
    gave, over the --config file."""
    hints = typing.get_type_hints(cls)
    for f in fields(cls):
        if not f.metadata.get("flag", True):
            continue
        value = applied[f.name]
        shown = " ".join(map(str, value)) if isinstance(value, (list, tuple)) else "none" if value is None else value
        names = [f"--{f.name}"] + ([f"--{f.name.replace('_', '-')}"] if "_" in f.name else [])
        help_text = f"{f.metadata['help']} (default: {shown})"
        kind = hints[f.name]
        if isinstance(kind, types.UnionType) and typing.get_origin(given := next(a for a in typing.get_args(kind) if a is not type(None))) is list:
            kind = given  # an optional list: none given is the default
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


def settings_from_config(cls, config: str | Path | None, args: argparse.Namespace):
    """A settings dataclass from its declared defaults, overridden by a YAML preset whose keys are its
    fields (when there is one), each overridden by the flag of the same name when the user gave it (flags
    default to None for this reason). Values are checked against the fields' types, so that YAML's
    surprises (`1e-4` is a string) are named here rather than failing deep inside a run."""
    try:
        return TypeAdapter(cls).validate_python(config_values(cls, config, args))
    except ValidationError as err:
        raise InputError(validation_problems(config or "flags", None, None, err)) from None


def flag_given(argv: Sequence[str] | None, flag: str) -> str | None:
    """The value of `--flag` (or `--fl-ag`) in argv, read before the parser is built: --help shows the
    settings that `--config` or `--format` would apply."""
    names = [f"--{flag}"] + ([f"--{flag.replace('_', '-')}"] if "_" in flag else [])
    early = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    early.add_argument(*names, dest="value")
    return early.parse_known_args(list(argv or []))[0].value


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
            problems.append(f"{f.name} must be {wanted}, got {reprlib.repr(value)}")  # a value may be megabytes
    return problems


def _in_range(value, hint, minimum, below) -> tuple[bool, str]:
    """Whether `value` is a number of the field's kind within [minimum, below), and what that means in words."""
    optional = type(None) in typing.get_args(hint)
    whole = int in (typing.get_args(hint) or (hint,))
    kinds = (int,) if whole else (int, float)
    number = type(value) in kinds and value >= minimum and (below is None or value < below)  # NaN fails both
    wanted = f"{'a whole number' if whole else 'a number'} of at least {minimum:g}" + (f" and below {below:g}" if below is not None else "")
    return (optional and value is None) or number, wanted + (" or none" if optional else "")


def config_values(cls, config: str | Path | None, args: argparse.Namespace) -> dict:
    """The values `settings_from_config` builds `cls` from, over the declared defaults, for a caller that
    checks them first."""
    defaults = {f.name: f.default for f in fields(cls) if f.default is not MISSING}
    defaults |= {f.name: f.default_factory() for f in fields(cls) if f.default_factory is not MISSING}
    given = {k: v for k, v in vars(args).items() if k in {f.name for f in fields(cls)} and v is not None}
    return defaults | (preset_values(cls, Path(config)) if config else {}) | given


def preset_values(cls, config: Path) -> dict:
    """The settings a YAML preset gives, each a field of `cls`."""
    if not config.is_file():
        raise UsageError(f"--config {config}: {missing_file(config)}")
    values = read_yaml(config) or {}
    if not isinstance(values, dict):
        raise UsageError(f"--config {config}: expected a mapping of setting: value, got a YAML {type(values).__name__}")
    known = {f.name for f in fields(cls)}
    if unknown := set(values) - known:
        raise UsageError(f"{config}: unknown setting(s) {sorted(unknown)}; known: {sorted(known)}")
    return values


def run(main: Callable[[Sequence[str] | None], int | None], argv: Sequence[str] | None = None) -> int:
    """Call a command's main, turning known errors into a message and an exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    verbose = "--verbose" in args
    forbid_pickled_code()
    try:
        return main(args) or 0
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # the last line of defence: one line for the user, the trace on request
        message, code = _explained(err)
        print(f"error: {message}", file=sys.stderr)
        if verbose:
            traceback.print_exc()
        elif code == EXIT_FAILURE:
            print("(run again with --verbose for the full traceback)", file=sys.stderr)
        return code


def forbid_pickled_code() -> None:
    """Every torch.load of this process and its children reads weights only: tensors, plain data and the
    types allow-listed with torch.serialization.add_safe_globals, never an arbitrary global, even where a
    library asks for weights_only=False (DeepSpeed does, for its checkpoints). The toolkit trusts a
    checkpoint's tensors and data files, never its code or pickled objects."""
    os.environ.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)  # torch refuses to load at all when both are set
    os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = "1"


# OSErrors that say what the machine lacks (space, quota, permission) or cannot take (a path too long), not
# what the toolkit got wrong.
ENVIRONMENT_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENAMETOOLONG)


def _explained(err: Exception) -> tuple[str, int]:
    if isinstance(err, (InputError, UsageError)):
        return _user_message(err), EXIT_BAD_INPUT
    if isinstance(err, OSError) and err.errno in ENVIRONMENT_ERRORS:
        # A full disk or a read-only directory is the user's to fix; what was finished is kept.
        return f"{err.filename or 'a file'}: {err.strerror}", EXIT_BAD_INPUT
    return f"internal failure: {type(err).__name__}: {err}", EXIT_FAILURE


def _user_message(err: InputError | UsageError) -> str:
    """One problem on one line; several under a heading that counts them."""
    if isinstance(err, InputError) and len(err.problems) == 1:
        return str(err.problems[0])
    return str(err)
