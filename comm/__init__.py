"""Gradient exchange for data-parallel training: one engine (bucket plans, top-k selectors,
error feedback, dense/hierarchical/sparse collectives, overlapped with backward), a DDP
comm hook on the same algorithms and the OMGS planner. Algorithms are registered by name
in :mod:`comm.registry` (NOTE [one registry of names] in comm/algorithm.py).

Depends on torch only; knows nothing about data.

Example:
    >>> import comm                                                       # doctest: +SKIP
    >>> topo = comm.Topology(nodes=2, local_size=2)                       # doctest: +SKIP
    >>> algorithm = comm.names(sparse=True, per_bucket=True)[-1]          # doctest: +SKIP
    >>> ex = comm.build_exchanger(algorithm, topo, density=0.01, selector="exact")  # doctest: +SKIP
    >>> avg = ex.exchange(torch.cat([p.grad.reshape(-1) for p in params]))      # doctest: +SKIP
"""
from comm import builtin  # noqa: F401  (registers the shipped algorithms first)
from comm import cost_model
from comm.algorithm import Algorithm, NoOptions
from comm.collectives import Exchanger, build_exchanger
from comm.ddp_hook import SparseHookState, register_sparse_hook, sparse_hook
from comm.engine import GradientExchanger
from comm.plans import PLANNERS, Bucket, LayerPlan, OMGSPlan, SizePlan
from comm.plans.size import plan_buckets
from comm.registry import ALGORITHMS, get_algorithm, names, register
from comm.residual import ResidualMemory
from comm.timings import ExchangeTimings
from comm.topology import Topology

__all__ = ["ALGORITHMS", "Algorithm", "Bucket", "Exchanger", "ExchangeTimings", "GradientExchanger", "LayerPlan",
           "NoOptions", "OMGSPlan", "PLANNERS", "ResidualMemory", "SizePlan", "SparseHookState", "Topology",
           "build_exchanger", "cost_model", "get_algorithm", "names", "plan_buckets", "register",
           "register_sparse_hook", "sparse_hook"]
