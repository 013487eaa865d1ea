"""Run N in-place 4 KiB allreduces through horovod.torch on one rank, then leave.

Used with callgrind to count the CPU work of one op independently of the machine's load:
the difference between two runs (N = 200 and N = 1200) divided by 1,000 is the per-op count.

    valgrind --tool=callgrind python benchmarks/ops_loop.py 200
    valgrind --tool=callgrind python benchmarks/ops_loop.py 1200
"""

import sys

import torch

import horovod.torch as hvd

hvd.init()
tensor = torch.ones(1024)
for _ in range(int(sys.argv[1])):
    hvd.allreduce_(tensor, name="w")
hvd.shutdown()
