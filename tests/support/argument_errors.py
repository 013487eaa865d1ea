"""The table of every frontend's bad-argument errors, against Horovod's types (used on 2 real ranks
by tests/core/test_argument_errors.py and, in MXNet's environment, tests/mxnet).

One table: each row is a call with bad arguments, the frontends it applies to, the exception
class Horovod raises there (`ValueError` for what one rank can check before sending,
`HorovodInternalError` - a `RuntimeError` - for what the core finds across ranks) and the words
its message must hold (which op and tensor, what was wrong, what to do). Both ranks make the
same call, so every rank involved must raise. The snippets are generated from the table: one
job runs numpy, torch, TensorFlow, Keras and JAX together (one runtime, one set of ranks);
MXNet runs in its own environment.
"""

from __future__ import annotations

from dataclasses import dataclass

MAIN = ("numpy", "torch", "tensorflow", "keras", "jax")
ALL = MAIN + ("mxnet",)

# How each frontend is imported and how `T(values, dtype)` builds one of its tensors.
PREAMBLES = {
    "numpy": "import numpy as np\nimport horovod.numpy as hvd\nT = lambda v, d='float32': np.asarray(v, d)",
    "torch": "import torch\nimport horovod.torch as hvd\nT = lambda v, d='float32': torch.tensor(v, dtype=getattr(torch, d))\n"
             "model = torch.nn.Linear(2, 1)",
    "tensorflow": "import tensorflow as tf\nimport horovod.tensorflow as hvd\nT = lambda v, d='float32': tf.constant(v, d)",
    "keras": "import numpy as np, keras\nimport horovod.tensorflow.keras as hvd\nT = lambda v, d='float32': np.asarray(v, d)",
    "jax": "import jax.numpy as jnp, optax\nimport horovod.jax as hvd\nT = lambda v, d='float32': jnp.asarray(v, d)",
    "mxnet": "import mxnet as mx\nimport horovod.mxnet as hvd\nT = lambda v, d='float32': mx.nd.array(v, dtype=d)",
}
INTERNAL = "HorovodInternalError"


@dataclass(frozen=True)
class Row:
    label: str
    call: str  # an expression; `hvd`, `T`, `r` (this rank) and `fw` (the frontend's name) are defined
    frontends: tuple[str, ...]
    error: str  # Horovod's exception class (a name in the raised type's MRO)
    words: tuple[str, ...]  # what the message must name (case-insensitive; {fw} is the frontend)


BEFORE_INIT = Row("before_init", "hvd.size()", ALL, "ValueError", ("not been initialized", "hvd.init()"))
TABLE = [
    Row("average_and_op", "hvd.allreduce(T([1.0, 2.0]), average=True, op=hvd.Sum)", ALL[1:], "ValueError",
        ("average", "op")),
    Row("unsupported_dtype", "hvd.allreduce(T([1.0, 2.0], 'complex64'), name=f'{fw}.c')", MAIN, "ValueError",
        ("allreduce", "complex64", "not supported")),
    Row("root_rank_out_of_range", "hvd.broadcast(T([1.0]), root_rank=5, name=f'{fw}.b')", ALL, "ValueError",
        ("broadcast", "root_rank", "5")),
    Row("splits_length", "hvd.alltoall(T([1.0, 2.0]), splits=[1, 0, 1], name=f'{fw}.s')",
        ("numpy", "torch", "tensorflow", "jax", "mxnet"), "ValueError", ("alltoall", "splits", "3")),
    Row("uneven_without_splits", "hvd.alltoall(T([1.0, 2.0, 3.0]), name=f'{fw}.u')",
        ("numpy", "torch", "tensorflow", "jax", "mxnet"), "ValueError", ("alltoall", "divide evenly")),
    Row("reducescatter_max", "hvd.reducescatter(T([1.0, 2.0]), op=hvd.Max, name=f'{fw}.m')", ALL, "ValueError",
        ("reducescatter", "average", "sum")),
    Row("reducescatter_adasum", "hvd.reducescatter(T([1.0, 2.0]), op=hvd.Adasum, name=f'{fw}.a')", ALL, INTERNAL,
        ("reducescatter", "adasum")),
    Row("unregistered_process_set", "hvd.allreduce(T([1.0]), process_set=hvd.ProcessSet([0]))",
        ("numpy", "torch", "tensorflow", "jax", "mxnet"), "ValueError", ("ProcessSet", "not registered", "add_process_set")),
    Row("dynamic_sets_off", "hvd.add_process_set([0])", ALL, "ValueError", ("HOROVOD_DYNAMIC_PROCESS_SETS",)),
    Row("shape_mismatch", "hvd.allreduce(T([1.0] * (2 + r)), name=f'{fw}.shape')", ALL, INTERNAL,
        ("allreduce.{fw}.shape", "shapes", "rank 0: [2]", "rank 1: [3]")),
    Row("dtype_mismatch", "hvd.allreduce(T([1, 2], 'float32' if r == 0 else 'int32'), name=f'{fw}.dtype')",
        ALL, INTERNAL, ("allreduce.{fw}.dtype", "data types", "float32", "int32")),
    Row("root_mismatch", "hvd.broadcast(T([1.0]), root_rank=r, name=f'{fw}.root')", ALL, INTERNAL,
        ("broadcast.{fw}.root", "root ranks")),
    Row("duplicate_name", "twice(lambda name: hvd.allreduce_async(T([1.0]), name=name), f'{fw}.dup')",
        ("numpy", "torch", "jax"),
        "ValueError", ("allreduce.{fw}.dup", "already in flight")),
    Row("optimizer_passes", "hvd.DistributedOptimizer(optimizer(), backward_passes_per_step=0)",
        ("torch", "tensorflow", "keras", "jax"), "ValueError", ("backward_passes_per_step", "0")),
    Row("optimizer_predivide_with_sum", "hvd.DistributedOptimizer(optimizer(), op=hvd.Sum, gradient_predivide_factor=2.0)",
        ("torch", "tensorflow", "keras", "jax"), "ValueError", ("gradient_predivide_factor", "average")),
    Row("optimizer_duplicate_names", "hvd.DistributedOptimizer(optimizer(), named_parameters=[('w', p) for p in "
        "model.parameters()])", ("torch",), "ValueError", ("named_parameters", "w")),
    Row("optimizer_parameters_not_named", "hvd.DistributedOptimizer(optimizer(), named_parameters=list("
        "model.parameters()))", ("torch",), "ValueError", ("named_parameters", "tuple")),
    Row("optimizer_parameters_missing", "hvd.DistributedOptimizer(optimizer(), named_parameters=[('w', "
        "model.weight)])", ("torch",), "ValueError", ("named_parameters", "were not named")),
]
OPTIMIZERS = {"torch": "torch.optim.SGD(model.parameters(), lr=0.1)", "tensorflow": "keras.optimizers.SGD(0.1)",
              "keras": "keras.optimizers.SGD(0.1)", "jax": "optax.sgd(0.1)"}

_HARNESS = '''
results = {}
def case(fw, label, fn):
    try:
        fn()
        results[f"{fw}:{label}"] = None
    except Exception as exc:
        results[f"{fw}:{label}"] = [[c.__name__ for c in type(exc).__mro__], str(exc)]
def twice(start, base):
    # Rank r's first op (named base.r) cannot complete before the other rank submits that name, which
    # it does only after both ranks made their second submission (the blocking op between): so the
    # second always finds the first in flight, however late a loaded machine runs this rank.
    first = start(f"{base}.{r}")
    try:
        start(f"{base}.{r}")
    finally:
        hvd.allreduce(T([1.0]), name=f"{base}.both_tried")
        other = start(f"{base}.{1 - r}")
        hvd.synchronize(first)
        hvd.synchronize(other)
'''


def snippet(frontends: tuple[str, ...]) -> str:
    """Every frontend's before-init row, init, then each row it applies to; the job stays usable."""
    lines = [_HARNESS, "import keras" if "tensorflow" in frontends else ""]
    for fw in frontends:
        lines += [PREAMBLES[fw], f"fw = {fw!r}", f"case(fw, {BEFORE_INIT.label!r}, lambda: {BEFORE_INIT.call})"]
    lines += ["hvd.init()", "r = hvd.rank()"]
    for fw in frontends:
        lines += [PREAMBLES[fw], f"fw = {fw!r}"]
        if fw in OPTIMIZERS:
            lines.append(f"optimizer = lambda: {OPTIMIZERS[fw]}")
        lines += [f"case(fw, {row.label!r}, lambda: {row.call})" for row in TABLE if fw in row.frontends]
        lines.append(f"case(fw, 'usable', lambda: hvd.allreduce(T([1.0]), name=f'{{fw}}.after'))")
    lines.append("report(results=results)")
    return "\n".join(lines)


def check(results: dict, frontends: tuple[str, ...]) -> list[str]:
    """What differs from the table, as readable lines (empty: every row as Horovod)."""
    problems = []
    for fw in frontends:
        if results.get(f"{fw}:usable") is not None:
            problems.append(f"{fw}: the job is not usable after the errors: {results[f'{fw}:usable']}")
        for row in [BEFORE_INIT] + TABLE:
            if fw not in row.frontends:
                continue
            got = results.get(f"{fw}:{row.label}")
            if got is None:
                problems.append(f"{fw}:{row.label}: no error")
                continue
            mro, message = got
            if row.error not in mro:
                problems.append(f"{fw}:{row.label}: {mro[0]} is not a {row.error}: {message}")
            missing = [w for w in (w.format(fw=fw) for w in row.words) if w.lower() not in message.lower()]
            if missing:
                problems.append(f"{fw}:{row.label}: the message lacks {missing}: {message}")
    return problems
