"""khorovod installs as a pure-Python wheel: no compiler, no CMake."""

import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_builds_a_pure_python_wheel_with_the_horovodrun_entry_point(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
                    "-w", str(tmp_path), str(REPO)], check=True, timeout=300, capture_output=True)
    (wheel,) = tmp_path.glob("khorovod-*.whl")
    assert wheel.name.endswith("-py3-none-any.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        assert "horovod/numpy/__init__.py" in names and "horovod/runner/launch.py" in names
        assert not [n for n in names if n.endswith((".so", ".pyd", ".c"))]
        entry_points = archive.read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "horovodrun = horovod.runner.launch:run_commandline" in entry_points


def test_version_is_exposed():
    import horovod

    assert horovod.__version__ and horovod.__version__[0].isdigit()
