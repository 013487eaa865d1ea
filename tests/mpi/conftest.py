import pytest

pytest.importorskip("mpi4py", reason="the MPI tests need mpi4py and an MPI library (pip install 'khorovod[mpi]')")
