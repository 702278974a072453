"""The engine (``comm.GradientExchanger``) and the asynchronous DDP hook in a real 2x2 gloo
group: overlap by event order, every algorithm on every plan kind against the plain
references, residual conservation across a phase switch, sparse gradients under DDP."""
from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from comm.plans import LayerPlan, OMGSPlan, SizePlan
from tests.comm import reference
from tests.comm._workers import portable, restore
from tests.distributed import run_distributed

NODES, LOCAL, DENSITY = 2, 2, 0.2
PLANS = {"size": dict(plan=SizePlan(bucket_bytes=8 * 50, hybrid_threshold_bytes=0)), "layer": dict(plan=LayerPlan()),
         "omgs": dict(plan=OMGSPlan((False, True, False, True, False, True)))}
PIPELINED = ["hitopk/layer", "gtopk/layer", "2dtar/layer", "topk_ag/omgs", "dense/size"]


def _model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 5), torch.nn.Tanh(),
                               torch.nn.Linear(5, 3)).double()


def _loss(model, rank, step):
    g = torch.Generator().manual_seed(100 * rank + step)
    x, y = torch.randn(7, 6, generator=g, dtype=torch.float64), torch.randn(7, 3, generator=g, dtype=torch.float64)
    return torch.nn.functional.mse_loss(model(x), y)


class _Bag(torch.nn.Module):
    """A model with a sparse gradient (``EmbeddingBag(sparse=True)``)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.EmbeddingBag(40, 6, mode="sum", sparse=True).double()
        self.fc = torch.nn.Linear(6, 2).double()

    def forward(self, idx, offsets):
        return self.fc(self.emb(idx, offsets))


def _bag_loss(model, rank):
    g = torch.Generator().manual_seed(rank)
    idx = torch.randint(0, 40, (12,), generator=g)
    return torch.nn.functional.mse_loss(model(idx, torch.tensor([0, 5, 9])),
                                        torch.randn(3, 2, generator=g, dtype=torch.float64))


def _engine_worker(rank, world):
    from torch.nn.parallel import DistributedDataParallel as DDP

    from comm import GradientExchanger, Topology, names, register_sparse_hook
    from comm.ddp_hook import SparseHookState, sparse_hook

    topo = Topology(nodes=NODES, local_size=LOCAL)
    out = {"runs": {}}
    # 1. every algorithm on every plan kind, two steps (residuals carried)
    for alg in names(per_bucket=True):
        for kind, options in PLANS.items():
            model = _model()
            ex = GradientExchanger(model.parameters(), alg, topo, density=DENSITY, selector="exact",
                                   skip_nonfinite=False, **options)
            steps = []
            for step in range(2):
                model.zero_grad()
                _loss(model, rank, step).backward()
                launched = ex.launched
                local = [p.grad.clone() for p in model.parameters()]
                ex.synchronize()
                steps.append((launched, local, [p.grad.clone() for p in model.parameters()]))
            out["runs"][f"{alg}/{kind}"] = ([list(b.params) for b in ex.buckets], steps)
            ex.remove()
    # 2. overlap by event order: when backward reaches the first layer, buckets of later layers are in flight
    model = _model()
    ex = GradientExchanger(model.parameters(), "hitopk", topo, density=DENSITY, selector="exact", plan=LayerPlan())
    seen = []
    x = torch.randn(4, 6, dtype=torch.float64)
    h = model[0](x)
    h.register_hook(lambda g: seen.append((ex.launched, [not f.done for _, f in ex._inflight])))
    torch.nn.functional.mse_loss(model[1:](h), torch.zeros(4, 3, dtype=torch.float64)).backward()
    seen.append((ex.launched, None))
    ex.synchronize()
    out["overlap"] = (seen, len(ex.buckets))
    # 3. pipelined: step t's exchange is still in flight after synchronize(t), finished in
    # step t + 1's backward and applied by synchronize(t + 1) (NOTE [pipelined exchange])
    out["pipeline"] = {}
    for case in PIPELINED:
        alg, kind = case.split("/")
        plain_model, piped_model = _model(), _model()
        plain = GradientExchanger(plain_model.parameters(), alg, topo, density=DENSITY, selector="exact",
                                  **PLANS[kind])
        piped = GradientExchanger(piped_model.parameters(), alg, topo, density=DENSITY, selector="exact",
                                  pipeline=True, **PLANS[kind])
        steps = []
        for step in range(3):
            for model in (plain_model, piped_model):
                model.zero_grad()
                _loss(model, rank, step).backward()
            drained_in_backward = piped._previous is None if step == 0 else piped._previous.done
            local = [p.grad.clone() for p in piped_model.parameters()]
            plain.synchronize()
            applied = piped.synchronize()
            in_flight = [not f.done for _, f in piped._previous.flights]
            waited = piped.last_timings.drained_in_backward  # for the trainer's breakdown
            drained_in_backward = drained_in_backward and (waited > 0) == (step > 0)
            piped_grads = [p.grad.clone() for p in piped_model.parameters()]
            ahead = None  # NOTE [lookahead]: this rank's own gradients of the step in flight, once
            if step < 2:  # step 2's go into the checkpoint below
                ahead = (piped.lookahead_grads(), [p.grad.clone() for p in piped_model.parameters()],
                         piped.lookahead_grads())
            steps.append((drained_in_backward, in_flight, applied, [p.grad.clone() for p in plain_model.parameters()],
                          piped_grads, local, ahead))
        try:  # residuals cannot move to another exchange while gradients are not applied
            piped.take_residuals()
            refused = False
        except RuntimeError as exc:
            refused = "flush()" in str(exc)
        # a checkpoint taken now holds step 2's gradients: a copy resumed from it applies them
        resumed = GradientExchanger(_model().parameters(), alg, topo, density=DENSITY, selector="exact",
                                    pipeline=True, **PLANS[kind])
        resumed.load_state_dict(piped.state_dict())
        resumed_ahead = (resumed.lookahead_grads(), [p.grad.clone() for p in resumed.params])
        resumed_flushed = resumed.flush()
        try:  # an exchanger without pipeline would drop them: refused
            plain.load_state_dict(piped.state_dict())
            refused_unpipelined = False
        except ValueError as exc:
            refused_unpipelined = "pipeline=True" in str(exc)
        flushed = piped.flush()
        last = [p.grad.clone() for p in piped_model.parameters()]
        resumed_last = [p.grad.clone() for p in resumed.params]
        out["pipeline"][case] = (steps, flushed, last, piped.flush(), refused and refused_unpipelined,
                                (resumed_flushed, resumed_last, resumed_ahead), "pending" in piped.state_dict())
    # 4. async DDP hook: futures of earlier buckets are still open when later buckets' hooks run
    # (DDP takes its bucket_cap_mb buckets from the second iteration on)
    plain = DDP(_model(), bucket_cap_mb=0.0002)
    for step in range(2):
        plain.zero_grad()
        _loss(plain, rank, step).backward()
    hooked = DDP(_model(), bucket_cap_mb=0.0002)
    state = SparseHookState("hitopk", topo, density=1.0, selector="exact")
    events = []

    def recording(st, bucket):
        fut = sparse_hook(st, bucket)
        events.append((bucket.index(), bucket.is_last(), fut.done(), len(st.in_flight)))
        return fut

    hooked.register_comm_hook(state, recording)
    for step in range(2):
        events.clear()
        hooked.zero_grad()
        _loss(hooked, rank, step).backward()
    out["ddp_events"] = events
    out["ddp_equal"] = [(a.grad, b.grad) for a, b in zip(plain.parameters(), hooked.parameters())]
    # 5. sparse gradients under DDP: density 1 equals plain DDP
    plain, hooked = DDP(_Bag()), DDP(_Bag())
    register_sparse_hook(hooked, "2dtar", topo, density=1.0)
    sparse = []
    for _ in range(2):
        for m in (plain, hooked):
            m.zero_grad(set_to_none=True)
            _bag_loss(m, rank).backward()
        sparse.append([(a.grad.to_dense(), b.grad.is_sparse, b.grad.to_dense()) for a, b in
                       zip(plain.parameters(), hooked.parameters())])
    out["sparse_ddp"] = sparse
    return portable(out)


@pytest.fixture(scope="module")
def runs():
    return restore(run_distributed(_engine_worker, NODES * LOCAL, timeout=300))


def _reference(alg, flats, residuals):
    """The plain reference of one bucket over all ranks: (output, new residuals)."""
    if alg in ("dense", "hier", "2dtar"):
        return torch.stack(flats).mean(0), residuals
    if residuals is None:
        size = -(-flats[0].numel() // LOCAL) if alg == "hitopk" else flats[0].numel()
        residuals = [torch.zeros(size, dtype=torch.float64) for _ in flats]
    if alg == "hitopk":
        return reference.hitopk(flats, residuals, DENSITY, NODES, LOCAL)
    return getattr(reference, alg)(flats, residuals, DENSITY)


@pytest.mark.parametrize("kind", sorted(PLANS))
@pytest.mark.parametrize("alg", ["dense", "hier", "2dtar", "topk_ag", "gtopk", "hitopk"])
def test_engine_equals_the_references_on_every_plan(runs, alg, kind):
    buckets, _ = runs[0]["runs"][f"{alg}/{kind}"]
    assert len(buckets) > 1  # several buckets in flight at once
    residuals = [None] * len(buckets)
    for step in range(2):
        per_rank = [r["runs"][f"{alg}/{kind}"][1][step] for r in runs]
        for launched, _, _ in per_rank:
            assert launched == len(buckets)  # every bucket started inside backward
        for b, params in enumerate(buckets):
            flats = [torch.cat([local[i].reshape(-1) for i in params]) for _, local, _ in per_rank]
            want, residuals[b] = _reference(alg, flats, residuals[b])
            for rank, (_, _, got) in enumerate(per_rank):
                flat = torch.cat([got[i].reshape(-1) for i in params])
                assert_close(flat, want, rtol=1e-9, atol=1e-12, msg=f"{alg}/{kind} step {step} bucket {b} rank {rank}")


def test_first_bucket_exchange_starts_before_backward_ends(runs):
    for res in runs:
        seen, buckets = res["overlap"]
        (at_first_layer, in_flight), (after_backward, _) = seen
        # the output layer's two buckets are launched before backward reaches the first
        # layer, and their collectives are still in flight there
        assert at_first_layer >= 2 and any(in_flight)
        assert after_backward == buckets


@pytest.mark.parametrize("case", PIPELINED)
def test_pipelined_exchange_applies_each_step_one_step_later(runs, case):
    for res in runs:
        steps, flushed, last, flushed_again, refused, resumed, pending = res["pipeline"][case]
        resumed_flushed, resumed_last, (resumed_ahead, resumed_ahead_grads) = resumed
        for step, (drained_in_backward, in_flight, applied, plain, piped, local, ahead) in enumerate(steps):
            assert drained_in_backward  # the previous step was finished inside this backward
            assert in_flight and all(in_flight)  # this step's buckets run on past synchronize()
            assert applied == (step > 0)
            want = steps[step - 1][3] if step else [torch.zeros_like(g) for g in plain]
            for got, w in zip(piped, want):
                assert_close(got, w, rtol=1e-9, atol=1e-12)
            if ahead is not None:  # NOTE [lookahead]: this step's own gradients, given once
                took, grads, took_again = ahead
                assert took and not took_again
                for got, w in zip(grads, local):
                    assert_close(got, w, rtol=0, atol=0)
        assert flushed and not flushed_again and refused and not pending
        assert resumed_ahead  # a checkpoint carries the step's own gradients for the look-ahead
        for got, w in zip(resumed_ahead_grads, steps[-1][5]):
            assert_close(got, w, rtol=0, atol=0)
        assert resumed_flushed
        for got, resumed, w in zip(last, resumed_last, steps[-1][3]):
            assert_close(got, w, rtol=1e-9, atol=1e-12)
            assert_close(resumed, w, rtol=0, atol=0)


def test_ddp_hook_returns_open_futures_and_equals_plain_ddp(runs):
    for res in runs:
        events = res["ddp_events"]
        assert len(events) > 1
        for index, last, done, in_flight in events:
            # open while backward goes on; the last bucket's hook finishes them all, in order
            assert done is last
            assert in_flight == (0 if last else index + 1)
        for plain, hooked in res["ddp_equal"]:
            assert_close(hooked, plain, rtol=1e-10, atol=1e-12)


def test_ddp_hook_with_sparse_gradients_equals_plain_ddp(runs):
    for res in runs:
        for step in res["sparse_ddp"]:
            (emb_plain, emb_sparse, emb_hooked), (w_plain, _, w_hooked), _ = step
            assert emb_sparse  # the optimiser still sees a sparse gradient
            assert_close(emb_hooked, emb_plain, rtol=1e-10, atol=1e-12)
            assert_close(w_hooked, w_plain, rtol=1e-10, atol=1e-12)


def _phase_switch_worker(rank, world, carry):
    """hitopk for two steps, then 2dtar for one (NOTE [residual at a phase switch]), on the
    engine and on the DDP hook: every rank's local gradients and averaged results."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from comm import GradientExchanger, Topology, register_sparse_hook

    topo = Topology(nodes=NODES, local_size=LOCAL)
    out = {}
    model = _model()
    first = GradientExchanger(model.parameters(), "hitopk", topo, density=0.1, selector="exact", plan=LayerPlan())
    second = None
    steps = []
    for step in range(3):
        if step == 2:
            residuals = first.take_residuals()
            first.remove()
            second = GradientExchanger(model.parameters(), "2dtar", topo, plan=SizePlan())
            if carry:
                second.carry_in(residuals)
        model.zero_grad()
        _loss(model, rank, step).backward()
        local = torch.cat([p.grad.reshape(-1).clone() for p in model.parameters()])
        (second or first).synchronize()
        steps.append((local, torch.cat([p.grad.reshape(-1).clone() for p in model.parameters()])))
    out["engine"] = steps
    module = _model()
    ddp = DDP(module, bucket_cap_mb=0.0002)
    state = register_sparse_hook(ddp, "hitopk", topo, density=0.1, selector="exact")
    steps = []
    for step in range(3):
        if step == 2:  # the trainer re-wraps the model for the next phase
            residuals = state.take_residuals()
            ddp = DDP(module, bucket_cap_mb=0.0002)
            following = register_sparse_hook(ddp, "2dtar", topo)
            if carry:
                following.carry_in(residuals)
        ddp.zero_grad()
        _loss(ddp, rank, step).backward()
        # the local gradient of this step, from a copy of the model outside DDP
        twin = _model()
        twin.load_state_dict(module.state_dict())
        _loss(twin, rank, step).backward()
        steps.append((torch.cat([p.grad.reshape(-1) for p in twin.parameters()]),
                      torch.cat([p.grad.reshape(-1).clone() for p in module.parameters()])))
    out["ddp"] = steps
    return portable(out)


@pytest.fixture(scope="module")
def phase_switch_runs():
    """Each run has both paths (engine and DDP hook): with the residual carried, and without."""
    return {carry: restore(run_distributed(_phase_switch_worker, NODES * LOCAL, carry)) for carry in (True, False)}


@pytest.mark.parametrize("path", ["engine", "ddp"])
def test_residual_is_applied_across_a_phase_switch(phase_switch_runs, path):
    def owed(results):
        """sum over ranks and steps of the inputs minus world x the averaged outputs."""
        inputs = sum(local for res in results for local, _ in res[path])
        outputs = sum(avg for avg in (step[1] for step in results[0][path]))
        return inputs - len(results) * outputs

    kept = phase_switch_runs[True]
    for res in kept[1:]:  # every rank got the same averages
        for (_, a), (_, b) in zip(res[path], kept[0][path]):
            assert_close(a, b, rtol=0, atol=1e-12)
    assert_close(owed(kept), torch.zeros_like(owed(kept)), rtol=0, atol=1e-10)  # nothing lost
    dropped = phase_switch_runs[False]
    assert owed(dropped).abs().max() > 1e-3  # without carrying it, the residual would be lost


def test_size_plan_sends_vector_parameters_densely_last_when_asked():
    """NOTE [dense vectors]: with a sparse algorithm, the biases and batch-norm parameters
    leave the sparse buckets for ``hier`` buckets launched after them; a dense algorithm
    and the default plan are unchanged."""
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Flatten(),
                                torch.nn.Linear(16, 2))
    params = list(model.parameters())  # conv w, conv b, bn w, bn b, fc w, fc b
    plan = SizePlan(hybrid_threshold_bytes=0, dense_vectors=True).buckets(params, "hitopk")
    assert [(b.params, b.algorithm) for b in plan] == [((4, 0), "hitopk"), ((5, 3, 2, 1), "hier")]
    for algorithm, dense_vectors in (("hier", True), ("hitopk", False)):
        plan = SizePlan(hybrid_threshold_bytes=0, dense_vectors=dense_vectors).buckets(params, algorithm)
        assert [(b.params, b.algorithm) for b in plan] == [((5, 4, 3, 2, 1, 0), algorithm)]
