"""What one ``mstopk`` call costs besides time: candidates, passes over ``x``, host syncs.

``mstopk_counts`` runs one call with its internals instrumented (so never inside a timed
call) and reports:

- ``candidates``: entries the call collected to find the (k+1)-th magnitude: the size of
  the kernel's compaction buffer, or of the torch path's last candidate scan.
- ``passes``: bytes read from ``x`` divided by its size. Every Triton kernel launched on
  ``x`` (``_launch``) and every torch ``scan`` reads all of ``x`` once; the torch path's
  sample adds the sampled fraction.
- ``host_syncs``: reads of device values into Python by ``comm/`` code
  (``HostSyncCounter``).
- ``fine_bin`` (kernel only): entries in the fine histogram bin holding the (k+1)-th
  magnitude: the target is ``candidates <= 2k + fine_bin``.
"""
from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

import torch

from comm.topk import mstopk

__all__ = ["HostSyncCounter", "mstopk_counts"]

_COMM_DIR = str(Path(__file__).resolve().parents[2] / "comm")


class HostSyncCounter:
    """Counts, while active, the reads of tensor values into Python made by ``comm/``
    code: ``.item()``, ``.tolist()``, ``float()``/``int()``/``bool()``, ``.numpy()``,
    copies off or onto the device (``.cpu()``, ``.to(device)``, ``torch.tensor(...,
    device=)``), and boolean-mask indexing and ``nonzero`` (their output size is read
    back). On a GPU each waits for the device; in Triton's interpreter they are the same
    calls on CPU tensors, so the count is the same. A CPU generator's draw
    (``draw_offset``) is host-side and not counted.

    Use as a context manager; ``count`` and ``where`` (``"name at file:line"``) hold the result.
    """

    def __init__(self):
        self.count, self.where, self._undo = 0, [], []

    def _wrap(self, owner, name, check=None):
        orig = getattr(owner, name)

        def wrapper(*args, **kwargs):
            caller = sys._getframe(1)
            code = caller.f_code
            if (code.co_filename.startswith(_COMM_DIR) and code.co_name != "draw_offset"
                    and (check is None or check(*args, **kwargs))):
                self.count += 1
                self.where.append(f"{name} at {os.path.basename(code.co_filename)}:{caller.f_lineno}")
            return orig(*args, **kwargs)

        setattr(owner, name, wrapper)
        self._undo.append((owner, name, orig))

    def __enter__(self) -> HostSyncCounter:
        T = torch.Tensor
        for name in ("item", "tolist", "__float__", "__int__", "__bool__", "__index__", "numpy", "cpu", "nonzero"):
            self._wrap(T, name)
        self._wrap(T, "to", lambda *a, **kw: "device" in kw or any(isinstance(v, (str, torch.device)) for v in a[1:]))
        self._wrap(T, "__getitem__", lambda _self, index, *rest: any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (index if isinstance(index, tuple) else (index,))))
        self._wrap(torch, "nonzero")
        self._wrap(torch, "tensor", lambda *a, **kw: "device" in kw)
        return self

    def __exit__(self, *exc) -> None:
        for owner, name, orig in reversed(self._undo):
            setattr(owner, name, orig)
        self._undo.clear()


@contextlib.contextmanager
def _patched(module, name, make):
    orig = getattr(module, name)
    setattr(module, name, make(orig))
    try:
        yield
    finally:
        setattr(module, name, orig)


def mstopk_counts(x: torch.Tensor, k: int, kernel: str, generator: torch.Generator | None = None) -> dict:
    """One ``mstopk(x, k, kernel=kernel)`` call, instrumented; see the module docstring."""
    import comm.topk.mstopk_torch as torch_path

    n = x.numel()
    seen = {"passes": 0.0, "candidates": None, "fine_bin": None}
    sampling = []

    def scan(orig):
        def counted(xs, cut):
            s = orig(xs, cut)
            seen["passes"] += 1
            if cut != float("inf"):
                seen["candidates"] = s.idx.numel()
            return s
        return counted

    def sample_cut(orig):
        def counted(*args):
            sampling.append(True)
            try:
                return orig(*args)
            finally:
                sampling.pop()
        return counted

    def mag(orig):
        def counted(t):
            if sampling:
                seen["passes"] += t.numel() / n
            return orig(t)
        return counted

    with contextlib.ExitStack() as stack:
        stack.enter_context(_patched(torch_path, "scan", scan))
        stack.enter_context(_patched(torch_path, "_sample_cut", sample_cut))
        stack.enter_context(_patched(torch_path, "_mag", mag))
        if kernel == "gpu":
            import comm.topk.mstopk_triton as kernels

            def launch(orig):
                def counted(kern, grid, *args, **meta):
                    if args and isinstance(args[0], torch.Tensor) and args[0].data_ptr() == x.data_ptr():
                        seen["passes"] += 1
                    return orig(kern, grid, *args, **meta)
                return counted

            def candidates(orig):
                def counted(*args):
                    found = orig(*args)
                    if found is not None:
                        seen["candidates"], seen["fine_bin"] = found.idx.numel(), found.fine_bin
                    return found
                return counted

            stack.enter_context(_patched(kernels, "_launch", launch))
            stack.enter_context(_patched(kernels, "gpu_candidates", candidates))
        syncs = stack.enter_context(HostSyncCounter())
        mstopk(x, k, kernel=kernel, generator=generator)
    cand = seen["candidates"]
    return dict(candidates=cand, candidates_per_k=cand / k if cand is not None else None,
                fine_bin=seen["fine_bin"], passes=seen["passes"], host_syncs=syncs.count)
