"""What a regular (non-editable) `pip install` gets, and what the sdist holds: the wheel adds one import
name, `mmjudge`, holding every module and every file under configs/; it carries the license; an installed
judge finds its configs inside the package, as the editable install does in the checkout; and the sdist is
the whole project, its test suite included, so that the installed package can be tested from it
(`make test-installed` does: .ci/installed.sh)."""

import email
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

import mmjudge
from mmjudge.configs import CONFIG_DIR

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("judge", "infer", "train", "calibration", "demo", "serve")  # installed as mmjudge.<folder>


def project_files() -> list[str]:
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.splitlines()
    return [name for name in listed if (ROOT / name).is_file()]


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """A copy of the project's files: the checkout's own build/ may hold stale modules."""
    source = tmp_path_factory.mktemp("source")
    for name in project_files():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_bytes((ROOT / name).read_bytes())
    return source


@pytest.fixture(scope="module")
def wheel(source, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(source), "-w", str(out)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return next(out.glob("mmjudge-*.whl"))


@pytest.fixture(scope="module")
def sdist(source, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sdist")
    build = f"from setuptools import build_meta; print(build_meta.build_sdist({str(out)!r}))"
    done = subprocess.run([sys.executable, "-c", build], cwd=source, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return out / done.stdout.split()[-1]


@pytest.mark.slow
def test_the_wheel_holds_every_module_and_config_file(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    files = project_files()
    configs = {"mmjudge/" + name for name in files if name.startswith("configs/")}
    modules = {("" if name.startswith("mmjudge/") else "mmjudge/") + name for name in files
               if name.split("/")[0] in ("mmjudge", *PACKAGES) and name.endswith(".py")}
    assert configs and configs <= names, sorted(configs - names)
    assert modules <= names, sorted(modules - names)


@pytest.mark.slow
def test_the_wheel_adds_one_import_name_and_carries_the_license(wheel):
    """Six generic top-level packages (judge, infer, train, ...) went into site-packages, where a user's own
    train.py or serve/ shadowed them."""
    archive = zipfile.ZipFile(wheel)
    info = next(name.split("/")[0] for name in archive.namelist() if name.endswith(".dist-info/METADATA"))
    assert {name.split("/")[0] for name in archive.namelist()} == {"mmjudge", info}
    meta = email.message_from_bytes(archive.read(f"{info}/METADATA"))
    assert (meta["License-Expression"], meta["License-File"]) == ("Apache-2.0", "LICENSE")
    assert archive.read(f"{info}/licenses/LICENSE") == (ROOT / "LICENSE").read_bytes()
    assert b"Apache License\n                           Version 2.0, January 2004" in (ROOT / "LICENSE").read_bytes()


@pytest.mark.slow
def test_the_sdist_is_the_whole_project_its_test_suite_included(sdist):
    """It held 8 of the suite's files: neither tests/conftest.py nor any test folder, nor LICENSE."""
    with tarfile.open(sdist) as archive:
        held = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    left_out = set(project_files()) - held - {".gitignore"}
    assert {"tests/conftest.py", "LICENSE", "requirements/lock.txt"} <= held and left_out == set(), sorted(left_out)


@pytest.mark.slow
def test_an_installed_judge_finds_its_configs_inside_the_package(wheel, tmp_path):
    site = tmp_path / "site-packages"
    zipfile.ZipFile(wheel).extractall(site)
    probe = "import mmjudge.configs as c, mmjudge.judge.prompts as p; print(c.CONFIG_DIR); print(sorted(p.load_rubrics()))"
    done = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env={"PYTHONPATH": str(site), "PATH": ""},
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == [str(site / "mmjudge" / "configs"), "['MSR', 'PBL', 'SA']"]


def test_the_configs_are_those_of_the_package_under_test():
    """In the checkout (an editable install) the folder configs/ itself, so that an edit there is live; in
    a regular install (`make test-installed`), mmjudge/configs in site-packages."""
    installed = Path(mmjudge.__file__).resolve().parent / "configs"
    assert CONFIG_DIR == (ROOT / "configs" if (ROOT / "configs").is_dir() else installed)
    assert (CONFIG_DIR / "rubrics" / "sa.yaml").is_file()
