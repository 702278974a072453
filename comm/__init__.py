"""Gradient exchange for data-parallel training: top-k selectors, dense/hierarchical/sparse
collectives, error feedback, tensor fusion, a DDP comm hook and the OMGS planner.

Depends on torch only; knows nothing about data.

Example:
    >>> import comm                                                       # doctest: +SKIP
    >>> topo = comm.Topology(nodes=2, local_size=2)                       # doctest: +SKIP
    >>> ex = comm.build_exchanger("hitopk", topo, density=0.01, selector="exact")  # doctest: +SKIP
    >>> avg = ex.exchange(torch.cat([p.grad.reshape(-1) for p in params]))      # doctest: +SKIP
"""
from comm import cost_model
from comm.collectives import ALGORITHMS, Exchanger, build_exchanger, get_algorithm
from comm.ddp_hook import SparseHookState, register_sparse_hook, sparse_hook
from comm.fusion import GradientExchanger, plan_buckets
from comm.residual import ResidualMemory
from comm.topology import Topology

__all__ = ["ALGORITHMS", "Exchanger", "GradientExchanger", "ResidualMemory", "SparseHookState", "Topology",
           "build_exchanger", "cost_model", "get_algorithm", "plan_buckets", "register_sparse_hook", "sparse_hook"]
