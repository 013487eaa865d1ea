"""The PyTorch examples run as a user would run them, shortened, and do what they claim."""

import re
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sklearn")

from multirank import REPO, child_env  # noqa: E402

EXAMPLES = REPO / "examples" / "pytorch"


def horovodrun(np, *argv, timeout=120):
    command = [sys.executable, "-m", "horovod.runner.launch", "-np", str(np), sys.executable, *map(str, argv)]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=child_env(), cwd=REPO)


def test_digits_converges_and_only_rank_zero_prints():
    proc = horovodrun(2, EXAMPLES / "pytorch_digits.py", "--epochs", "6", "--backward-passes-per-step", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[1]<stdout>" not in proc.stdout
    epochs = re.findall(r"\[0\]<stdout>:epoch +(\d+)/6 \[#+\] \d+/\d+ +loss ([\d.]+)", proc.stdout)
    assert [int(e) for e, _ in epochs] == list(range(1, 7))
    assert float(epochs[-1][1]) < float(epochs[0][1])
    accuracy = float(re.search(r"final test accuracy: ([\d.]+)%", proc.stdout).group(1))
    assert accuracy > 85.0, proc.stdout


def test_synthetic_benchmark_reports_per_rank_and_total():
    proc = horovodrun(2, EXAMPLES / "pytorch_synthetic_benchmark.py", "--no-cuda", "--model", "small_cnn",
                      "--image-size", "32", "--batch-size", "8", "--num-warmup-batches", "1",
                      "--num-batches-per-iter", "2", "--num-iters", "2", "--fp16-allreduce")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(re.findall(r"Iter #\d: [\d.]+ img/sec per CPU", proc.stdout)) == 2
    assert re.search(r"Img/sec per CPU: [\d.]+ \+-[\d.]+", proc.stdout)
    assert re.search(r"Total img/sec on 2 CPU\(s\): [\d.]+", proc.stdout)


def test_synthetic_benchmark_models_have_the_reference_sizes():
    sys.path.insert(0, str(EXAMPLES))
    try:
        import pytorch_synthetic_benchmark as bench
    finally:
        sys.path.remove(str(EXAMPLES))
    count = lambda name: sum(p.numel() for p in bench.MODELS[name](1000).parameters())  # noqa: E731
    assert count("resnet50") == 25_557_032  # torchvision's resnet50
    assert count("resnet18") == 11_689_512
    out = bench.MODELS["resnet50"](10)(torch.randn(1, 3, 64, 64))
    assert out.shape == (1, 10)


def test_run_from_python():
    proc = subprocess.run([sys.executable, str(EXAMPLES / "pytorch_run_from_python.py"), "--epochs", "10"],
                          capture_output=True, text=True, timeout=120, env=child_env(), cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "all ranks hold the same model" in proc.stdout
    weights = re.search(r"rank 0: weight \[([^\]]+)\]", proc.stdout).group(1)
    assert [round(float(w), 1) for w in weights.split(",")] == [2.0, -3.0, 0.5]
