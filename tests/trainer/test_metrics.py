"""The per-iteration time breakdown (``trainer.metrics.TimeBreakdown``)."""
from __future__ import annotations

import pytest

from comm.timings import ExchangeTimings
from trainer.metrics import TimeBreakdown


def test_exchange_time_moves_work_done_inside_backward_out_of_compute():
    t = TimeBreakdown()
    t.add("compute", 0.050)  # forward + backward, with 3 ms of selection and 20 ms of waiting inside
    t.add_exchange(0.010, ExchangeTimings(select=0.002, select_overlapped=0.003, drained_in_backward=0.020))
    t.iterations = 1
    per = t.per_iteration()
    assert per["compute"] == pytest.approx(0.027)
    assert per["compress"] == pytest.approx(0.005)
    assert per["communicate"] == pytest.approx(0.008 + 0.020)  # the rest of synchronize() and the wait in backward
    assert sum(per.values()) == pytest.approx(0.060)  # nothing counted twice
