"""What every command shares on the command line: how flags are spelled, how file flags are read, the
exit codes and how errors reach the user.

- Flags are snake_case (`--model_path`, as MMIE-Eval's own script spells them), and each also answers to its
  kebab-case spelling (`--model-path`, as vLLM and VLMEvalKit users type them): `CommandParser` adds the
  second spelling to every flag of every command, and --help shows the first.
- A flag that names a file or folder is declared as one (`add_argument(..., path="file")`): after parsing,
  its value is the path to open, relative to the working directory unless its --help says otherwise (only
  judge-score's `--input_file`, which MMIE-Eval's `--input_dir D --input_file F` reads inside D); a bundled
  file may be named instead of a path (`bundled="train"`: `--config tiny`); and a file or folder that is not
  there is refused before anything runs, in one error that names each flag.
- A user's mistake (bad file, bad flag value, unusable checkpoint) is one clear message naming the flag or
  the file, and exit code 2; a failure of the toolkit itself is an "internal failure", exit code 1, with the
  traceback shown only under --verbose.
"""

from __future__ import annotations

import argparse
import copy
import errno
import functools
import math
import os
import reprlib
import sys
import traceback
import types
import typing
import warnings
from collections.abc import Callable, Sequence
from dataclasses import MISSING, dataclass, fields, replace
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from pydantic import TypeAdapter, ValidationError

from mmjudge.configs import bundled, by_name
from mmjudge.judge.cpu import use_free_cores
from mmjudge.judge.data import InputError, UsageError, missing_file, validation_problems
from mmjudge.judge.yamlfile import read_yaml

EXIT_BAD_INPUT = 2
EXIT_FAILURE = 1


def package_version() -> str:
    try:
        return version("mmjudge")
    except PackageNotFoundError:
        return "unknown (not installed)"


# What a path flag names: a file to read, a folder to read, either (a rubric file or a folder of them), a
# folder to write into (made if missing), a file to write.
PATH_KINDS = ("file", "dir", "file_or_dir", "output_dir", "output_file")


@dataclass(frozen=True)
class PathFlag:
    """A flag (or positional argument) that names a file or folder."""

    name: str  # the flag as messages name it, --input_file; "" for a positional argument, named by its value alone
    kind: str  # one of PATH_KINDS
    under: str | None = None  # the flag (dest) of a folder that a relative value is read in; None: the working directory
    bundled: str | None = None  # a kind of configs/ (configs.bundled): a value that is one of its names is that file


class CommandParser(argparse.ArgumentParser):
    """The parser of every command (module docstring): each snake_case flag also takes its kebab-case
    spelling, and the flags declared with `path=` are resolved and checked when the arguments are parsed."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        kwargs.setdefault("epilog", CONVENTIONS)
        self.path_flags: dict[str, PathFlag] = {}  # before argparse adds its --help
        super().__init__(*args, **kwargs)

    def add_argument(self, *names, **kwargs):
        return _declare(super().add_argument, self.path_flags, *names, **kwargs)

    def add_argument_group(self, *args, **kwargs):
        group = super().add_argument_group(*args, **kwargs)
        group.add_argument = functools.partial(_declare, group.add_argument, self.path_flags)  # a group's flags follow the same rules
        return group

    def error(self, message):
        """A flag argparse refuses, in one line as every other mistake (argparse prints the whole usage first)."""
        self.exit(2, f"{self.prog}: error: {message} ({self.prog} --help lists the flags)\n")

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        if not extras:  # else parse_args refuses the unknown arguments first, argparse's own way
            resolve_paths(self.path_flags, namespace)
        return namespace, extras


CONVENTIONS = ("Every flag is also accepted with hyphens for underscores (--model-path for --model_path). Paths are relative to the "
               "working directory unless a flag's help says otherwise. A bundled file's name (listed in its flag's help) names that "
               "file in any folder; write ./NAME for a file of that name in the working directory.")


def _declare(add: Callable, path_flags: dict[str, PathFlag], *names: str, path: str | None = None, under: str | None = None,
             bundled: str | None = None, **kwargs) -> argparse.Action:
    """Add a flag with its kebab-case spelling, and register it as a path flag when `path` says what it names."""
    spelled = list(names) + [kebab for name in names if name.startswith("--") and (kebab := "--" + name[2:].replace("_", "-")) not in names]
    if bundled is not None:
        kwargs["help"] = _with_names(kwargs.get("help", ""), bundled)
    action = add(*spelled, **kwargs)
    if path is not None:
        if path not in PATH_KINDS:
            raise ValueError(f"path={path!r}: one of {PATH_KINDS}")
        path_flags[action.dest] = PathFlag(names[0] if names[0].startswith("-") else "", path, under, bundled)
    return action


def _with_names(help_text: str, kind: str) -> str:
    """The help with the bundled names listed before its "(default: ...)"."""
    names = f"bundled by name: {', '.join(bundled(kind))}"
    text, sep, default = help_text.rpartition(" (default:")
    return f"{text}; {names}{sep}{default}" if sep else f"{help_text}; {names}"


def _shown(option_strings: list[str]) -> list[str]:
    """Each spelling of a flag once: the snake_case one (CONVENTIONS, the epilog, says hyphens work too)."""
    canonical = [s.lstrip("-").replace("-", "_") for s in option_strings]
    return [s for i, s in enumerate(option_strings) if canonical[i] not in canonical[:i]]


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """--help shows each flag once, in its snake_case spelling."""

    def _format_action_invocation(self, action: argparse.Action) -> str:
        shown = copy.copy(action)
        shown.option_strings = _shown(action.option_strings)
        return super()._format_action_invocation(shown)


class BooleanFlag(argparse.BooleanOptionalAction):
    """--flag and --no-flag, shown in the usage line once each (argparse lists every spelling there)."""

    def format_usage(self) -> str:
        return " | ".join(_shown(self.option_strings))


def resolve_paths(path_flags: dict[str, PathFlag], namespace: argparse.Namespace) -> None:
    """Each path flag's value replaced by the path it names (a bundled file's, or the value read in its
    folder), every one that cannot be read or written refused in one UsageError that names the flags."""
    problems = []
    for dest, flag in path_flags.items():
        value = getattr(namespace, dest, None)
        if value is None:
            continue
        resolved = [_resolved(flag, str(v), namespace, problems) for v in (value if isinstance(value, list) else [value])]
        setattr(namespace, dest, resolved if isinstance(value, list) else resolved[0])
    if problems:
        raise UsageError(problems[0] if len(problems) == 1 else f"{len(problems)} problems with the files and folders named:\n  " + "\n  ".join(problems))


def _resolved(flag: PathFlag, value: str, namespace: argparse.Namespace, problems: list[str]) -> str:
    """The path `value` names for `flag`; what is wrong with it goes to `problems`."""
    names = bundled(flag.bundled) if flag.bundled else {}
    if value in names:  # configs.by_name's rule: a bare name is the bundled file, whatever the working directory holds
        if Path(value).exists():
            print(f"note: {flag.name} {value} is the bundled {value}; for the {value} here, write ./{value}", file=sys.stderr)
        return str(names[value])
    folder = getattr(namespace, flag.under) if flag.under else None
    path = Path(folder) / value if folder is not None else Path(value)
    if folder is not None and not Path(folder).is_dir():
        return str(path)  # the folder's own flag says what is wrong
    if problem := _path_problem(flag.kind, path):
        named = f"{flag.name} {value}".lstrip()
        message = f"{named}: {path}: {problem} ({flag.name} is read in --{flag.under})" if folder is not None else f"{named}: {problem}"
        if folder is not None and not Path(value).is_absolute() and Path(value).is_file():
            message += f"; {value} is in the working directory, not in --{flag.under}: give its absolute path"
        problems.append(message + (f"; bundled by name: {', '.join(names)}" if names else ""))
    return value if folder is None else str(path)  # as given: ./tiny stays a path, never read as a name again


def _path_problem(kind: str, path: Path) -> str | None:
    """Why `path` cannot be what a flag of `kind` names, or None."""
    try:
        if kind == "file":
            return None if path.is_file() else missing_file(path)
        if kind == "dir":
            return None if path.is_dir() else "a file, not a folder" if path.exists() else "folder not found"
        if kind == "file_or_dir":
            return None if path.is_file() or path.is_dir() else missing_file(path)
        if kind == "output_dir" and path.exists() and not path.is_dir():
            return "a file is there; give a folder"
        if kind == "output_file" and path.is_dir():
            return "a folder is there; give a file name"
        if path.is_dir():  # "." and "/" among them, which have no parents
            return None
        above = next((folder for folder in path.absolute().parents if folder.exists()), None)  # the folders below it are made
        return None if above is None or above.is_dir() else f"{above} is a file, not a folder"
    except OSError as err:  # a name longer than the filesystem takes
        return f"unusable ({err.strerror})"


def path_problems(given: Sequence[tuple[str, object, str]]) -> list[str]:
    """What the parser finds of path flags, for the Python API, which has none: each (flag, value, kind of
    PATH_KINDS) whose value is not a path (a str or Path) or names nothing of its kind, named by its flag
    (the API names it by keyword: mmjudge.api.as_keywords). None: not given."""
    problems = []
    for flag, value, kind in given:
        if value is None:
            continue
        if not isinstance(value, (str, Path)) or value == "":
            problems.append(f"{flag}: give a path (a str or Path), not {reprlib.repr(value) if value == '' else type(value).__name__}")
        elif problem := _path_problem(kind, Path(value)):
            problems.append(f"{flag} {value}: {problem}")
    return problems


def add_common_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--verbose", action="store_true", help="show full tracebacks on errors (default: off)")
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")


def add_revision_flag(parser: argparse.ArgumentParser, of: str = "--model_path") -> None:
    parser.add_argument("--revision", help=f"branch, tag or commit of {of} where it is a Hugging Face Hub id (default: main)")


def add_settings_flags(parser: argparse.ArgumentParser, cls, applied: dict) -> None:
    """One flag per field of the settings dataclass `cls` (a field whose metadata says `flag: False` has
    none), with the help in the field's metadata. The default shown is the value a run would use,
    `applied[name]` (config_values' result, or a text where it depends on the format). The flags themselves
    default to None: settings_from_config applies only the ones the user gave, over the --config file."""
    hints = typing.get_type_hints(cls)
    for f in fields(cls):
        if not f.metadata.get("flag", True):
            continue
        value = applied[f.name]
        shown = " ".join(map(str, value)) if isinstance(value, (list, tuple)) else "none" if value is None else value
        names = [f"--{f.name}"]  # the parser adds the kebab-case spelling
        help_text = f"{f.metadata['help']} (default: {shown})"
        kind = hints[f.name]
        if isinstance(kind, types.UnionType) and typing.get_origin(given := next(a for a in typing.get_args(kind) if a is not type(None))) is list:
            kind = given  # an optional list: none given is the default
        if kind in (bool, bool | None):  # none: not given on the command line
            parser.add_argument(*names, action=BooleanFlag, default=None, help=help_text)
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
    surprises (`1e-4` is a string) are named here rather than failing deep inside a run: each by the flag
    (or the API's keyword) that gave it, or else by the config."""
    try:
        return TypeAdapter(cls).validate_python(config_values(cls, config, args))
    except ValidationError as err:
        given = {name for name, value in vars(args).items() if value is not None}
        problems = validation_problems(config or "the defaults", None, None, err)
        setting = lambda p: (p.field or "").split("[")[0]  # noqa: E731  (scale[0]: the setting scale)
        raise InputError([replace(p, file=f"--{setting(p)}", field=None if p.field == setting(p) else p.field) if setting(p) in given else p
                          for p in problems]) from None


def flag_given(argv: Sequence[str] | None, flag: str) -> str | None:
    """The value of `--flag` (or `--fl-ag`) in argv, read before the parser is built: --help shows the
    settings that `--config` or `--format` would apply."""
    names = [f"--{flag}"] + ([f"--{flag.replace('_', '-')}"] if "_" in flag else [])
    early = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    early.add_argument(*names, dest="value")
    return early.parse_known_args(list(argv or []))[0].value


def config_given(argv: Sequence[str] | None, kind: str | None, default: Path | None = None) -> Path | None:
    """The YAML that `--config` names in argv (a bundled preset of `kind` by name, or a path), read before
    the parser is built so that --help shows its values; `default` where none is given or it is not a
    file (the parser then says so, beside any other path that is wrong)."""
    value = flag_given(argv, "config")
    path = (by_name(kind, value) if kind else Path(value)) if value else None
    return path if path is not None and path.is_file() else default


def setting_problems(cls, values: dict) -> list[str]:
    """Every value in `values` for a field of the settings dataclass `cls` that cannot work, each with what
    would: a Literal's choices, a bool, and a number's range where the field's metadata gives a `minimum`
    (a bound it must stay over instead where its `above` is true, and a `below`, a bound it must stay under).
    Other fields are left to their types' checks."""
    hints = typing.get_type_hints(cls)
    problems = []
    for f in fields(cls):
        value, hint, minimum = values.get(f.name, f.default), hints[f.name], f.metadata.get("minimum")
        if typing.get_origin(hint) is typing.Literal:
            ok, wanted = value in typing.get_args(hint), "one of " + ", ".join(typing.get_args(hint))
        elif hint in (bool, bool | None):
            ok = isinstance(value, bool) or (value is None and hint != bool)
            wanted = "true or false" + (" or none" if hint != bool else "")
        elif minimum is not None:  # a number, or none where the type allows it
            ok, wanted = _in_range(value, hint, minimum, f.metadata.get("below"), f.metadata.get("above", False))
        elif isinstance(value, float):  # a number of no set range is still finite: inf and NaN failed far into a run
            ok, wanted = math.isfinite(value), "a finite number"
        else:
            continue
        if not ok:
            problems.append(f"{f.name} must be {wanted}, got {reprlib.repr(value)}")  # a value may be megabytes
    return problems


def _in_range(value, hint, minimum, below, above: bool = False) -> tuple[bool, str]:
    """Whether `value` is a number of the field's kind within [minimum, below) (with `above`, (minimum, below)),
    and what that means in words."""
    optional = type(None) in typing.get_args(hint)
    whole = int in (typing.get_args(hint) or (hint,))
    kinds = (int,) if whole else (int, float)
    number = (type(value) in kinds and (type(value) is int or math.isfinite(value)) and (value > minimum if above else value >= minimum)
              and (below is None or value < below))
    wanted = (f"{'a whole number' if whole else 'a finite number'} {'above' if above else 'of at least'} {minimum:g}"
              + (f" and below {below:g}" if below is not None else ""))
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
    use_free_cores()  # before torch loads: no command imports it before this
    forbid_pickled_code()
    keep_deprecations_from_users()
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


def keep_deprecations_from_users() -> None:
    """The libraries' deprecation notices (FutureWarning, DeprecationWarning) address whoever calls their API, this
    toolkit's developers, whose test runs show them; the user of a command can do nothing about them, and one
    (`is_gradient_checkpointing` is deprecated, from PEFT) came with every adapter loaded."""
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)


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
        return str(err.problems[0]) + (f" ({err.hint})" if err.hint else "")
    return str(err)
