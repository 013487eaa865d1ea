"""PowerSGD gradient compression with error feedback (Vogels, Karimireddy and Jaggi, NeurIPS 2019).

A khorovod extension, chosen like the other compressions:
`DistributedOptimizer(opt, compression=hvd.Compression.powersgd(matrix_approximation_rank=1))`.
Unlike a cast it is not a function of one tensor: it keeps, per gradient, the error of its last
approximation and the last `Q` factor, and reduces a step's gradients together. A gradient of
shape (n, ...) is seen as an n x m matrix M (plus the error left from the last step) and sent as
two thin factors: `P = M Q` (n x r) is averaged and orthogonalised, then `Q = M^T P` (m x r) is
averaged, and `P Q^T` replaces the gradient; what it missed is added to the next step's M. Per
step that is (n + m) r numbers instead of n m.

As in the paper and in DDP's PowerSGD hook: the first `start_powerSGD_iter` steps use plain
allreduce (the early, fast-changing gradients are not compressed); `warm_start` reuses the last
`Q` (one power iteration per step refines it); vectors, and matrices whose factors would not be
`min_compression_rate` times smaller, go uncompressed. Every rank draws the first `Q` of a
gradient from a generator seeded by `random_seed` and the gradient's name, so all ranks agree.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Callable

import torch

from horovod.common.gradients import GradientReducer
from horovod.common.reduce_ops import Average
from horovod.torch._bridge import run

__all__ = ["PowerSGD"]


@dataclass
class _Entry:
    """One gradient submitted in this step, and its reduced value once the step is flushed."""

    name: str
    grad: torch.Tensor
    result: torch.Tensor | None = None


@dataclass
class _Memory:
    """What PowerSGD keeps for one gradient between steps."""

    steps: int = 0
    error: torch.Tensor | None = None
    q: torch.Tensor | None = None


@dataclass
class PowerSGD:
    """Low-rank gradient compression with error feedback; the arguments are DDP's PowerSGDState's."""

    matrix_approximation_rank: int = 1
    start_powerSGD_iter: int = 1_000
    min_compression_rate: float = 2.0
    use_error_feedback: bool = True
    warm_start: bool = True
    orthogonalization_epsilon: float = 0.0
    random_seed: int = 0
    _pending: list[_Entry] = field(default_factory=list, init=False, repr=False)
    _memory: dict[str, _Memory] = field(default_factory=dict, init=False, repr=False)
    _flushes: int = field(default=0, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.matrix_approximation_rank < 1:
            raise ValueError(f"PowerSGD: matrix_approximation_rank must be >= 1, got {self.matrix_approximation_rank}")

    def submit(self, grad: torch.Tensor, name: str, reducer: GradientReducer) -> Callable[[], torch.Tensor]:
        """Queue `grad`; the returned function gives its reduced value (the first call reduces
        every gradient queued until then, in a few grouped allreduces)."""
        if reducer.op != Average:
            raise ValueError(f"PowerSGD compression averages gradients; it cannot reduce {name} with op={reducer.op} "
                             "(use op=hvd.Average)")
        entry = _Entry(name, grad)
        self._pending.append(entry)

        def result() -> torch.Tensor:
            if entry.result is None:
                self._flush(reducer)
            assert entry.result is not None
            return entry.result

        return result

    def error_of(self, name: str) -> torch.Tensor | None:
        """The error feedback kept for the gradient named `name` (what the last approximation
        missed on this rank), or None while it is reduced uncompressed."""
        memory = self._memory.get(name)
        return None if memory is None else memory.error

    # -- one step's reduction ------------------------------------------------------------------------
    def _compressible(self, memory: _Memory, grad: torch.Tensor) -> bool:
        if memory.steps < self.start_powerSGD_iter or grad.dim() < 2:
            return False
        n, m = grad.shape[0], grad.numel() // grad.shape[0]
        r = min(self.matrix_approximation_rank, n, m)
        return n * m >= self.min_compression_rate * (n + m) * r

    def _flush(self, reducer: GradientReducer) -> None:
        entries, self._pending = sorted(self._pending, key=lambda e: e.name), []
        number, self._flushes = self._flushes, self._flushes + 1
        plain, matrices = [], []
        for entry in entries:
            memory = self._memory.setdefault(entry.name, _Memory())
            (matrices if self._compressible(memory, entry.grad) else plain).append((entry, memory))
            memory.steps += 1
        if plain:
            reduced = self._allreduce([e.grad for e, _ in plain], f"PowerSGD.{number}.plain", reducer)
            for (entry, _), value in zip(plain, reduced):
                entry.result = value
        if matrices:
            self._compress([e for e, _ in matrices], [m for _, m in matrices], number, reducer)

    def _compress(self, entries: list[_Entry], memories: list[_Memory], number: int, reducer: GradientReducer) -> None:
        ms, qs = [], []
        for entry, memory in zip(entries, memories):
            m = entry.grad.reshape(entry.grad.shape[0], -1)
            if self.use_error_feedback and memory.error is not None:
                m = m + memory.error
            if memory.q is None or not self.warm_start:
                memory.q = self._initial_q(entry.name, m)
            ms.append(m)
            qs.append(memory.q)
        ps = self._allreduce([m @ q for m, q in zip(ms, qs)], f"PowerSGD.{number}.P", reducer)
        ps = [self._orthogonalized(p) for p in ps]
        qs = self._allreduce([m.t() @ p for m, p in zip(ms, ps)], f"PowerSGD.{number}.Q", reducer)
        for entry, memory, m, p, q in zip(entries, memories, ms, ps, qs):
            approximation = p @ q.t()
            if self.use_error_feedback:
                memory.error = m - approximation
            memory.q = q
            entry.result = approximation.reshape(entry.grad.shape)

    def _initial_q(self, name: str, m: torch.Tensor) -> torch.Tensor:
        generator = torch.Generator().manual_seed(self.random_seed * 1_000_003 + zlib.crc32(name.encode()))
        r = min(self.matrix_approximation_rank, *m.shape)
        return torch.randn(m.shape[1], r, generator=generator, dtype=m.dtype).to(m.device)

    def _orthogonalized(self, p: torch.Tensor) -> torch.Tensor:
        """Gram-Schmidt on the columns (what DDP's hook does; epsilon guards zero columns)."""
        p = p.clone()
        for i in range(p.shape[1]):
            column = p[:, i:i + 1]
            norm = column.norm() + self.orthogonalization_epsilon
            if norm > 0:  # a zero column (an all-zero gradient) stays zero instead of NaN
                column /= norm
            if i + 1 < p.shape[1]:
                rest = p[:, i + 1:]
                rest -= column @ (column.t() @ rest)
        return p

    @staticmethod
    def _allreduce(tensors: list[torch.Tensor], name: str, reducer: GradientReducer) -> list[torch.Tensor]:
        return run("allreduce", [t.contiguous() for t in tensors], grouped=True, name=name, op=Average,
                   prescale_factor=reducer.prescale, postscale_factor=reducer.postscale,
                   process_set=reducer.process_set)
