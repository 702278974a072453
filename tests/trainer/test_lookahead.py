"""NOTE [lookahead] in trainer/lookahead.py: a pipelined exchange that looks ahead follows
the synchronous run exactly when every rank has the same gradient; ``WeightStash`` undoes
a step."""
from __future__ import annotations

import torch
from torch.testing import assert_close

from tests.distributed import run_distributed
from trainer.lookahead import WeightStash

STEPS = 6


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3)).double()


def _loss(model, step):
    g = torch.Generator().manual_seed(step)  # the same batch on every rank
    x, y = torch.randn(8, 5, generator=g, dtype=torch.float64), torch.randn(8, 3, generator=g, dtype=torch.float64)
    return torch.nn.functional.mse_loss(model(x), y)


def _run(topo, mode):
    """Weights after STEPS steps: ``sync``, ``pipelined`` or ``lookahead`` (pipelined, looking ahead)."""
    from comm import GradientExchanger

    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.3, momentum=0.9, weight_decay=1e-3)
    ex = GradientExchanger(model.parameters(), "dense", topo, pipeline=mode != "sync")
    for step in range(STEPS):  # the order of trainer/loop.py's _step
        stash = None
        if mode == "lookahead" and ex.lookahead_grads():
            stash = WeightStash(model.parameters(), opt)
            opt.step()
            opt.zero_grad(set_to_none=True)
        _loss(model, step).backward()
        if stash is not None:
            stash.restore()
        if ex.synchronize():
            opt.step()
        opt.zero_grad(set_to_none=True)
    if ex.flush():
        opt.step()
    ex.remove()
    return [p.detach().clone() for p in model.parameters()]


def _worker(rank, world):
    from comm import Topology

    topo = Topology(nodes=2, local_size=2)
    return {mode: _run(topo, mode) for mode in ("sync", "pipelined", "lookahead")}


def test_lookahead_follows_the_synchronous_run_when_gradients_agree():
    runs = run_distributed(_worker, 4, timeout=240)
    for res in runs:
        for got, want in zip(res["lookahead"], res["sync"]):
            assert_close(got, want, rtol=1e-12, atol=1e-14)
        # without it the one-step delay changes the trajectory (so the check above can fail)
        assert max(float((a - b).abs().max()) for a, b in zip(res["pipelined"], res["sync"])) > 1e-3
    for other in runs[1:]:  # and the weights stay the same on every rank
        for a, b in zip(other["lookahead"], runs[0]["lookahead"]):
            assert_close(a, b, rtol=0, atol=0)


def test_weight_stash_puts_back_weights_and_optimizer_state():
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    _loss(model, 0).backward()
    stash = WeightStash(model.parameters(), opt)  # before the first step: no momentum yet
    opt.step()
    stash.restore()
    assert all(p not in opt.state or not opt.state[p] for p in model.parameters())
    for p, w in zip(model.parameters(), _model().parameters()):
        assert_close(p.detach(), w.detach(), rtol=0, atol=0)
    opt.step()  # a momentum buffer exists from here on
    weights = [p.detach().clone() for p in model.parameters()]
    buffers = [opt.state[p]["momentum_buffer"].clone() for p in model.parameters()]
    stash = WeightStash(model.parameters(), opt)
    opt.step()
    opt.step()
    stash.restore()
    for p, w, b in zip(model.parameters(), weights, buffers):
        assert_close(p.detach(), w, rtol=0, atol=0)
        assert_close(opt.state[p]["momentum_buffer"], b, rtol=0, atol=0)
