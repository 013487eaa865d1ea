"""The TensorFlow and Keras examples, run as a user runs them (shortened), doing what they claim."""

import importlib.util
import re
import subprocess
import sys

import pytest

tf = pytest.importorskip("tensorflow")
pytest.importorskip("sklearn")

from multirank import REPO, child_env  # noqa: E402
from tfrun import ENV  # noqa: E402

BENCH_FLAGS = ["--model", "MobileNetV2", "--image-size", "32", "--batch-size", "4", "--num-warmup-batches", "1",
               "--num-batches-per-iter", "2", "--num-iters", "2", "--fp16-allreduce"]


def horovodrun(script, *args, backend="tensorflow"):
    command = [sys.executable, "-m", "horovod.runner.launch", "-np", "2", sys.executable,
               str(REPO / "examples" / script), *args]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=240,
                          env=child_env(dict(ENV, KERAS_BACKEND=backend)), cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "[1]<stdout>" not in proc.stdout, "only rank 0 prints"
    return proc.stdout


def test_tensorflow2_custom_loop_converges():
    out = horovodrun("tensorflow2/tensorflow2_digits.py", "--epochs", "5")
    epochs = re.findall(r"epoch (\d)/5: loss ([\d.]+), test accuracy ([\d.]+)", out)
    assert [int(e) for e, _, _ in epochs] == [1, 2, 3, 4, 5]
    assert float(epochs[-1][1]) < float(epochs[0][1]) and float(epochs[-1][2]) > 0.9, out


def test_tensorflow2_keras_fit_converges(tmp_path):
    out = horovodrun("tensorflow2/tensorflow2_keras_digits.py", "--epochs", "5",
                     "--checkpoint", str(tmp_path / "digits-{epoch}.keras"))
    assert "learning rate warmup complete" in out
    assert float(re.search(r"test accuracy ([\d.]+)", out).group(1)) > 0.9, out
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"digits-{e}.keras" for e in range(1, 6)]


@pytest.mark.parametrize("script", ["tensorflow2/tensorflow2_synthetic_benchmark.py",
                                    "keras/keras_synthetic_benchmark.py"])
def test_synthetic_benchmarks_report_per_rank_and_total(script):
    out = horovodrun(script, *BENCH_FLAGS)
    assert len(re.findall(r"Iter #\d: [\d.]+ img/sec per CPU", out)) == 2
    assert re.search(r"Img/sec per CPU: [\d.]+ \+-[\d.]+", out)
    assert re.search(r"Total img/sec on 2 CPU\(s\): [\d.]+", out)


@pytest.mark.parametrize("backend", ["jax"])  # (the TensorFlow backend runs in the tests above)
def test_keras_example_on_another_backend(backend):
    if importlib.util.find_spec(backend) is None:
        pytest.skip(f"the Keras {backend} backend is not installed")
    out = horovodrun("keras/keras_digits.py", "--epochs", "5", backend=backend)
    assert float(re.search(rf"backend {backend}: test accuracy ([\d.]+)", out).group(1)) > 0.9, out
