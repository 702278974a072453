"""DGC momentum correction, momentum-factor masking and local clipping in the engine, in
real gloo groups (NOTE [momentum correction] in comm/residual.py, NOTE [local update] in
comm/local_update.py): density 1 equals dense momentum SGD bit for bit, masking clears exactly
the sent entries, conservation holds in update units, clipping happens before accumulation."""
from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from tests.comm._workers import make_input, portable, restore
from tests.distributed import run_distributed

NODES, LOCAL, M = 2, 2, 0.5
SPARSE = ("topk_ag", "hitopk", "gtopk")


def _params(seed: int = 0) -> list[torch.nn.Parameter]:
    """Parameters whose values are multiples of 1/8: with momentum 0.5 and gradients that
    are multiples of 1/16, every sum below is exact in fp32, so summation order cannot
    matter and "equal in exact arithmetic" must mean bit-identical."""
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randint(-8, 8, shape, generator=g).float() / 8) for shape in ((4, 5), (5,), (3, 4))]


def _dyadic_grads(rank: int, step: int, params) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * rank + step)
    return [torch.randint(-16, 16, p.shape, generator=g).float() / 16 for p in params]


def _density_one_worker(rank, world, algorithms):
    """Momentum correction at density 1 (no masking) + the optimiser without momentum vs
    torch's momentum SGD on the plainly averaged gradients."""
    from comm import GradientExchanger, SizePlan, Topology
    from trainer.optim import exchange_momentum

    nodes, local = (NODES, LOCAL) if world == NODES * LOCAL else (1, 1)
    topo = Topology(nodes=nodes, local_size=local)
    out = {}
    for alg in algorithms:
        params, ref = _params(), _params()
        opt = torch.optim.SGD([{"params": params[:1], "weight_decay": 0.25}, {"params": params[1:], "weight_decay": 0.0}],
                              lr=0.25, momentum=M)
        exchange_momentum(opt, True)
        ref_opt = torch.optim.SGD([{"params": ref[:1], "weight_decay": 0.25}, {"params": ref[1:], "weight_decay": 0.0}],
                                  lr=0.25, momentum=M)
        ex = GradientExchanger(params, alg, topo, density=1.0, selector="exact", overlap=False, momentum=M,
                               masking=False, weight_decay={params[0]: 0.25}, skip_nonfinite=False,
                               plan=SizePlan(hybrid_threshold_bytes=0))
        for step in range(4):
            for p, g in zip(params, _dyadic_grads(rank, step, params)):
                p.grad = g
            ex.synchronize()
            opt.step()
            every = [_dyadic_grads(r, step, ref) for r in range(world)]
            for i, p in enumerate(ref):
                p.grad = sum(g[i] for g in every) / world
            ref_opt.step()
        out[alg] = [torch.equal(a, b) for a, b in zip(params, ref)]
    return out


@pytest.mark.parametrize("world", [1, NODES * LOCAL])
def test_momentum_correction_at_density_one_is_dense_momentum_sgd_bit_for_bit(world):
    algorithms = ("topk_ag", "hitopk") if world == 1 else SPARSE + ("2dtar",)  # 2dtar: a dense bucket
    results = run_distributed(_density_one_worker, world, algorithms)
    for rank in results:
        assert rank == {alg: [True, True, True] for alg in algorithms}


def _model_worker(rank, world):
    """World size 1 with a real model and backward (fp32, not dyadic): the engine with
    momentum correction vs torch's momentum SGD with weight decay."""
    from comm import GradientExchanger, SizePlan, Topology
    from trainer.lars import split_param_groups
    from trainer.optim import decay_of, exchange_momentum

    def model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))

    a, b = model(), model()
    opt = torch.optim.SGD(split_param_groups(a, 1e-2), lr=0.1, momentum=0.9)
    ref = torch.optim.SGD(split_param_groups(b, 1e-2), lr=0.1, momentum=0.9)
    exchange_momentum(opt, True)
    ex = GradientExchanger(a.parameters(), "hitopk", Topology(nodes=1, local_size=1), density=1.0, selector="exact",
                           momentum=0.9, masking=False, weight_decay=decay_of(opt), skip_nonfinite=False,
                           plan=SizePlan(hybrid_threshold_bytes=0))
    for step in range(5):
        g = torch.Generator().manual_seed(step)
        x, y = torch.randn(9, 6, generator=g), torch.randn(9, 3, generator=g)
        for net, o in ((a, opt), (b, ref)):
            torch.nn.functional.mse_loss(net(x), y).backward()
            if net is a:
                ex.synchronize()
            o.step()
            o.zero_grad(set_to_none=True)
    return all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


def test_momentum_correction_with_weight_decay_on_a_model_is_bit_identical_alone():
    assert run_distributed(_model_worker, 1) == [True]


def _placed(t: torch.Tensor, alg: str, topo, d: int) -> torch.Tensor:
    """A worker's buffer over the whole tensor (hitopk's node-level chunk at its offset)."""
    if alg != "hitopk":
        return t.clone()
    full = torch.zeros(topo.local_size * t.numel(), dtype=t.dtype)
    full[topo.local_rank * t.numel():(topo.local_rank + 1) * t.numel()] = t
    return full[:d]


def _sparse_worker(rank, world, d, density, steps):
    from comm import Topology, build_exchanger

    topo = Topology(nodes=NODES, local_size=LOCAL)
    out = {}
    for alg in SPARSE:
        ex = build_exchanger(alg, topo, density=density, selector="exact", momentum=M)
        rows = []
        for step in range(steps):
            mem = ex.memory
            u_old = torch.zeros(0) if mem.momentum is None else mem.momentum.clone()
            v_old = torch.zeros(0) if mem.residual is None else mem.residual.clone()
            g = make_input(rank, step, d)
            res = ex.exchange(g)
            fed = g + (_placed(u_old * M, alg, topo, d) if u_old.numel() else 0)  # u before masking
            rows.append({"g": g, "out": res, "fed": fed,
                         "v_old": _placed(v_old, alg, topo, d) if v_old.numel() else torch.zeros(d, dtype=g.dtype),
                         "v_new": _placed(mem.residual, alg, topo, d),
                         "u_new": mem.momentum.clone(), "v_chunk": mem.residual.clone(), "u_old": u_old,
                         "v_old_chunk": v_old})
        out[alg] = rows
        out[f"{alg}/bytes"] = ex.inter_node_bytes
    dense = build_exchanger("dense", topo)
    dense.exchange(make_input(rank, 0, d))
    out["dense/bytes"] = dense.inter_node_bytes
    return portable(out)


@pytest.fixture(scope="module")
def sparse_runs():
    return [restore(r) for r in run_distributed(_sparse_worker, NODES * LOCAL, 40, 0.1, 3)]


@pytest.mark.parametrize("alg", SPARSE)
def test_conservation_in_update_units(sparse_runs, alg):
    """sum(momentum-corrected updates fed) + sum(old residuals) == P * output + sum(new residuals)."""
    world = len(sparse_runs)
    for step in range(3):
        rows = [r[alg][step] for r in sparse_runs]
        assert all(torch.equal(rows[0]["out"], r["out"]) for r in rows)
        fed = sum(r["fed"] for r in rows) + sum(r["v_old"] for r in rows)
        assert_close(fed, world * rows[0]["out"] + sum(r["v_new"] for r in rows), rtol=0, atol=1e-12)


def test_masking_clears_exactly_the_sent_entries_topk_ag(sparse_runs):
    """topk_ag: the sent entries are the exact top-k of ``m * u + g + v``; the momentum is
    zero there and ``m * u + g`` elsewhere; the residual likewise."""
    k = 4  # ceil(0.1 * 40)
    for run in sparse_runs:
        for row in run["topk_ag"]:
            u = (row["u_old"] * M if row["u_old"].numel() else 0) + row["g"]
            acc = u + row["v_old"]
            sent = torch.topk(acc.abs(), k).indices
            expected_u, expected_v = u.clone(), acc.clone()
            expected_u[sent] = 0
            expected_v[sent] = 0
            assert torch.equal(row["u_new"], expected_u)
            assert torch.equal(row["v_chunk"], expected_v)


def test_masking_clears_the_node_selection_hitopk(sparse_runs):
    """hitopk: the node-level momentum is zero exactly where the node's chunk was sent
    (where the new residual is zero), k entries per chunk."""
    k = 2  # the node's chunk of 40 / 2 elements, density 0.1
    for run in sparse_runs:
        for row in run["hitopk"]:
            assert torch.equal(row["u_new"] == 0, row["v_chunk"] == 0)
            assert int((row["u_new"] == 0).sum()) == k


def test_masking_treats_gtopk_selections_that_lost_the_global_top_k_as_not_sent(sparse_runs):
    """gtopk (Algorithm 4 line 10, NOTE [momentum correction]): the momentum is cleared exactly at
    the worker's local top-k entries inside the global mask; a local selection outside it keeps
    its momentum, and its value returns to the worker's residual."""
    k, lost = 4, 0  # ceil(0.1 * 40)
    for run in sparse_runs:
        for row in run["gtopk"]:
            u = (row["u_old"] * M if row["u_old"].numel() else 0) + row["g"]
            acc = u + row["v_old"]
            local = torch.topk(acc.abs(), k).indices
            inside = local[row["out"][local] != 0]
            missed = local[row["out"][local] == 0]
            expected_u = u.clone()
            expected_u[inside] = 0
            assert torch.equal(row["u_new"], expected_u)
            assert torch.equal(row["v_chunk"][missed], acc[missed])
            lost += missed.numel()
    assert lost > 0  # the inputs make some local selections lose


def test_no_masking_keeps_the_momentum():
    from comm.residual import ResidualMemory

    mem = ResidualMemory(momentum=0.5, masking=False)
    mem.compensate(torch.ones(4))
    mem.mask(torch.tensor([1, 2]))
    assert torch.equal(mem.momentum, torch.ones(4))
    masked = ResidualMemory(momentum=0.5)
    masked.compensate(torch.ones(4))
    masked.mask(torch.tensor([1, 2]))
    assert torch.equal(masked.momentum, torch.tensor([1.0, 0.0, 0.0, 1.0]))
    with pytest.raises(ValueError, match="momentum correction factor"):
        ResidualMemory(momentum=1.0)
    with pytest.raises(ValueError, match="one tensor layout"):
        masked.compensate(torch.ones(5))


def _clip_worker(rank, world, clip):
    from comm import GradientExchanger, SizePlan, Topology

    topo = Topology(nodes=NODES, local_size=LOCAL)
    p = torch.nn.Parameter(torch.zeros(30, dtype=torch.float64))
    ex = GradientExchanger([p], "topk_ag", topo, density=0.1, selector="exact", overlap=False, momentum=M,
                           plan=SizePlan(hybrid_threshold_bytes=0), clip_norm=clip, skip_nonfinite=False)
    g = make_input(rank, 0, 30) * (rank + 1) * 10
    p.grad = g.clone()
    ex.synchronize()
    mem = ex.exchangers[0].memory
    return portable({"g": g, "u": mem.momentum.clone(), "v": mem.residual.clone(), "out": p.grad.clone()})


def test_local_clipping_happens_before_accumulation():
    """The momentum (what entered accumulation) is the gradient clipped to clip / sqrt(P);
    the residual holds the clipped values that were not sent."""
    clip = 4.0
    runs = [restore(r) for r in run_distributed(_clip_worker, NODES * LOCAL, clip)]
    local = clip / (NODES * LOCAL) ** 0.5
    for r in runs:
        clipped = r["g"] * (local / (float(r["g"].norm()) + 1e-6))
        kept = r["v"] != 0  # not sent: first step, so momentum and residual both hold the clipped g
        assert int((~kept).sum()) == 3 and torch.equal(r["u"] == 0, ~kept)
        assert_close(r["u"][kept], clipped[kept], rtol=1e-12, atol=0)
        assert_close(r["v"][kept], clipped[kept], rtol=1e-12, atol=0)
        assert float(r["g"].norm()) > local  # every worker's gradient needed clipping


def test_inter_node_bytes_count_what_crosses_between_the_two_nodes(sparse_runs):
    """NOTE [inter-node bytes], 2 nodes x 2, d = 40 fp64, density 0.1, int32 indices (12
    bytes a pair), summed over ranks: dense's world ring crosses twice (ranks 1 and 3),
    each sending 2 * 3/4 * 320 bytes; topk_ag's all-gather ring likewise, 3 * 4 pairs
    each; hitopk sends its 2 pairs to the other node from every rank; gtopk crosses once
    in the merge tree (2 -> 0) and once in the broadcast (0 -> 2), 4 pairs each."""
    total = {name: sum(r[f"{name}/bytes"] for r in sparse_runs) for name in ("dense",) + SPARSE}
    steps = 3
    assert total == {"dense": 2 * 480, "topk_ag": steps * 2 * 3 * 4 * 12, "hitopk": steps * 4 * 2 * 12,
                     "gtopk": steps * 2 * 4 * 12}

