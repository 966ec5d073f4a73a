"""The toolkit's configuration files, as data: rubrics, scoring and training presets, DeepSpeed configs.

pyproject.toml installs this folder as the package `judge.configs`, so a regular install (the wheel holds
judge/configs/) and an editable one (setuptools maps `judge.configs` onto this folder) find the files the
same way: through the import system, at CONFIG_DIR."""

from pathlib import Path

CONFIG_DIR = Path(__file__).resolve().parent
