"""The two versions of this package, in one place (read by pyproject and `horovodrun --version`).

`__version__` is the Horovod API level we implement: training scripts gate on Horovod's version
(`hvd.__version__ >= "0.21"`), so they must see Horovod's numbering. `__khorovod_version__` is
this implementation's own release, the one the `khorovod` distribution carries.
"""

__version__ = "0.28.1"
__khorovod_version__ = "0.1.0"
