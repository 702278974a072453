"""torch's PowerSGD hook as ``comm.powersgd``: real 2-process gloo groups under DDP."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.distributed import run_distributed

STEPS = 25


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def _batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * rank + step)
    x = torch.randn(32, 16, generator=g)
    teacher = torch.Generator().manual_seed(7)
    w = torch.randn(16, 4, generator=teacher)
    return x, x @ w


def _train(rank, world, approx_rank, ckpt_path):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from comm.powersgd import register_powersgd_hook
    from trainer.serialize import load_state, save_state

    model = _model()
    ddp = DistributedDataParallel(model)
    state = register_powersgd_hook(ddp, rank=approx_rank)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses, grad_ranks, first_grads = [], [], None
    for step in range(STEPS):
        x, y = _batch(rank, step)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        if step == 0:  # plain all-reduce before start_iter: compare with the exact mean
            first_grads = [p.grad.clone() for p in model.parameters()]
            ref = _model()
            torch.nn.functional.mse_loss(ref(x), y).backward()
            exact = [p.grad.clone() for p in ref.parameters()]
            for t in exact:
                dist.all_reduce(t)
                t /= world
            first_grads = (first_grads, exact)
        grad_ranks.append(int(torch.linalg.matrix_rank(model[0].weight.grad)))
        losses.append(loss.item())
        opt.step()
        opt.zero_grad(set_to_none=True)
    save_state(f"{ckpt_path}.rank{rank}.npz", state.state_dict())
    restored = register_powersgd_hook(DistributedDataParallel(_model()), rank=approx_rank)
    restored.load_state_dict(load_state(f"{ckpt_path}.rank{rank}.npz"))
    params = [p.detach().numpy() for p in model.parameters()]
    # numpy, not tensors, through the result queue (tensors travel as shared memory
    # that vanishes with the worker)
    return _numpy((losses, grad_ranks, first_grads, params, state.state_dict(), restored.state_dict()))


def _numpy(obj):
    if isinstance(obj, torch.Tensor):
        return obj.detach().numpy().copy()
    if isinstance(obj, dict):
        return {k: _numpy(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_numpy(v) for v in obj)
    return obj


@pytest.mark.parametrize("approx_rank", [2, 4])
def test_powersgd_hook_compresses_to_its_rank_and_converges(approx_rank, tmp_path):
    results = run_distributed(_train, 2, approx_rank, str(tmp_path / "state"), timeout=120)
    (losses, ranks, (first, exact), params, saved, restored) = results[0]
    # step 0 is plain all-reduce: the exact mean of both ranks' gradients
    for got, want in zip(first, exact):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # from iteration 2 on the 32x16 weight's gradient is a rank-r product P Q^T
    assert ranks[0] > approx_rank and max(ranks[2:]) <= approx_rank, ranks
    assert sum(losses[-5:]) < 0.3 * sum(losses[:5]), losses
    # replicas stay identical (same shapes, same values) on both ranks
    for a, b in zip(params, results[1][3]):
        assert a.shape == b.shape
        np.testing.assert_array_equal(a, b)
    # the checkpointed state (residuals, warm-start factors, iteration, RNG) round-trips
    assert restored["iter"] == saved["iter"] == STEPS and saved["error"]
    for key in ("error", "p", "q"):
        assert saved[key].keys() == restored[key].keys()
        for i in saved[key]:
            np.testing.assert_array_equal(saved[key][i], restored[key][i])
    assert (saved["rng"][1] == restored["rng"][1]).all() and saved["rng"][2:] == restored["rng"][2:]


def test_bad_powersgd_arguments_are_refused():
    from comm.powersgd import register_powersgd_hook

    with pytest.raises(ValueError, match="rank must be >= 1"):
        register_powersgd_hook(None, rank=0)
    with pytest.raises(ValueError, match="start_iter must be >= 2"):
        register_powersgd_hook(None, start_iter=1)


def test_a_residual_crossing_a_powersgd_phase_switch_is_dropped_with_a_warning():
    from types import SimpleNamespace

    from comm.powersgd import PowerSGDHookState

    state = PowerSGDHookState(SimpleNamespace(error_dict={0: torch.full((4,), 2.0)}))
    with pytest.warns(UserWarning, match=r"out of powersgd: .* norm 4 is dropped"):
        assert state.take_residuals() == {}
    with pytest.warns(UserWarning, match=r"into powersgd: .* norm 3 is dropped"):
        state.carry_in({"w": torch.tensor([3.0, 0.0])})
