"""shoal.torch: a drop-in for horovod.torch.

    import shoal.torch as hvd
    hvd.init()
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=hvd.Compression.powersgd(rank=2))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)

Same names, signatures, defaults and semantics as Horovod's, over shoal's async
runtime; docs/python.md lists what differs and why (Adasum, process sets).
"""
from .compression import Compression, Compressor
from .mpi_ops import (Adasum, Average, HorovodInternalError, Max, Min, ProcessSet, Product, Sum, add_process_set,
                      allgather, allgather_async, global_process_set, remove_process_set, grouped_allgather,
                      grouped_allgather_async, grouped_reducescatter, grouped_reducescatter_async,
                      sparse_allreduce_async, start_timeline, stop_timeline,
                      allreduce, allreduce_, allreduce_async, allreduce_async_, alltoall, alltoall_async, barrier,
                      broadcast, broadcast_, broadcast_async, broadcast_async_, ccl_built, cross_rank, cross_size,
                      cuda_built, ddl_built, gloo_built, gloo_enabled, grouped_allreduce, grouped_allreduce_,
                      grouped_allreduce_async, grouped_allreduce_async_, init, is_homogeneous, is_initialized, join,
                      local_rank, local_size, mpi_built, mpi_enabled, mpi_threads_supported, nccl_built, poll, rank,
                      reducescatter, reducescatter_async, rocm_built, shutdown, size, synchronize)
from .functions import allgather_object, broadcast_object, broadcast_optimizer_state, broadcast_parameters
from .optimizer import DistributedOptimizer
from .sync_batch_norm import SyncBatchNorm
from shoal import ShoalError
