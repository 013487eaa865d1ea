"""docs/from-horovod.md says its two snippets run unchanged under Horovod and under khorovod: run
each one, as written, on two ranks through horovodrun, and check that it trained and that only
rank 0 reported (the page's own idiom, Horovod's: `if hvd.rank() == 0: print(...)`)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from multirank import hvdrun

PAGE = Path(__file__).resolve().parents[1] / "docs" / "from-horovod.md"
SNIPPETS = re.findall(r"^```python\n(.*?)^```", PAGE.read_text(), re.S | re.M)
TF_QUIET = {"TF_CPP_MIN_LOG_LEVEL": "3", "TF_ENABLE_ONEDNN_OPTS": "0", "CUDA_VISIBLE_DEVICES": ""}


def snippet(framework_import: str) -> str:
    (code,) = [code for code in SNIPPETS if framework_import in code]
    return code


def losses(lines: list[str], pattern: str) -> list[float]:
    return [float(m[1]) for line in lines if (m := re.search(pattern, line))]


def test_the_page_has_exactly_the_two_snippets():
    assert len(SNIPPETS) == 2, [code[:60] for code in SNIPPETS]


@pytest.mark.timeout(180)
def test_the_torch_snippet_trains_on_two_ranks():
    pytest.importorskip("torch")
    result = hvdrun(snippet("import horovod.torch as hvd"), np=2, timeout=150).check()
    found = losses(result.rank_lines.get(0, []), r"^epoch \d: loss ([\d.]+)$")
    assert len(found) == 3 and found[-1] < found[0], result.stdout[-2000:]
    assert not losses(result.rank_lines.get(1, []), r"loss ([\d.]+)"), result.stdout[-2000:]


@pytest.mark.timeout(240)
def test_the_keras_snippet_trains_on_two_ranks():
    pytest.importorskip("tensorflow")
    result = hvdrun(snippet("import horovod.tensorflow.keras as hvd"), np=2, env=TF_QUIET, timeout=210).check()
    found = [(float(m[1]), float(m[2])) for line in result.rank_lines.get(0, [])
             if (m := re.fullmatch(r"loss ([\d.]+) -> ([\d.]+)", line))]
    assert len(found) == 1 and found[0][1] < found[0][0], result.stdout[-2000:]  # the first epoch's mean, the last's
    assert not losses(result.rank_lines.get(1, []), r"loss ([\d.]+)"), result.stdout[-2000:]
