import functools

import pytest
import torch
from torch import nn

from comm.pto import parallel_scalars, shard_bounds
from tests.distributed import run_distributed
from trainer.lars import LARS, split_param_groups


def test_shard_bounds_cover_every_item_once_in_order():
    for n, world in [(161, 128), (5, 4), (3, 4), (0, 2), (10, 1)]:
        spans = [shard_bounds(n, world, r) for r in range(world)]
        assert spans[0][0] == 0 and spans[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
        assert max(b - a for a, b in spans) - min(b - a for a, b in spans) <= 1
    assert shard_bounds(161, 128, 0) == (0, 2) and shard_bounds(161, 128, 1) == (2, 4)
    with pytest.raises(ValueError):
        shard_bounds(3, 2, 2)


def _model():
    torch.manual_seed(1)
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3), nn.BatchNorm2d(8),
                         nn.Flatten(), nn.Linear(8 * 2 * 2, 5), nn.Linear(5, 3))


def _pto_vs_plain(rank, world):
    calls = []

    def counted(op, items):
        calls.append(len(items))
        return op(items)

    plain, pto = _model(), _model()
    opt_plain = LARS(split_param_groups(plain, 1e-4), lr=0.3, eta=0.01)
    opt_pto = LARS(split_param_groups(pto, 1e-4), lr=0.3, eta=0.01,
                   ratio_fn=lambda op, items: parallel_scalars(lambda xs: counted(op, xs), items))
    x = torch.randn(6, 3, 6, 6, generator=torch.Generator().manual_seed(7))  # same batch on every rank
    for _ in range(3):
        for m, o in ((plain, opt_plain), (pto, opt_pto)):
            o.zero_grad()
            m(x).square().mean().backward()
            o.step()
        torch.testing.assert_close(opt_pto.last_trust, opt_plain.last_trust, rtol=0, atol=0)
    for a, b in zip(plain.parameters(), pto.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    values = parallel_scalars(lambda ts: torch.stack([t.sum() for t in ts]) if ts else torch.zeros(0),
                              [torch.full((2,), float(i)) for i in range(7)])
    return calls, values.tolist()


def test_pto_lars_equals_plain_lars_across_four_ranks():
    results = run_distributed(_pto_vs_plain, 4)
    # 4 LARS layers over 4 ranks: each rank computed exactly one trust ratio per step.
    assert [calls for calls, _ in results] == [[1, 1, 1]] * 4
    assert all(values == [2.0 * i for i in range(7)] for _, values in results)


def test_parallel_scalars_without_process_group_is_local():
    out = parallel_scalars(lambda ts: torch.stack([t.norm() for t in ts]), [torch.ones(4), torch.ones(9)])
    assert out.tolist() == [2.0, 3.0]
    with pytest.raises(ValueError, match="scalars"):
        parallel_scalars(lambda ts: torch.zeros(1), [torch.ones(1), torch.ones(1)])
