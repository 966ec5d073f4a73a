"""What every command shares on the command line: the exit codes and how errors reach the user.

A user's mistake (bad file, bad flag value) is one clear message and exit code 2; a failure of the
toolkit itself is exit code 1 with the traceback shown only under --verbose.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import fields
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import yaml

from judge.data import InputError

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


def settings_from_config(cls, config: str | Path, args: argparse.Namespace):
    """A settings dataclass from a YAML preset whose keys are its fields, each overridden by the flag of
    the same name when the user gave it (flags default to None for this reason)."""
    return cls(**config_values(cls, config, args))


def config_values(cls, config: str | Path, args: argparse.Namespace) -> dict:
    """The values `settings_from_config` builds `cls` from, for a caller that checks them first."""
    config = Path(config)
    if not config.is_file():
        raise UsageError(f"--config {config}: file not found")
    values = yaml.safe_load(config.read_text()) or {}
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
        print(f"error: {err}", file=sys.stderr)
        if verbose:
            traceback.print_exc()
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # the last line of defence: one line for the user, the trace on request
        print(f"error: {type(err).__name__}: {err}", file=sys.stderr)
        if verbose:
            traceback.print_exc()
        else:
            print("(run again with --verbose for the full traceback)", file=sys.stderr)
        return EXIT_FAILURE
