"""OMGS-SGD's merged-layer planner: which neighbouring layers to exchange together.

Plan which layers to merge (:func:`find_merged_layers`: the paper's greedy Algorithm 1 or
the exact optimum), predict the iteration time of any plan
(:func:`predict_iteration_time`), measure the inputs (:mod:`comm.omgs.profile`) and do it
all in one call (:func:`plan_omgs`). The plan runs on the engine:
:func:`build_omgs_exchanger` (``comm/omgs/exchange.py``, also the ``omgs`` algorithm of
:mod:`comm.registry`) exchanges each merged group as soon as backward has produced it.
Conventions: NOTE [OMGS conventions] in ``comm/omgs/model.py``.
"""
from comm.omgs.autoplan import broadcast_plan, plan_omgs
from comm.omgs.exchange import OMGSOptions, build_omgs_exchanger
from comm.omgs.model import (BYTES_PER_SELECTED, CostModel, groups_from_plan, plan_from_groups,
                             predict_iteration_time, simulate)
from comm.omgs.planner import (PLANNERS, find_merged_layers, lags_plan, single_bucket_plan,
                               threshold_plan)
from comm.omgs.profile import (BackwardProfile, fit_alpha_beta, fit_gamma, fit_sparsify_cost,
                               gamma_from_timings, load_profile, measure_backward_times, save_profile)

__all__ = [
    "BYTES_PER_SELECTED", "CostModel", "groups_from_plan", "plan_from_groups",
    "predict_iteration_time", "simulate",
    "PLANNERS", "find_merged_layers", "lags_plan", "single_bucket_plan", "threshold_plan",
    "broadcast_plan", "plan_omgs", "OMGSOptions", "build_omgs_exchanger",
    "BackwardProfile", "measure_backward_times", "fit_gamma", "gamma_from_timings", "fit_sparsify_cost", "fit_alpha_beta",
    "save_profile", "load_profile",
]
