"""The small regression problem that the PyTorch extension tests train on every rank.

`prelude(dtype)` is the start of a snippet for `multirank.hvdrun`: it initialises Horovod and
defines the data `X`, `Y` (12 rows), this rank's rows `ROWS`, `make()` (the same 5-7-3 MLP on
every call), `flat(tensors)` and `same_on_every_rank(tensors)`.
"""

_PRELUDE = r'''
import torch
import horovod.torch as hvd

torch.set_num_threads(1)
hvd.init()
r, n = hvd.rank(), hvd.size()
torch.manual_seed(0)
X, Y = torch.randn(12, 5, dtype=DTYPE), torch.randn(12, 3, dtype=DTYPE)
ROWS = torch.arange(12)[r::n]

def make():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3)).to(DTYPE)

def flat(tensors):
    return torch.cat([t.detach().reshape(-1) for t in tensors])

def same_on_every_rank(tensors):
    every = hvd.allgather(flat(tensors).unsqueeze(0))
    return all(torch.equal(every[0], row) for row in every)
'''


def prelude(dtype: str = "torch.float64") -> str:
    return _PRELUDE.replace("DTYPE", dtype)
