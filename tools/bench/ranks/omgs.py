"""One rank of ``cachepipe bench omgs`` (NOTE [benchmark ranks]): fit the costs in place,
plan, and time each mode.

NOTE [bench calibration]
alpha and beta come from timing the OMGS all-gather alone; ts0 and gamma, and the
decompression time ``tu = tu0 + tu1 * groups``, come from runs of the three baseline
plans (TopK-SGD, LAGS, fusion: 1, 161 and ~19 groups) with the real engine (topk_ag):
every bucket's measured launch (compression) time is a point of the (ts0, gamma) fit, so the fit
sees the same contention (four workers on a shared machine) as the timed runs. The
planners get ``ts0 + tu1`` as the per-group overhead (decompression is charged to the
group's sparsification). A calibration run gives the coefficients the OMGS plans are made with. Timed
iterations of all modes are then interleaved (mode A, B, C, ..., A, B, C, ...) so that a
change of the machine's load hits every mode alike, and the predictions use gamma and tu
refitted from the baselines' timed iterations and the per-layer times scaled to the
interleaved backward-only time. No OMGS iteration feeds the model: its time is predicted.
"""
from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from comm import Topology
from comm.omgs import (broadcast_plan, build_omgs_exchanger, fit_alpha_beta, find_merged_layers, fit_sparsify_cost,
                       lags_plan, measure_backward_times, predict_iteration_time, single_bucket_plan,
                       threshold_plan)
from tools.bench.harness.ranks import run_rank
from tools.bench.parts.omgs_emulate import SleepChain

__all__ = ["run"]


def _mean(x: float) -> float:
    t = torch.tensor([x], dtype=torch.float64)
    dist.all_reduce(t)
    return float(t) / dist.get_world_size()


def _iteration(model, exchangers: dict, active) -> float:
    for name, ex in exchangers.items():
        ex.enabled = name == active
    model.zero_grad(set_to_none=False)  # keep .grad allocated, as a GPU caching allocator would
    dist.barrier()
    t0 = time.perf_counter()
    model().backward()
    if active is not None:
        exchangers[active].synchronize()
    t = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)  # an iteration ends when the slowest rank ends
    return float(t)


def _line(xs, ys) -> tuple[float, float]:
    """Least-squares ``y = a + b x`` (a, b >= 0): decompression time vs number of groups."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = max(sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx, 0.0) if sxx else 0.0
    return max(my - b * mx, 0.0), b


def _reset(ex) -> None:
    ex.stats = dict.fromkeys(ex.stats, 0.0)
    ex.bucket_compress_s = [0.0] * len(ex.buckets)


def _sizes(ex) -> list[int]:
    return [sum(ex.params[i].numel() for i in b.params) for b in ex.buckets]


def run(spec: dict) -> dict:
    """The benchmark body on one rank; returns the result (meaningful on rank 0)."""
    rho, d, iters = spec["density"], spec["d"], spec["iters"]
    model = SleepChain(d, spec["tb"], seed=dist.get_rank())
    params = list(model.parameters())
    model().backward()  # allocate .grad once (NOTE [emulated backward])
    prof = measure_backward_times(model, model, repeats=spec["profile_repeats"], set_to_none=False)
    if prof.order != list(range(len(d))):
        raise RuntimeError("emulated backward did not run in reverse layer order")
    tb = [_mean(t) for t in prof.tb]  # effective per-layer backward of the emulated model
    alpha, beta = fit_alpha_beta(sorted({1, 4, 16, 64, 256, 1024, 4096, max(2, int(rho * sum(d)))}),
                                 repeats=spec["fit_repeats"])
    topo = Topology(nodes=1, local_size=dist.get_world_size(), shared_memory=False)

    plan_of = {}  # exchanger -> its merged-layer plan

    def make(plan):  # the engine on the plan's merged layers, as the trainer's --comm omgs
        plan = broadcast_plan(plan)
        ex = build_omgs_exchanger(params, topo, merged=plan, density=rho, selector=spec["selector"],
                                  skip_nonfinite=False)
        plan_of[ex] = plan
        return ex

    exchangers = {"topk-sgd (1 bucket)": make(single_bucket_plan(len(d))),
                  "lags (per layer)": make(lags_plan(len(d))),
                  f"fusion {spec['fusion_mb']:g} MiB": make(threshold_plan(d, int(spec["fusion_mb"] * 2**20)))}
    sizes, times, decompress = [], [], []  # NOTE [bench calibration]
    for name, ex in exchangers.items():
        for _ in range(spec["warmup"]):
            _iteration(model, exchangers, name)
        _reset(ex)
        for _ in range(spec["fit_repeats"]):
            _iteration(model, exchangers, name)
        sizes += _sizes(ex)
        times += [t / spec["fit_repeats"] for t in ex.bucket_compress_s]
        decompress.append((ex.stats["sync_s"] - ex.stats["wait_s"]) / spec["fit_repeats"])
    ts0, gamma = (_mean(v) for v in fit_sparsify_cost(sizes, times, rho))
    tu0, tu1 = (_mean(v) for v in _line([len(ex.buckets) for ex in exchangers.values()], decompress))
    coeffs = dict(alpha=alpha, beta=beta, gamma=gamma, rho=rho)
    for method in ("paper", "optimal"):  # decompression's per-group cost is charged to ts0
        exchangers[f"omgs {method}"] = make(find_merged_layers(tb, d, **coeffs, method=method, ts0=ts0 + tu1))
    modes = [None, *exchangers]
    for name in exchangers:
        for _ in range(spec["warmup"]):
            _iteration(model, exchangers, name)
        _reset(exchangers[name])
    measured = {m: [] for m in modes}
    for _ in range(iters):
        for m in modes:
            measured[m].append(_iteration(model, exchangers, m))
    baselines = [ex for name, ex in exchangers.items() if not name.startswith("omgs")]
    ts0_t, gamma_t = (_mean(v) for v in fit_sparsify_cost([n for ex in baselines for n in _sizes(ex)],
                                                          [t / iters for ex in baselines for t in ex.bucket_compress_s],
                                                          rho))
    tu0_t, tu1_t = (_mean(v) for v in _line([len(ex.buckets) for ex in baselines],
                                            [(ex.stats["sync_s"] - ex.stats["wait_s"]) / iters for ex in baselines]))
    scale = statistics.median(measured[None]) / sum(tb)
    tb_t = [t * scale for t in tb]
    planned_with = dict(coeffs, ts0=ts0, tu0=tu0, tu1=tu1)
    coeffs_p = dict(coeffs, ts0=ts0)
    coeffs = dict(coeffs, gamma=gamma_t)
    rows = [dict(mode="backward only", groups=0, measured_ms=1e3 * statistics.median(measured[None]),
                 min_ms=1e3 * min(measured[None]), max_ms=1e3 * max(measured[None]), predicted_ms=1e3 * sum(tb_t))]
    for name, ex in exchangers.items():
        rows.append(dict(mode=name, groups=len(ex.buckets), measured_ms=1e3 * statistics.median(measured[name]),
                         min_ms=1e3 * min(measured[name]), max_ms=1e3 * max(measured[name]),
                         predicted_ms=1e3 * predict_iteration_time(tb_t, d, plan_of[ex], **coeffs, ts0=ts0_t,
                                                                   tu=tu0_t + tu1_t * len(ex.buckets)),
                         planned_pred_ms=1e3 * predict_iteration_time(tb, d, plan_of[ex], **coeffs_p,
                                                                      tu=tu0 + tu1 * len(ex.buckets)),
                         **{k[:-2] + "_ms": 1e3 * _mean(v) / iters for k, v in ex.stats.items() if k != "select_s"}))
    plans = {name: plan_of[ex] for name, ex in exchangers.items()}
    return {"rows": rows, "coeffs": dict(coeffs, ts0=ts0_t), "tu0": tu0_t, "tu1": tu1_t, "tb_effective": tb_t,
            "plans": plans, "planned_with": planned_with}


if __name__ == "__main__":
    raise SystemExit(run_rank(run))
