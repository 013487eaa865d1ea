"""Collective benchmarks: khorovod side by side with torch.distributed (gloo), MPI and Horovod.

    python -m horovod.benchmarks allreduce                      # khorovod alone, 2 ranks
    python -m horovod.benchmarks all --compare                  # every collective, every peer installed
    python -m horovod.benchmarks latency --compare              # 4-byte and 4 KiB allreduce round trips
    python -m horovod.benchmarks allreduce --np 4 --sizes 64M --compare --repeat 5
    python -m horovod.benchmarks allreduce --compare --horovod-python /path/to/venv/bin/python
    python -m horovod.benchmarks allreduce latency --systems khorovod:mpi,mpi,khorovod:shm
    python -m horovod.benchmarks allreduce --sizes 16M --compare --huge-pages on   # no huge pages: default
    python -m horovod.benchmarks allreduce --quick              # a check that it all works (CI)

Each system runs as its own job on the same ranks (khorovod under our horovodrun, gloo as plain
processes, MPI under mpirun, reference Horovod under its own horovodrun), in turns when
`--repeat` asks for several rounds, so whatever else the machine does hits all of them alike.
Bandwidth follows the nccl-tests definitions; results go to a table, a JSON file and a plot.
"""
