import math

import pytest
import torch
from torch import nn

from trainer.lars import LARS, split_param_groups, trust_ratios


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3, bias=True), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4 * 4 * 4, 3))


def test_split_groups_keep_biases_and_bn_out_of_decay_and_lars():
    m = _model()
    decay, plain = split_param_groups(m, 1e-4)
    assert [p.shape for p in decay["params"]] == [m[0].weight.shape, m[3].weight.shape]
    assert plain["weight_decay"] == 0 and plain["lars"] is False and len(plain["params"]) == 4


def test_lars_two_steps_follow_the_formula():
    m = _model()
    lr, mom, wd, eta = 0.5, 0.9, 1e-3, 0.02
    opt = LARS(split_param_groups(m, wd), lr=lr, momentum=mom, eta=eta)
    lars_ids = {id(m[0].weight), id(m[3].weight)}
    expect = {id(p): p.detach().clone().double() for p in m.parameters()}
    bufs = {id(p): torch.zeros_like(p, dtype=torch.float64) for p in m.parameters()}
    x = torch.randn(5, 3, 6, 6)
    for _ in range(2):
        opt.zero_grad()
        m(x).square().mean().backward()
        for p in m.parameters():
            w, g = expect[id(p)], p.grad.double()
            if id(p) in lars_ids:
                trust = eta * w.norm() / (g.norm() + wd * w.norm() + 1e-9)
                d = (g + wd * w) * trust * lr
            else:
                d = g * lr
            bufs[id(p)] = mom * bufs[id(p)] + d
            expect[id(p)] = w - bufs[id(p)]
        opt.step()
        for p in m.parameters():
            torch.testing.assert_close(p.detach().double(), expect[id(p)], rtol=1e-5, atol=1e-7)
    assert opt.last_trust.shape == (2,) and opt.last_trust.dtype == torch.float32


def test_trust_ratio_is_fp32_from_bf16_and_one_for_zero_norms():
    w = torch.full((1000,), 3.0, dtype=torch.bfloat16)
    g = torch.full((1000,), 1e-3, dtype=torch.bfloat16)
    r = trust_ratios([(w, g, 0.0), (torch.zeros(3), torch.ones(3), 0.0)], eta=0.001, eps=0.0)
    assert r.dtype == torch.float32
    assert math.isclose(r[0].item(), 0.001 * 3.0 / float(g.float()[0]), rel_tol=1e-2)
    assert r[1].item() == 1.0


def test_lars_rejects_bad_hyperparameters():
    with pytest.raises(ValueError, match="momentum"):
        LARS(_model().parameters(), lr=0.1, momentum=1.5)


def test_lars_under_momentum_correction_takes_trust_from_the_applied_update():
    """NOTE [optimiser under momentum correction]: no momentum or decay of its own, and
    ``w -= lr * eta * ||w|| / ((1 - m) * ||U||) * U`` for a LARS layer."""
    from trainer.optim import exchange_momentum

    w = torch.nn.Parameter(torch.tensor([[3.0, 4.0]]))
    opt = LARS([{"params": [w], "weight_decay": 0.5, "lars": True}], lr=0.1, momentum=0.8, eta=0.01, eps=0.0)
    exchange_momentum(opt, True)
    update = torch.tensor([[0.0, 2.0]])
    for _ in range(2):  # no momentum: both steps move by the same amount
        before = w.detach().clone()
        w.grad = update.clone()
        opt.step()
        trust = 0.01 * float(before.norm()) / ((1 - 0.8) * 2.0)
        assert torch.allclose(w.detach(), before - 0.1 * trust * update, rtol=1e-6, atol=0)
    exchange_momentum(opt, False)
    assert opt.param_groups[0]["momentum"] == 0.8 and opt.param_groups[0]["weight_decay"] == 0.5


def test_sgd_momentum_handed_to_the_next_gradient_continues_it_exactly():
    """At a switch into or out of momentum correction ``take_momentum`` clears SGD's
    buffers and returns ``m * buf``; added to the next gradient, the step equals the one
    the buffer would have made (bit for bit: ``m * buf + g`` either way)."""
    from trainer.optim import take_momentum

    def run(hand_over: bool):
        torch.manual_seed(0)
        w = torch.nn.Parameter(torch.randn(5))
        opt = torch.optim.SGD([w], lr=0.1, momentum=0.9)
        w.grad = torch.randn(5)
        opt.step()
        g = torch.randn(5)
        if hand_over:
            carried = take_momentum(opt)
            assert not opt.state[w] and set(carried) == {w}
            g = g + carried[w]
        w.grad = g
        opt.step()
        return w.detach()

    assert torch.equal(run(True), run(False))
