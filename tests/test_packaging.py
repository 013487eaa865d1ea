"""khorovod installs as a pure-Python wheel: no compiler, no CMake."""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

from packaging.version import Version

import horovod
import horovod.version

REPO = Path(__file__).resolve().parents[1]


def test_builds_a_pure_python_wheel_with_the_horovodrun_entry_point(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
                    "-w", str(tmp_path), str(REPO)], check=True, timeout=300, capture_output=True)
    (wheel,) = tmp_path.glob("khorovod-*.whl")
    assert wheel.name.endswith("-py3-none-any.whl")
    # The distribution carries khorovod's own version, not the Horovod API level.
    assert wheel.name.startswith(f"khorovod-{horovod.version.__khorovod_version__}-")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        assert "horovod/numpy/__init__.py" in names and "horovod/runner/launch.py" in names
        assert not [n for n in names if n.endswith((".so", ".pyd", ".c"))]
        entry_points = archive.read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "horovodrun = horovod.runner.launch:run_commandline" in entry_points


def test_version_is_exposed():
    assert horovod.__version__ and horovod.__version__[0].isdigit()


def test_version_is_the_horovod_api_level_and_khorovods_own_stays_visible():
    # Scripts gate on Horovod's numbering (`hvd.__version__ >= "0.21"`).
    assert horovod.__version__ == horovod.version.__version__ == "0.28.1"
    assert Version(horovod.__version__) >= Version("0.21")
    assert horovod.__khorovod_version__ == horovod.version.__khorovod_version__
    assert "__khorovod_version__" in horovod.__all__


def test_horovodrun_version_prints_both():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-m", "horovod.runner.launch", "--version"], env=env,
                          capture_output=True, text=True, timeout=60, check=True)
    assert proc.stdout == horovod.__version__ + "\n"  # alone, as Horovod prints it: scripts parse it
    assert f"khorovod {horovod.__khorovod_version__}" in proc.stderr
