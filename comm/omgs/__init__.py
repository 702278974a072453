"""OMGS-SGD: layer-wise top-k sparsification pipelined with backward, with merged layers.

Plan which neighbouring layers to merge (:func:`find_merged_layers`, paper's greedy
Algorithm 1 or the exact optimum), predict the iteration time of any plan
(:func:`predict_iteration_time`), and exchange the sparsified groups while backward
still runs (:class:`OMGSExchanger`, or the DDP comm hook :func:`omgs_hook`).
Conventions: NOTE [OMGS conventions] in ``comm/omgs/model.py``.
"""
from comm.omgs.model import (BYTES_PER_SELECTED, CostModel, groups_from_plan, plan_from_groups,
                             predict_iteration_time, selected_count, simulate)
from comm.omgs.planner import (PLANNERS, find_merged_layers, lags_plan, single_bucket_plan,
                               threshold_plan)

__all__ = [
    "BYTES_PER_SELECTED", "CostModel", "groups_from_plan", "plan_from_groups",
    "predict_iteration_time", "selected_count", "simulate",
    "PLANNERS", "find_merged_layers", "lags_plan", "single_bucket_plan", "threshold_plan",
]
