"""OMGS-SGD: layer-wise top-k sparsification pipelined with backward, with merged layers.

Plan which neighbouring layers to merge (:func:`find_merged_layers`: the paper's greedy
Algorithm 1 or the exact optimum), predict the iteration time of any plan
(:func:`predict_iteration_time`), measure the inputs (:mod:`comm.omgs.profile`) and
exchange the sparsified groups while backward still runs (:class:`OMGSExchanger`, or the
DDP comm hook :func:`omgs_hook`). Conventions: NOTE [OMGS conventions] in
``comm/omgs/model.py``.
"""
from comm.omgs.autoplan import build_omgs_exchanger
from comm.omgs.ddp_hook import OMGSHookState, omgs_hook
from comm.omgs.model import (BYTES_PER_SELECTED, CostModel, groups_from_plan, plan_from_groups,
                             predict_iteration_time, selected_count, simulate)
from comm.omgs.pipeline import OMGSExchanger, broadcast_plan
from comm.omgs.planner import (PLANNERS, find_merged_layers, lags_plan, single_bucket_plan,
                               threshold_plan)
from comm.omgs.profile import (BackwardProfile, fit_alpha_beta, fit_gamma, fit_sparsify_cost,
                               gamma_from_timings, load_profile, measure_backward_times, save_profile)

__all__ = [
    "BYTES_PER_SELECTED", "CostModel", "groups_from_plan", "plan_from_groups",
    "predict_iteration_time", "selected_count", "simulate",
    "PLANNERS", "find_merged_layers", "lags_plan", "single_bucket_plan", "threshold_plan",
    "OMGSExchanger", "broadcast_plan", "OMGSHookState", "omgs_hook", "build_omgs_exchanger",
    "BackwardProfile", "measure_backward_times", "fit_gamma", "gamma_from_timings", "fit_sparsify_cost", "fit_alpha_beta",
    "save_profile", "load_profile",
]
