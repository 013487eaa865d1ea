"""Collective benchmarks from a checkout: the same as `python -m horovod.benchmarks`.

    python benchmarks/collectives.py all latency --compare
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from horovod.benchmarks.__main__ import main  # noqa: E402

sys.exit(main())
