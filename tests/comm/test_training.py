"""DDP comm hook and GradientExchanger on a small model in a real 2x2 gloo group."""
from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from tests.comm._workers import restore, training
from tests.distributed import run_distributed


@pytest.fixture(scope="module")
def runs():
    return restore(run_distributed(training, 4, 2, 2))


@pytest.mark.parametrize("name", ["hitopk", "gtopk", "topk_ag", "2dtar"])
def test_hook_at_density_one_equals_plain_ddp(runs, name):
    for res in runs:
        for plain, hooked in res["hook_equal"][name]:
            assert_close(hooked, plain, rtol=1e-10, atol=1e-12)


def test_sparse_hook_at_density_001_lowers_loss(runs):
    for res in runs:
        first, last = sum(res["losses"][:4]) / 4, sum(res["losses"][-4:]) / 4
        assert last < 0.5 * first, (first, last)
    assert runs[0]["hook_state_keys"]  # residuals per bucket are checkpointable


def test_hook_skips_overflow_buckets_without_touching_residuals(runs):
    for res in runs:
        skipped, all_nan, residuals_kept = res["hook_overflow"]
        assert skipped == 1 and all_nan and residuals_kept


def test_gradient_exchanger_fuses_buckets_and_averages(runs):
    algorithms, _, _ = runs[0]["fusion"]
    assert len(algorithms) >= 2 and "hier" in algorithms and "2dtar" in algorithms
    locals_ = [r["fusion"][1] for r in runs]
    mean = [torch.stack(g).mean(0) for g in zip(*locals_)]
    for res in runs:
        for got, want in zip(res["fusion"][2], mean):
            assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_overflow_step_is_skipped_everywhere_without_touching_residuals(runs):
    for res in runs:
        applied, skipped, all_nan, residuals_kept, count = res["overflow"]
        assert applied and skipped and all_nan and residuals_kept and count == 1


def test_residuals_survive_checkpoint_and_layout_mismatch_is_refused(runs):
    for res in runs:
        assert res["reloaded"]
        assert "bucket_bytes" in res["layout_error"]
