"""Residuals that follow the learning rate (NOTE [residuals follow the learning rate] in
comm/collectives/base.py): rescaled by ``lr_prev / lr`` before each step, error feedback
applies every gradient at its own rate, as EF-SGD does, in real gloo groups."""
from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from tests.comm._workers import make_input, portable, restore
from tests.distributed import run_distributed

NODES, LOCAL, D, STEPS = 2, 2, 64, 6
RATES = [0.5 * 0.7 ** t for t in range(STEPS)]  # a decaying rate: every step differs


def _rank(rank, world, algorithm):
    from comm import GradientExchanger, SizePlan, Topology

    topo = Topology(nodes=NODES, local_size=LOCAL)
    out = {}
    for rescale in (True, False):
        p = torch.nn.Parameter(torch.zeros(D, dtype=torch.float64))
        ex = GradientExchanger([p], algorithm, topo, density=0.05, selector="exact", overlap=False,
                               plan=SizePlan(hybrid_threshold_bytes=0), skip_nonfinite=False)
        applied = torch.zeros(D, dtype=torch.float64)
        for step, lr in enumerate(RATES):
            if rescale and step:
                ex.rescale_residuals(RATES[step - 1] / lr)
            p.grad = make_input(rank, step, D)
            ex.synchronize()
            applied += lr * p.grad  # what w -= lr * grad moves
        out[rescale] = {"applied": applied, "residual": ex.exchangers[0].placed_residual(D)}
    return portable(out)


@pytest.mark.parametrize("algorithm", ["topk_ag", "hitopk", "gtopk"])
def test_each_gradient_is_applied_at_its_own_rate(algorithm):
    """EF-SGD's conservation in rate units: ``sum_t lr_t * mean_r g_{r,t} == sum_t lr_t *
    out_t + lr_T * mean_r residual_r`` with the rescale; without it the same identity
    fails (the delayed gradients land at a later, smaller rate)."""
    world = NODES * LOCAL
    fed = sum(lr * make_input(r, t, D) for t, lr in enumerate(RATES) for r in range(world)) / world
    ranks = [restore(r) for r in run_distributed(_rank, world, algorithm)]
    for rescale in (True, False):
        runs = [r[rescale] for r in ranks]
        assert all(torch.equal(runs[0]["applied"], r["applied"]) for r in runs)  # one average
        owed = RATES[-1] * sum(r["residual"] for r in runs) / world
        if rescale:
            assert_close(runs[0]["applied"] + owed, fed, rtol=0, atol=1e-12)
        else:
            assert float((runs[0]["applied"] + owed - fed).abs().max()) > 1e-3


def test_a_rescale_while_the_residual_is_in_flight_applies_when_it_is_stored():
    from comm.residual import ResidualMemory

    mem = ResidualMemory(momentum=0.5, masking=False)
    mem.update(mem.compensate(torch.ones(4)))
    mem.rescale(2.0)  # at rest: at once, the momentum unchanged
    assert torch.equal(mem.residual, torch.full((4,), 2.0)) and torch.equal(mem.momentum, torch.ones(4))
    acc = mem.compensate(torch.ones(4))  # handed out: u = 1.5, acc = 2 + 1.5
    mem.rescale(0.5)
    assert mem.residual is None
    mem.update(acc)
    assert torch.equal(mem.residual, torch.full((4,), 1.75))
    mem.rescale(2.0)
    assert torch.equal(mem.residual, torch.full((4,), 3.5))  # a pending factor is used once


def test_bad_factor_is_refused():
    from comm.collectives.base import rescale_residuals

    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="rescale factor"):
            rescale_residuals([], bad)
