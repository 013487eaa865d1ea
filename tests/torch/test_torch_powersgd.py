"""PowerSGD compression through DistributedOptimizer on real ranks: plain allreduce in its starting
phase, exact at full rank, and at low rank its error feedback loses nothing over the steps."""

import pytest

torch = pytest.importorskip("torch")

from multirank import hvdrun  # noqa: E402
from torch_regression import prelude  # noqa: E402

POWERSGD = prelude() + r'''
def train(model, compression, rows, steps=4):
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters(), compression=compression)
    for _ in range(steps):
        opt.zero_grad()
        (((model(X[rows]) - Y[rows]) ** 2).sum() / len(rows)).backward()
        opt.step()
    return model

reference = train(make(), hvd.Compression.none, torch.arange(12))  # one process's numbers (no other rank needed)
starting = train(make(), hvd.Compression.powersgd(start_powerSGD_iter=10), ROWS)
full_rank = train(make(), hvd.Compression.powersgd(matrix_approximation_rank=7, start_powerSGD_iter=1,
                                                  min_compression_rate=0), ROWS)
report(starting=(flat(starting.parameters()) - flat(reference.parameters())).abs().max().item(),
       full_rank=(flat(full_rank.parameters()) - flat(reference.parameters())).abs().max().item())

# Low rank, gradients that do not depend on the weights (each rank's own random matrix per step):
# with plain SGD, the weights PowerSGD reaches plus what its error feedback still holds are the
# weights plain averaging reaches, whatever the approximations lost on the way.
weight = torch.nn.Parameter(torch.zeros(6, 8, dtype=torch.float64))
compression = hvd.Compression.powersgd(matrix_approximation_rank=1, start_powerSGD_iter=2)
opt = hvd.DistributedOptimizer(torch.optim.SGD([weight], lr=0.1), named_parameters=[("w", weight)],
                               compression=compression)
generator = torch.Generator().manual_seed(10 + r)
expected = torch.zeros(6, 8, dtype=torch.float64)
for step in range(6):
    c = torch.randn(6, 8, generator=generator, dtype=torch.float64)
    expected -= 0.1 * hvd.allreduce(c, op=hvd.Average, name=f"expected.{step}")
    opt.zero_grad()
    (weight * c).sum().backward()
    opt.step()
error = compression.error_of("w")
left = hvd.allreduce(error, op=hvd.Average, name="left")
report(low_rank=(weight.detach() - 0.1 * left - expected).abs().max().item(), lossy=error.abs().max().item())

try:
    model = make()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), op=hvd.Sum,
                                   compression=hvd.Compression.powersgd())
    model(X).sum().backward()
except ValueError as e:
    report(sum_error=str(e))
'''


@pytest.mark.parametrize("np", [2, 3])
def test_powersgd_starting_phase_full_rank_and_error_feedback(np):
    result = hvdrun(POWERSGD, np=np, timeout=180).check()
    for rank in range(np):
        got = result.ranks[rank]
        assert got["starting"] < 1e-12, got
        assert got["full_rank"] < 1e-9, got
        assert got["low_rank"] < 1e-12 and got["lossy"] > 1e-3, got  # rank 1 of a 6x8 matrix loses a lot
        assert "PowerSGD compression averages gradients" in got["sum_error"] and "op=hvd.Average" in got["sum_error"]
