"""The toolkit's configuration files, as data: rubrics, scoring and training presets, DeepSpeed configs.

pyproject.toml installs this folder as the package `mmjudge.configs`, so a regular install (the wheel holds
mmjudge/configs/) and an editable one (setuptools maps `mmjudge.configs` onto this folder) find the files the
same way: through the import system, at CONFIG_DIR."""

from pathlib import Path

CONFIG_DIR = Path(__file__).resolve().parent
# MMIE's three categories: the rubrics judge-score and judge-train use unless told others.
DEFAULT_RUBRICS = tuple(CONFIG_DIR / "rubrics" / f"{name}.yaml" for name in ("sa", "pbl", "msr"))
