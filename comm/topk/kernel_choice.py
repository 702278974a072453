"""Which MSTopK implementation ``kernel="auto"`` runs on a CUDA tensor: measured, not assumed.

NOTE [MSTopK kernel choice]: on CPU ``auto`` is the torch path (one read of ``x`` there,
several times faster than ``torch.topk``). On a GPU the Triton kernel is picked only
where a measurement recorded on the same device class (``torch.cuda.get_device_name``)
for the current kernel version says it beats ``torch.topk`` at that size and density;
anywhere else, the torch path. The measurements live in ``kernel_timings.json`` next to
this file and come from ``cachepipe doctor --gpu``, which runs ``bench topk --device
cuda`` and rewrites its device's entry (``timings_entry``). A point counts when it is
within a factor 2 of a measured size and 3 of a measured density; between two measured
sizes both must agree; across the measured distributions the worst ratio decides.
``exact`` (``torch.topk`` itself) is a different selector and never ``auto``'s answer:
``mstopk``'s implementations select the same indices for the same generator, ``exact``
does not (it takes the exact top-k instead of Algorithm 1's fill).
"""
from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import torch

__all__ = ["TABLE", "KERNEL_VERSION", "kernel_beats_topk", "timings_entry", "device_class"]

TABLE = Path(__file__).with_name("kernel_timings.json")
KERNEL_VERSION = 3  # 1: the three-pass radix histogram kernel (slower than torch.topk on an H200);
# 2: one read with fenced (acq_rel) atomics, 1.2-3.7x slower than torch.topk on an H100 (docs/topk.md);
# 3: the filter pass's atomics relaxed (NOTE [relaxed atomics])
SIZE_REACH, DENSITY_REACH = 2.0, 3.0


@functools.lru_cache(maxsize=16)
def device_class(index: int) -> str:
    """The name measurements are filed under for CUDA device ``index``."""
    return torch.cuda.get_device_name(index)


@functools.lru_cache(maxsize=4)
def _table(path: Path = TABLE) -> dict:
    try:
        table = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return table if table.get("kernel_version") == KERNEL_VERSION else {}


def kernel_beats_topk(device: torch.device, numel: int, k: int) -> bool:
    """Whether a recorded measurement on ``device``'s class says the kernel beats
    ``torch.topk`` for ``numel`` entries and ``k`` kept (NOTE [MSTopK kernel choice])."""
    entry = _table().get("devices", {}).get(device_class(device.index or 0))
    return entry is not None and _decide(tuple(map(tuple, entry["ratios"])), numel, k / numel)


@functools.lru_cache(maxsize=1024)
def _decide(ratios: tuple, numel: int, density: float) -> bool:
    near = [(n, r) for n, d, r in ratios if abs(math.log(d / density)) <= math.log(DENSITY_REACH)]
    lower = max((n for n, _ in near if n <= numel), default=None)
    upper = min((n for n, _ in near if n >= numel), default=None)
    if lower is not None and upper is not None:
        chosen = {lower, upper}  # between two measured sizes (or at one): both decide
    elif lower is not None and numel / lower <= SIZE_REACH:
        chosen = {lower}
    elif upper is not None and upper / numel <= SIZE_REACH:
        chosen = {upper}
    else:
        return False
    return all(r < 1.0 for n, r in near if n in chosen)


def timings_entry(rows: list[dict], note: str = "") -> dict:
    """A device's table entry from its ``bench topk --device cuda`` rows: per (numel,
    density), the kernel's time over ``torch.topk``'s, the worst over the distributions."""
    times: dict[tuple, dict] = {}
    for r in rows:
        impl = "exact" if r["selector"] == "exact" else f"{r['selector']}:{r['impl']}"
        times.setdefault((r["numel"], r["density"], r["distribution"]), {})[impl] = r["median_s"]
    worst: dict[tuple, float] = {}
    for (numel, density, _), t in times.items():
        if "exact" in t and "mstopk:gpu" in t:
            worst[numel, density] = max(worst.get((numel, density), 0.0), t["mstopk:gpu"] / t["exact"])
    return {"note": note, "ratios": [[n, d, round(r, 4)] for (n, d), r in sorted(worst.items())]}
