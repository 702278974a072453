"""``kernel="auto"`` on a GPU: the kernel only where a recorded measurement on that device
class says it beats ``torch.topk`` (NOTE [MSTopK kernel choice]); the table's entries come
from ``bench topk`` rows."""
from __future__ import annotations

import json

import pytest
import torch

import comm.topk.kernel_choice as choice


def _row(impl, numel, density, dist, seconds):
    selector, _, kernel = impl.partition(":")
    return dict(selector=selector, impl=kernel or "torch", numel=numel, density=density, distribution=dist,
                median_s=seconds)


def test_an_entry_holds_the_worst_ratio_over_distributions():
    rows = [_row("exact", 1 << 24, 0.001, "gaussian", 4e-4), _row("mstopk:gpu", 1 << 24, 0.001, "gaussian", 1e-4),
            _row("mstopk:torch", 1 << 24, 0.001, "gaussian", 9e-4), _row("exact", 1 << 24, 0.001, "cauchy", 4e-4),
            _row("mstopk:gpu", 1 << 24, 0.001, "cauchy", 2e-4), _row("exact", 1 << 26, 0.01, "gaussian", 1e-3)]
    entry = choice.timings_entry(rows, "a note")
    assert entry == {"note": "a note", "ratios": [[1 << 24, 0.001, 0.5]]}  # 64M has no kernel row


@pytest.mark.parametrize("numel,density,want", [
    (1 << 24, 0.001, True),       # measured: 0.5
    (1 << 25, 0.001, False),      # between 16M (faster) and 64M (slower): both must agree
    (1 << 26, 0.001, False),      # measured: 1.2
    (1 << 23, 0.001, True),       # half of 16M: within reach
    (1 << 21, 0.001, False),      # 8x below any measurement
    (1 << 24, 0.002, True),       # density within 3x of 0.001
    (1 << 24, 0.05, False),       # no measurement near 5 %
    (1 << 28, 0.01, True),        # twice 128M at 1 %
])
def test_the_kernel_is_picked_only_near_a_measurement_that_says_so(numel, density, want):
    ratios = ((1 << 24, 0.001, 0.5), (1 << 26, 0.001, 1.2), (1 << 27, 0.01, 0.4))
    assert choice._decide(ratios, numel, density) is want


def test_auto_reads_the_table_of_the_device_class(tmp_path, monkeypatch):
    table = tmp_path / "kernel_timings.json"
    table.write_text(json.dumps({"kernel_version": choice.KERNEL_VERSION,
                                 "devices": {"Some GPU": {"note": "", "ratios": [[1 << 24, 0.001, 0.3]]}}}))
    monkeypatch.setattr(choice, "device_class", lambda index: "Some GPU")
    read = choice._table.__wrapped__  # uncached: the test rewrites the file
    monkeypatch.setattr(choice, "_table", lambda path=table: read(path))
    device = torch.device("cuda", 0)  # only its index is read
    assert choice.kernel_beats_topk(device, 1 << 24, 1 << 14)
    assert not choice.kernel_beats_topk(device, 1 << 16, 64)
    monkeypatch.setattr(choice, "device_class", lambda index: "Another GPU")
    assert not choice.kernel_beats_topk(device, 1 << 24, 1 << 14)
    table.write_text(json.dumps({"kernel_version": choice.KERNEL_VERSION - 1, "devices": {"Another GPU": {
        "note": "", "ratios": [[1 << 24, 0.001, 0.3]]}}}))  # an older kernel's measurements do not count
    assert not choice.kernel_beats_topk(device, 1 << 24, 1 << 14)


def test_the_shipped_table_is_readable_and_current():
    table = json.loads(choice.TABLE.read_text())
    assert table["kernel_version"] == choice.KERNEL_VERSION
    for entry in table["devices"].values():
        assert all(len(r) == 3 and r[0] > 0 and 0 < r[1] <= 1 and r[2] > 0 for r in entry["ratios"])
