"""Writes requirements/lock.txt (`make lock`): every dependency pyproject.toml declares, with its test, deepspeed,
rl and ray extras, pinned at the lower bound of its range, and what they need in turn as pip resolves it
for this Python (3.11, as CI runs). `make test` runs the whole suite on this lock, and `make test-installed`
runs the quick loop on the newest versions the ranges allow: both ends of every range are tested.

torch and deepspeed are left to the Makefile, which installs them first (torch's CPU build, and DeepSpeed
built against it); the lock holds what they need."""

import json
import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXTRAS = ("test", "deepspeed", "rl", "ray")
MAKEFILE_INSTALLS = {"torch", "deepspeed"}


def lower_bound(requirement: str) -> str:
    """`name==version` at the range's lower bound: `>=X` or `==X` (`==X.*` as X.0); the name keeps its extras
    (`ray[data,serve]`), whose own dependencies the lock must hold too."""
    name, specifier = re.fullmatch(r"([A-Za-z0-9._-]+(?:\[[A-Za-z0-9._,-]+\])?)\s*(.*)", requirement).groups()
    bound = re.search(r"(?:>=|==)\s*([0-9][0-9A-Za-z.]*?)(\.\*)?(?:,|$)", specifier)
    if bound is None:
        raise SystemExit(f"pyproject.toml: {requirement!r} has no lower bound (>= or ==): say which version was tested")
    return f"{name}=={bound.group(1)}{'.0' if bound.group(2) else ''}"


def main() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = project["dependencies"] + [r for extra in EXTRAS for r in project["optional-dependencies"][extra]]
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "lowest.in").write_text("\n".join(map(lower_bound, declared)) + "\n")
        report = Path(tmp) / "report.json"
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--dry-run", "--ignore-installed",
                        "--report", str(report), "-r", str(Path(tmp) / "lowest.in")], check=True)
        resolved = json.loads(report.read_text())["install"]
    pins = sorted(((item["metadata"]["name"], item["metadata"]["version"]) for item in resolved
                   if item["metadata"]["name"].lower() not in MAKEFILE_INSTALLS), key=lambda pin: pin[0].lower())
    header = (f"# Written by `make lock` (requirements/lock.py) for Python {sys.version_info.major}.{sys.version_info.minor}: "
              "pyproject.toml's dependencies at their lower bounds.\n")
    (ROOT / "requirements" / "lock.txt").write_text(header + "".join(f"{name}=={version}\n" for name, version in pins))


if __name__ == "__main__":
    main()
