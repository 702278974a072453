"""Gradient exchange for data-parallel training: one engine (bucket plans, top-k selectors,
error feedback, dense/hierarchical/sparse collectives, overlapped with backward), a DDP
comm hook on the same algorithms and the OMGS planner.

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
from comm.engine import GradientExchanger
from comm.plans import PLANNERS, Bucket
from comm.plans.size import plan_buckets
from comm.residual import ResidualMemory
from comm.topology import Topology

__all__ = ["ALGORITHMS", "Bucket", "Exchanger", "GradientExchanger", "PLANNERS", "ResidualMemory", "SparseHookState",
           "Topology", "build_exchanger", "cost_model", "get_algorithm", "plan_buckets", "register_sparse_hook", "sparse_hook"]
