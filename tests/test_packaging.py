"""What a regular (non-editable) `pip install .` gets: the wheel holds every module and every file under
configs/, and an installed judge finds its configs inside the package, as the editable install does in
the checkout."""

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from mmjudge.configs import CONFIG_DIR

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("judge", "infer", "train", "calibration", "demo", "serve")  # installed as mmjudge.<folder>


def project_files() -> list[str]:
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.splitlines()
    return [name for name in listed if (ROOT / name).is_file()]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    # Built from a copy of the project's files: the checkout's own build/ may hold stale modules.
    source, out = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("wheel")
    for name in project_files():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_bytes((ROOT / name).read_bytes())
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(source), "-w", str(out)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return next(out.glob("mmjudge-*.whl"))


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
def test_an_installed_judge_finds_its_configs_inside_the_package(wheel, tmp_path):
    site = tmp_path / "site-packages"
    zipfile.ZipFile(wheel).extractall(site)
    probe = "import mmjudge.configs as c, mmjudge.judge.prompts as p; print(c.CONFIG_DIR); print(sorted(p.load_rubrics()))"
    done = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env={"PYTHONPATH": str(site), "PATH": ""},
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == [str(site / "mmjudge" / "configs"), "['MSR', 'PBL', 'SA']"]


def test_the_editable_install_finds_them_in_the_checkout():
    assert CONFIG_DIR == ROOT / "configs"
