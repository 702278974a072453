"""OMGS plans on the engine (``build_omgs_exchanger``: topk_ag on an ``OMGSPlan``) in real gloo process groups."""
from __future__ import annotations

import os
import statistics

import pytest
import torch
import torch.distributed as dist

from comm import Topology
from comm.omgs import (BackwardProfile, CostModel, build_omgs_exchanger, fit_alpha_beta, fit_gamma, groups_from_plan,
                       load_profile, measure_backward_times, plan_omgs, save_profile)
from tests.distributed import run_distributed


def _engine(model, plan, density, overlap=True):
    topo = Topology(nodes=1, local_size=dist.get_world_size(), shared_memory=False)
    return build_omgs_exchanger(list(model.parameters()) if isinstance(model, torch.nn.Module) else model, topo,
                                merged=plan, density=density, selector="exact", overlap=overlap, skip_nonfinite=False)


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16),
                               torch.nn.Tanh(), torch.nn.Linear(16, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def _batch(rank: int, step: int):
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(8, 12, generator=g), torch.randn(8, 3, generator=g)


def _loss(model, rank, step):
    x, y = _batch(rank, step)
    return torch.nn.functional.mse_loss(model(x), y)


def _reference_step(model, plan, residuals, density, rank, step, world):
    """Plain reference: all-gather every rank's dense accumulator, top-k each one here."""
    model.zero_grad()
    _loss(model, rank, step).backward()
    params = list(model.parameters())
    result = []
    for gi, (s, e) in enumerate(groups_from_plan(plan)):
        acc = torch.cat([p.grad.reshape(-1) for p in params[s:e]]) + residuals[gi]
        k = max(1, int(torch.tensor(density * acc.numel()).ceil()))
        everyone = [torch.empty_like(acc) for _ in range(world)]
        dist.all_gather(everyone, acc)
        total = torch.zeros_like(acc)
        for other in everyone:
            idx = torch.topk(other.abs(), k).indices
            total[idx] += other[idx]
        idx = torch.topk(acc.abs(), k).indices
        residuals[gi] = acc.clone()
        residuals[gi][idx] = 0
        result.append(total / world)
    return torch.cat(result)


def _exchange_worker(rank, world):
    plan = [False, True, False, False, True, True, False, False]  # 8 tensors, 4 groups
    density = 0.25
    piped, plain, ref = _model(), _model(), _model()
    ex_p = _engine(piped, plan, density)
    ex_n = _engine(plain, plan, density, overlap=False)
    residuals = [torch.zeros(sum(p.numel() for p in list(ref.parameters())[s:e]))
                 for s, e in groups_from_plan(plan)]
    launched_in_backward = []
    for step in range(3):
        for model in (piped, plain):
            model.zero_grad()
            _loss(model, rank, step).backward()
        launched_in_backward.append(ex_p.launched == len(ex_p.buckets) and ex_n.launched == 0)
        ex_p.synchronize()
        ex_n.synchronize()
        gp = torch.cat([p.grad.reshape(-1) for p in piped.parameters()])
        gn = torch.cat([p.grad.reshape(-1) for p in plain.parameters()])
        gr = _reference_step(ref, plan, residuals, density, rank, step, world)
        assert torch.equal(gp, gn), f"step {step}: pipelined != non-pipelined"
        torch.testing.assert_close(gp, gr, rtol=1e-6, atol=1e-7)
        assert (gp != 0).sum() < gp.numel()  # really sparse
    state = ex_p.state_dict()
    saved = [s["memory"]["residual"] for s in reversed(state["exchangers"])]  # buckets run last group first
    for got, want in zip(saved, residuals):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
    fresh = _engine(_model(), plan, density, overlap=False)
    fresh.load_state_dict(state)
    assert all(torch.equal(a.memory.residual, b) for a, b in zip(reversed(fresh.exchangers), saved))
    return launched_in_backward


def test_pipelined_equals_non_pipelined_and_reference():
    for launched in run_distributed(_exchange_worker, 2):
        assert launched == [True, True, True]


def _profile_worker(rank, world, tmp):
    # profiling and cost fits, saved and loaded back
    model = _model()
    prof = measure_backward_times(model, lambda: _loss(model, rank, 0), repeats=2)
    assert sorted(prof.order) == list(range(8)) and prof.d == [model.get_parameter(n).numel() for n in prof.names]
    alpha, beta = fit_alpha_beta([16, 256, 4096])
    gamma = fit_gamma([1000, 20000, 100000], 0.01)
    cost = CostModel(alpha, beta, gamma, 0.01)
    if rank == 0:
        save_profile(tmp + "/prof.json", prof, cost)
    dist.barrier()
    assert load_profile(tmp + "/prof.json")[1].rho == 0.01
    return alpha, beta, gamma, prof.names


def test_profile_and_fits(tmp_path):
    results = run_distributed(_profile_worker, 2, str(tmp_path))
    for alpha, beta, gamma, names in results:
        assert alpha >= 0 and beta >= 0 and gamma > 0
        # backward produces the last Linear's gradients first: forward order starts at layer 0
        assert names[0].startswith("0.") and names[-1].startswith("6.")


def _train_worker(rank, world):
    torch.manual_seed(0)
    model = _model(1)
    teacher = _model(2)
    params = list(model.parameters())
    try:  # per-rank timings give per-rank plans: the engine refuses to mix them
        _engine(params, [False] + [rank == 1] * (len(params) - 1), 0.2)
        raise AssertionError("mismatched plans were accepted")
    except ValueError as exc:
        assert "disagree" in str(exc)
    topo = Topology(nodes=1, local_size=world, shared_memory=False)
    plan, order, cost, prof = plan_omgs(model, lambda: _loss(model, rank, 0), topo, density=0.2, repeats=2)
    assert cost.gamma > 0 and sorted(prof.order) == list(range(len(params))) and order == prof.order
    ex = _engine([params[i] for i in order], plan, 0.2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for step in range(60):
        x = torch.randn(16, 12, generator=torch.Generator().manual_seed(step * world + rank))
        with torch.no_grad():
            y = teacher(x)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        ex.synchronize()
        opt.step()
        losses.append(loss.item())
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    everyone = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(everyone, flat)
    return sum(losses[:5]) / 5, sum(losses[-5:]) / 5, all(torch.equal(flat, o) for o in everyone)


def test_short_training_lowers_the_loss():
    for first, last, in_sync in run_distributed(_train_worker, 2):
        assert in_sync
        assert last < 0.5 * first, (first, last)


def test_robust_line_follows_the_pairs_that_span_the_range():
    # bench omgs' calibration sizes: everything up to 32 KB fits the tbf burst and costs the
    # latency alone (4 ms +- noise), the largest message 28 ms (NOTE [weighted slopes])
    from comm.omgs.profile import robust_line

    xs = [8 * k for k in (1, 4, 16, 64, 256, 1024, 4096, 25557)]
    ts = [5.1e-3, 6.6e-3, 3.9e-3, 4.4e-3, 2.7e-3, 4.6e-3, 3.7e-3, 28.0e-3]
    slopes = [(ts[j] - ts[i]) / (xs[j] - xs[i]) for i in range(8) for j in range(i + 1, 8)]
    assert statistics.median(slopes) < 0  # plain Theil-Sen lands on noise: beta would be 0
    alpha, beta = robust_line(xs, ts)
    assert beta == pytest.approx((28.0e-3 - 4.2e-3) / (xs[-1] - 2000), rel=0.1)
    assert 2.5e-3 < alpha < 5.5e-3
    assert robust_line([1, 2, 3], [3.0, 2.0, 1.0]) == (2.0, 0.0)  # never a negative slope


def test_saved_profile_has_the_usual_permissions_and_no_temporary_left(tmp_path):
    """The profile is replaced atomically and gets the umask's mode, as other written files do."""
    old = os.umask(0o022)
    try:
        save_profile(tmp_path / "prof.json", BackwardProfile(names=["w"], tb=[0.001], d=[3], order=[0]),
                     CostModel(1e-3, 1e-9, 1e-9, 0.01))
    finally:
        os.umask(old)
    assert (tmp_path / "prof.json").stat().st_mode & 0o777 == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["prof.json"]
    assert load_profile(tmp_path / "prof.json")[0].d == [3]
