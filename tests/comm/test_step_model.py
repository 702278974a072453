"""The step model (comm/step_model.py): what it adds to the cost model's formulas."""
from __future__ import annotations

import dataclasses
import math

import pytest

from comm.auto import choose
from comm.cost_model import LinkParams, predict
from comm.registry import ALGORITHMS
from comm.step_model import BACKWARD_SHARE, MEASURED, Library, bucket_count, images_per_s_at, step

PRICED = [n for n, a in ALGORITHMS.items() if a.cost is not None]
LINK = LinkParams.from_bandwidth(inter_mbit=10_000, intra_gbit=100, gamma=1e-9)
D = 25_557_032


def _step(name, library=MEASURED, compute=0.1, buckets=1, nodes=4, local=4, **kw):
    density = 0.01 if ALGORITHMS[name].sparse else None
    return step(name, numel=D, density=density, nodes=nodes, local_size=local, link=LINK, compute_s=compute,
                library=library, buckets=buckets, **kw)


@pytest.mark.parametrize("name", PRICED)
def test_measured_library_is_compute_plus_the_cost_models_exchange(name):
    s = _step(name)
    density = 0.01 if ALGORITHMS[name].sparse else None
    assert s.total_s == pytest.approx(0.1 + predict(name, D, density, 4, 4, LINK), rel=1e-12)
    assert s.exposed_s == pytest.approx(s.selection_s + s.exchange_s) and s.overlapped_s == pytest.approx(0)


def test_choose_prices_with_the_step_model():
    link = LinkParams.from_bandwidth(inter_mbit=200)
    c = choose(numel=D, nodes=2, local_size=2, link=link, compute_s=0.3, steps=100, mean_density=0.02)
    for name, seconds in c.step_s.items():
        s = step(name, numel=D, density=0.02 if ALGORITHMS[name].sparse else None, nodes=2, local_size=2,
                 link=link, compute_s=0.3)
        assert seconds == pytest.approx(s.total_s)


@pytest.mark.parametrize("compute", [0.01, 0.2, 5.0])
@pytest.mark.parametrize("buckets", [1, 4])
def test_backward_hides_all_but_the_last_bucket_at_most(compute, buckets):
    lib = Library(overlap_share=0.5)
    s = _step("2dtar", lib, compute=compute, buckets=buckets)
    total = s.selection_s + s.exchange_s
    assert s.exposed_s == pytest.approx(max(total / buckets, total - 0.5 * BACKWARD_SHARE * compute))
    after = _step("2dtar", dataclasses.replace(lib, after_backward={"2dtar"}), compute=compute, buckets=buckets)
    assert after.exposed_s == pytest.approx(total)
    assert s.total_s == pytest.approx(s.compute_s + s.exposed_s)


def test_a_flow_cap_slows_one_stream_per_node_more_than_a_stream_per_local_rank():
    line = 8 / 25e9
    capped = Library(flow_gbit=3.5)
    assert capped.beta_inter("dense", line, 8) == pytest.approx(8 / 3.5e9)
    assert capped.beta_inter("hier", line, 8) == pytest.approx(8 / 3.5e9)
    assert capped.beta_inter("2dtar", line, 8) == pytest.approx(line)  # 8 x 3.5 Gbit/s > 25 Gbit/s
    assert capped.beta_inter("hitopk", line, 4) == pytest.approx(8 / 14e9)
    assert Library(efficiency={"dense": 0.5}).beta_inter("dense", line, 8) == pytest.approx(2 * line)
    assert Library().beta_inter("dense", 0.0, 8) == 0.0  # an unlimited link stays unlimited


def test_capped_dense_pays_its_inter_node_bytes_at_the_flow_rate():
    link = LinkParams(alpha_intra=0, beta_intra=0, alpha_inter=0, beta_inter=8 / 25e9)
    s = step("dense", numel=D, density=None, nodes=16, local_size=8, link=link, compute_s=0.0,
             library=Library(flow_gbit=2.5, overlap_share=0.0), value_bytes=2)
    p = 128
    assert s.exchange_s == pytest.approx(2 * (p - 1) / p * D * 2 * 8 / 2.5e9)


def test_sparse_host_work_and_the_update_and_overhead_are_added():
    lib = Library(overlap_share=0.0, host_s_per_element=1e-9, overhead_s=0.02)
    dense, sparse = _step("dense", lib, update_s=0.007), _step("gtopk", lib, update_s=0.007)
    assert dense.exchange_s == pytest.approx(_step("dense").exchange_s)
    assert sparse.exchange_s == pytest.approx(_step("gtopk").exchange_s + D * 1e-9)
    assert sparse.total_s == pytest.approx(0.1 + sparse.exposed_s + 0.007 + 0.02)


def test_compute_takes_the_single_gpu_update_out():
    lib = Library(single_update_s_per_param=1e-9, update_s_per_param=0.5e-9)
    assert lib.compute_s(256, 1000.0, 10_000_000) == pytest.approx(0.256 - 0.01)
    assert lib.update_s(10_000_000) == pytest.approx(0.005)
    with pytest.raises(ValueError, match="no time beside the update"):
        lib.compute_s(1, 1000.0, 10_000_000)


@pytest.mark.parametrize("kw", [{"flow_gbit": 0}, {"flow_gbit": math.inf}, {"overlap_share": 1.5},
                                {"efficiency": {"dense": 0}}, {"efficiency": {"nope": 0.5}},
                                {"after_backward": {"nope"}}, {"allgather": "tree"}, {"overhead_s": -1},
                                {"host_s_per_element": math.nan}])
def test_bad_library_values_are_refused(kw):
    with pytest.raises(ValueError):
        Library(**kw)


def test_bad_step_arguments_are_refused():
    with pytest.raises(ValueError, match="buckets"):
        _step("dense", buckets=0)
    with pytest.raises(ValueError):
        _step("dense", compute=-1.0)


def test_rates_at_other_sizes_scale_by_pixels_from_the_nearest():
    rates = {96: 4400.0, 224: 1240.0}
    assert images_per_s_at(rates, 96) == 4400.0
    assert images_per_s_at(rates, 128) == pytest.approx(4400 * (96 / 128) ** 2)
    assert images_per_s_at(rates, 288) == pytest.approx(1240 * (224 / 288) ** 2)
    for bad in ({}, {96: 0.0}):
        with pytest.raises(ValueError):
            images_per_s_at(bad, 96)


def test_bucket_count_follows_the_engines_default_plan():
    from comm.plans.size import SizePlan

    assert bucket_count(1) == 1
    assert bucket_count(D) == math.ceil(D * 4 / SizePlan.bucket_bytes) == 4
