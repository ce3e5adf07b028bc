"""The workers of a run: how many, where each runs and how they work together.

:mod:`~minitfm.workers.distributed` (data-parallel workers over MPI: broadcast, all-reduce,
stopping together), :mod:`~minitfm.workers.placement` (each worker's GPU, or its share of the
CPU's cores and its BLAS threads), :mod:`~minitfm.workers.devices` (CUDA devices and the NCCL
communicator) and :mod:`~minitfm.workers.blas` (what OpenBLAS reads when NumPy loads it).
"""
