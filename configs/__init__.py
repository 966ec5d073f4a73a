"""The toolkit's configuration files, as data: rubrics, scoring and training presets, DeepSpeed configs.

pyproject.toml installs this folder as the package `mmjudge.configs`, so a regular install (the wheel holds
mmjudge/configs/) and an editable one (setuptools maps `mmjudge.configs` onto this folder) find the files the
same way: through the import system, at CONFIG_DIR.

Each kind of file is also known by name (`bundled`): `--config tiny`, `--deepspeed zero2`, `--rubric tiny`
and `Judge.load(..., rubrics="tiny")` name configs/train/tiny.yaml, configs/deepspeed/zero2.json and the
folder configs/rubrics/tiny/ from any working directory."""

from pathlib import Path

CONFIG_DIR = Path(__file__).resolve().parent
# MMIE's three categories: the rubrics judge-score and judge-train use unless told others.
DEFAULT_RUBRICS = tuple(CONFIG_DIR / "rubrics" / f"{name}.yaml" for name in ("sa", "pbl", "msr"))

# The kinds of bundled file: the folder under configs/ that holds them, and their suffix.
KINDS = {"score": ".yaml", "train": ".yaml", "deepspeed": ".json", "rubrics": ".yaml"}


def bundled(kind: str) -> dict[str, Path]:
    """The bundled files of a kind by name, the file name without its suffix: {"tiny": .../train/tiny.yaml}.
    A rubric set is a folder of rubric files, named by the folder: {"tiny": .../rubrics/tiny}."""
    suffix = KINDS[kind]
    found = {}
    for path in sorted((CONFIG_DIR / kind).iterdir()):
        if path.is_file() and path.suffix == suffix:
            found[path.stem] = path
        elif path.is_dir() and any(path.glob(f"*{suffix}")):
            found[path.name] = path
    return found


def by_name(kind: str, value: str | Path) -> Path:
    """The bundled file of `kind` that `value` names, or else `value` as a path. A bare name is the bundled
    file even where the working directory holds a file of that name (`./tiny` names that one): a command
    means the same in every folder."""
    return bundled(kind).get(str(value), Path(value))


def rubric_paths(rubrics: str | Path | list[str | Path] | tuple[str | Path, ...] | None) -> list[Path] | None:
    """Rubric files or folders, each a bundled one's name or a path; None: none given."""
    if rubrics is None:
        return None
    return [by_name("rubrics", r) for r in ([rubrics] if isinstance(rubrics, (str, Path)) else rubrics)]
