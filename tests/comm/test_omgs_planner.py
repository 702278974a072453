"""OMGS planners and the iteration-time model (pure functions, no processes)."""
from __future__ import annotations

import itertools
import random

import pytest

from comm.omgs import (find_merged_layers, groups_from_plan, lags_plan, predict_iteration_time,
                       simulate, single_bucket_plan, threshold_plan, CostModel)
from comm.topk import k_for


def _random_profile(rng: random.Random, num_layers: int):
    tb = [rng.uniform(0.0, 0.01) for _ in range(num_layers)]
    d = [rng.choice([rng.randint(2, 1000), rng.randint(1000, 3_000_000)]) for _ in range(num_layers)]
    coeffs = dict(alpha=rng.uniform(0, 0.01), beta=rng.uniform(0, 1e-7),
                  gamma=rng.choice([0.0, 1e-9, 1e-7]) * rng.random(), rho=rng.choice([0.001, 0.01, 0.1]))
    return tb, d, coeffs


def test_model_follows_equations_by_hand():
    # layer 1 (last) ready at 0.1, sparsified at 0.1+ts; layer 0's backward starts after it.
    cost = CostModel(alpha=1.0, beta=0.0, gamma=1e-3, rho=0.01)
    ts100 = 1e-3 * 0.01 * 100 * __import__("math").log(100)
    rows = simulate([5.0, 0.1], [100, 100], [False, False], cost)
    assert [(r["start"], r["end"]) for r in rows] == [(1, 2), (0, 1)]  # backward order
    assert rows[0]["sparsified"] == pytest.approx(0.1 + ts100)
    assert rows[1]["ready"] == pytest.approx(5.1 + ts100)
    assert rows[1]["comm_start"] == pytest.approx(5.1 + 2 * ts100)
    assert rows[1]["comm_end"] == pytest.approx(6.1 + 2 * ts100)
    # comm bound: the second all-gather waits for the first (eq. 8)
    assert predict_iteration_time([0.1, 0.1], [100, 100], [False, False], 1.0, 0.0, 0.0, 0.01) == pytest.approx(2.1)
    # bytes: 8 per selected entry, k = ceil(rho * n)
    assert k_for(1001, 0.01) == 11
    assert predict_iteration_time([0.0], [1001], [False], 0.0, 1.0, 0.0, 0.01) == pytest.approx(88.0)
    assert predict_iteration_time([0.0], [10], [False], 0.0, 0.0, 0.0, 0.01, tf=2.0) == 2.0


def test_plan_conventions_and_validation():
    assert groups_from_plan([False, True, True, False]) == [(0, 3), (3, 4)]
    assert lags_plan(3) == [False] * 3 and single_bucket_plan(3) == [False, True, True]
    assert threshold_plan([10, 10, 10, 10, 10], 80) == [False, False, True, False, True]
    with pytest.raises(ValueError, match="first layer"):
        groups_from_plan([True, False])
    with pytest.raises(ValueError, match="valid: \\['optimal', 'paper'\\]"):
        find_merged_layers([0.1], [10], 1, 0, 0, 0.1, method="greedy")
    with pytest.raises(ValueError, match="same length"):
        find_merged_layers([0.1, 0.1], [10], 1, 0, 0, 0.1)
    with pytest.raises(ValueError, match="rho"):
        find_merged_layers([0.1], [10], 1, 0, 0, 0.0)


def test_paper_planner_hand_worked_cases():
    # must merge: two quick layers, alpha dominates -> one all-gather instead of two
    assert find_merged_layers([0.1, 0.1], [100, 100], 1.0, 0.0, 0.0, 0.01) == [False, True]
    # must not merge: layer 0's backward (5 s) hides layer 1's exchange; merging only adds
    # sparsification time (Q3 fails: u = 5.1 > tau_c + t_c = 1.1 + ts)
    assert find_merged_layers([5.0, 0.1], [100, 100], 1.0, 0.0, 1e-3, 0.01) == [False, False]
    # three layers by hand: layer 2 is hidden behind layer 1's 5 s backward (no merge);
    # layer 1 satisfies Q3 (5.2 < 5.1 + 1) and Q5 (6.1 > 5.2): merged into layer 0
    plan = find_merged_layers([0.1, 5.0, 0.1], [100, 100, 100], 1.0, 0.0, 0.0, 0.01)
    assert plan == [False, True, False]
    assert predict_iteration_time([0.1, 5.0, 0.1], [100] * 3, plan, 1.0, 0, 0, 0.01) == pytest.approx(6.2)
    # the first layer never merges, even when merging everything is best
    for method in ("paper", "optimal"):
        assert find_merged_layers([0.0] * 4, [50] * 4, 10.0, 0.0, 0.0, 0.1, method=method) == [False, True, True, True]
        assert find_merged_layers([0.3], [50], 10.0, 0.0, 0.0, 0.1, method=method) == [False]


def test_optimal_equals_brute_force_on_small_profiles():
    rng = random.Random(7)
    for _ in range(60):
        n = rng.randint(1, 10)
        tb, d, c = _random_profile(rng, n)
        plan = find_merged_layers(tb, d, **c, method="optimal")
        got = predict_iteration_time(tb, d, plan, **c)
        best = min(predict_iteration_time(tb, d, [False, *rest], **c)
                   for rest in itertools.product([False, True], repeat=n - 1))
        assert got == pytest.approx(best, rel=1e-12, abs=1e-15)
        paper = predict_iteration_time(tb, d, find_merged_layers(tb, d, **c, method="paper"), **c)
        assert got <= paper * (1 + 1e-12)


def test_more_merging_as_alpha_grows():
    rng = random.Random(3)
    alphas = [0.0, 1e-5, 1e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 1.0, 100.0]
    for _ in range(40):
        n = rng.randint(2, 40)
        tb, d, c = _random_profile(rng, n)
        c.pop("alpha")
        counts = [sum(find_merged_layers(tb, d, a, **c, method="paper")) for a in alphas]
        assert counts == sorted(counts), counts
        assert counts[-1] == n - 1  # huge start-up cost: everything in one group
        times = [predict_iteration_time(tb, d, find_merged_layers(tb, d, a, **c, method="optimal"), a, **c)
                 for a in alphas]
        assert times == sorted(times)


def test_optimal_planner_handles_resnet_sized_profiles():
    rng = random.Random(11)
    tb, d, c = _random_profile(rng, 220)
    plan = find_merged_layers(tb, d, **c, method="optimal")
    assert len(plan) == 220 and not plan[0]
    opt = predict_iteration_time(tb, d, plan, **c)
    for other in (lags_plan(220), single_bucket_plan(220), find_merged_layers(tb, d, **c)):
        assert opt <= predict_iteration_time(tb, d, other, **c) * (1 + 1e-12)


def test_optimal_with_per_group_overhead_equals_brute_force():
    rng = random.Random(5)
    for _ in range(25):
        n = rng.randint(2, 9)
        tb, d, c = _random_profile(rng, n)
        ts0 = rng.uniform(0, 0.005)
        plan = find_merged_layers(tb, d, **c, method="optimal", ts0=ts0)
        got = predict_iteration_time(tb, d, plan, **c, ts0=ts0)
        best = min(predict_iteration_time(tb, d, [False, *rest], **c, ts0=ts0)
                   for rest in itertools.product([False, True], repeat=n - 1))
        assert got == pytest.approx(best, rel=1e-12, abs=1e-15)
    # a per-group overhead makes merging worth it where it was not
    assert find_merged_layers([0.0, 0.0], [10, 10], 0.0, 0.0, 0.0, 0.1, method="optimal", ts0=1.0) == [False, True]
