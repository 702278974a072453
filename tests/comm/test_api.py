"""Argument checking and the cost model (no process group needed)."""
from __future__ import annotations

import pytest

import comm
import comm.plans
from comm import cost_model


PRICED = [n for n, a in comm.ALGORITHMS.items() if a.cost is not None]


def test_public_names():
    assert comm.names() == ["dense", "hier", "2dtar", "topk_ag", "gtopk", "hitopk", "omgs", "powersgd"]
    assert comm.names(per_bucket=True) == PRICED == ["dense", "hier", "2dtar", "topk_ag", "gtopk", "hitopk"]
    assert comm.names(sparse=True) == ["topk_ag", "gtopk", "hitopk", "omgs"]
    for name in comm.__all__:
        assert hasattr(comm, name)


def test_topology_needs_an_initialised_group():
    with pytest.raises(RuntimeError, match="init_process_group"):
        comm.Topology(nodes=1, local_size=1)


def test_unknown_names_list_the_valid_ones():
    with pytest.raises(ValueError, match="hitopk"):
        comm.build_exchanger("ring", None)
    with pytest.raises(ValueError, match="exact"):
        comm.build_exchanger("topk_ag", None, density=0.1, selector="no-such-selector")
    with pytest.raises(ValueError, match="density"):
        comm.build_exchanger("gtopk", None, density=1.5, selector="exact")
    with pytest.raises(ValueError, match="value_dtype"):
        comm.build_exchanger("dense", None, value_dtype="fp8")
    with pytest.raises(ValueError, match=r"'powersgd' has no per-bucket exchanger; valid: \['dense'"):
        comm.build_exchanger("powersgd", None)
    with pytest.raises(ValueError, match=r"unknown gradient exchange algorithm 'ring'; valid: \['dense'.*'powersgd'\]"):
        comm.get_algorithm("ring")
    with pytest.raises(ValueError, match="no cost model for 'omgs'"):
        cost_model.predict("omgs", 10, 0.1, 2, 2, cost_model.LinkParams())
    with pytest.raises(ValueError, match="unknown bucket plan 'ring'; valid"):
        comm.plans.make_plan("ring")


def test_cost_model_orders_algorithms_like_the_papers():
    p = cost_model.LinkParams.from_bandwidth(inter_mbit=200)
    d = 25_557_032
    t = {a: cost_model.predict(a, d, 0.01, 2, 2, p) for a in PRICED}
    assert t["hitopk"] < t["topk_ag"] < t["2dtar"] < t["dense"]
    # the all-gather of topk_ag grows with P, hitopk's with the number of nodes only
    assert cost_model.predict("topk_ag", d, 0.01, 4, 8, p) > 4 * cost_model.predict("hitopk", d, 0.01, 4, 8, p)
    with pytest.raises(ValueError, match="density"):
        cost_model.predict("hitopk", d, None, 2, 2, p)


def test_cost_model_fit_recovers_parameters():
    true = cost_model.LinkParams(alpha_intra=1e-5, beta_intra=2e-10, alpha_inter=3e-4, beta_inter=4e-8, gamma=5e-9)
    rows = [dict(algorithm=a, numel=n, density=0.01, nodes=m, local_size=l,
                 median_s=cost_model.predict(a, n, 0.01, m, l, true))
            for a in PRICED for n in (10_000, 1_000_000, 20_000_000) for m, l in ((2, 2), (4, 2), (3, 1))]
    got = cost_model.fit(rows)
    for name in cost_model.PARAMS:
        assert getattr(got, name) == pytest.approx(getattr(true, name), rel=1e-3)
    with pytest.raises(ValueError):
        cost_model.fit([])
    with pytest.raises(ValueError, match="alpha_inter"):
        cost_model.LinkParams(alpha_inter=-1)


@pytest.mark.parametrize("form", ["ring", "rd"])
def test_allgather_latency_form_is_fitted_and_the_better_one_kept(form):
    steps = cost_model.coefficients("topk_ag", 10_000, 0.01, 4, 2, allgather=form)["alpha_inter"]
    assert steps == {"ring": 7, "rd": 3}[form]  # P - 1 ring steps, log2 P doublings
    true = cost_model.LinkParams(alpha_intra=1e-5, beta_intra=2e-10, alpha_inter=3e-3, beta_inter=4e-8, gamma=5e-9)
    rows = [dict(algorithm=a, numel=n, density=0.01, nodes=m, local_size=l,
                 median_s=cost_model.predict(a, n, 0.01, m, l, true, allgather=form))
            for a in PRICED for n in (1_000, 100_000, 20_000_000) for m, l in ((2, 2), (4, 2), (8, 1))]
    chosen, params, errors = cost_model.fit_allgather(rows)
    assert chosen == form and errors[form] < 1e-6 < max(errors.values())
    assert params.alpha_inter == pytest.approx(true.alpha_inter, rel=1e-3)
    with pytest.raises(ValueError, match="all-gather form"):
        cost_model.coefficients("topk_ag", 10, 0.5, 2, 2, allgather="tree")
