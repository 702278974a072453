"""What one ``mstopk`` call costs besides time: candidates, read passes, launches, host syncs.

``mstopk_counts`` runs one call with its internals instrumented (so never inside a timed
call) and reports:

- ``candidates``: entries the call collected to find the (k+1)-th magnitude (the kernel's
  compaction buffer, or the torch path's last candidate scan); ``fine_bin`` (kernel
  only): entries in the histogram bin holding the (k+1)-th magnitude. The target is
  ``candidates <= 2k + fine_bin``.
- ``read_passes``: elements of ``x`` read, divided by its size, counted where they are
  read (NOTE [counted, not modelled]): every element a Triton kernel loads from ``x``'s
  memory in the interpreter, plus the elements of every torch op input that aliases ``x``
  (what a gather returns, for a gather).
- ``launches``: Triton kernel launches plus torch ops that are not views (allocations
  and CPU ops included, whatever their device), issued by the call itself (the torch ops
  Triton's interpreter runs inside a launch are not the GPU's and are not counted), and
  ``full_size_ops``: those of them with a tensor of as many bytes as ``x`` among their
  arguments or results (an allocation's result is untouched and does not count).
- ``host_syncs``: reads of device values into Python by ``comm/`` code (``HostSyncCounter``).

``op_times_us`` says where a call's time goes (``torch.profiler``): per kernel its device
time on CUDA (the filter pass of the MSTopK kernel, say), per op its CPU time on CPU.

NOTE [counted, not modelled]: the counts come from the code that runs, not from a model of
it, so a change that adds a pass or a launch shows up here. Without a GPU the Triton kernels
run in the interpreter, which loads through one function (patched here) on CPU tensors; on
a GPU their loads cannot be seen, so ``read_passes`` is ``None`` for the kernel there.
"""
from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from comm.topk import mstopk

__all__ = ["HostSyncCounter", "LaunchCounter", "XReadCounter", "mstopk_counts", "op_times_us"]

_COMM_DIR = str(Path(__file__).resolve().parents[3] / "comm")
_GATHERS = {torch.ops.aten.index.Tensor, torch.ops.aten.index_select.default, torch.ops.aten.gather.default,
            torch.ops.aten.take.default}
_ALLOCATIONS = {torch.ops.aten.empty.memory_format, torch.ops.aten.empty_strided.default}


class HostSyncCounter:
    """Counts, while active, the reads of tensor values into Python made by ``comm/``
    code: ``.item()``, ``.tolist()``, ``float()``/``int()``/``bool()``, ``.numpy()``,
    copies off or onto the device (``.cpu()``, ``.to(device)``, ``torch.tensor(...,
    device=)``), and boolean-mask indexing and ``nonzero`` (their output size is read
    back). On a GPU each waits for the device; in Triton's interpreter they are the same
    calls on CPU tensors, so the count is the same. Reading the host copy a counted copy
    made is not counted again, and a CPU generator's draw (``draw_offset``) is host-side.

    Use as a context manager; ``count`` and ``where`` (``"name at file:line"``) hold the result.
    """

    def __init__(self):
        self.count, self.where, self._undo, self._copies = 0, [], [], {}

    def _wrap(self, owner, name, check=None, copies=False):
        orig = getattr(owner, name)

        def wrapper(*args, **kwargs):
            caller = sys._getframe(1)
            code = caller.f_code
            counted = (code.co_filename.startswith(_COMM_DIR) and code.co_name != "draw_offset"
                       and not (args and id(args[0]) in self._copies)
                       and (check is None or check(*args, **kwargs)))
            if counted:
                self.count += 1
                self.where.append(f"{name} at {os.path.basename(code.co_filename)}:{caller.f_lineno}")
            out = orig(*args, **kwargs)
            if counted and copies and isinstance(out, torch.Tensor):
                self._copies[id(out)] = out  # held while counting, so the id stays unique
            return out

        setattr(owner, name, wrapper)
        self._undo.append((owner, name, orig))

    def __enter__(self) -> HostSyncCounter:
        T = torch.Tensor
        for name in ("item", "tolist", "__float__", "__int__", "__bool__", "__index__", "numpy", "nonzero"):
            self._wrap(T, name)
        self._wrap(T, "cpu", copies=True)
        self._wrap(T, "to", lambda *a, **kw: "device" in kw or any(isinstance(v, (str, torch.device)) for v in a[1:]),
                   copies=True)
        self._wrap(T, "__getitem__", lambda _self, index, *rest: any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (index if isinstance(index, tuple) else (index,))))
        self._wrap(torch, "nonzero")
        self._wrap(torch, "tensor", lambda *a, **kw: "device" in kw)
        return self

    def __exit__(self, *exc) -> None:
        for owner, name, orig in reversed(self._undo):
            setattr(owner, name, orig)
        self._undo.clear()
        self._copies.clear()


class XReadCounter:
    """Elements of ``x`` read while active: by Triton's interpreter (every masked-in load
    whose address is an element of ``x``) and by torch ops (``add_op_inputs``)."""

    def __init__(self, x: torch.Tensor):
        self.elements, self.kernel_loads_seen = 0, False
        self._start, self._step = x.data_ptr(), max(1, x.stride(0)) * x.element_size()
        self._end = self._start + max(0, x.numel() - 1) * self._step + x.element_size()
        self._storage = x.untyped_storage().data_ptr()
        self._undo = None

    def _count_addresses(self, addresses: np.ndarray, mask: np.ndarray) -> None:
        a = np.broadcast_to(addresses, mask.shape)[mask].astype(np.int64)
        hit = (a >= self._start) & (a < self._end) & ((a - self._start) % self._step == 0)
        self.elements += int(np.count_nonzero(hit))

    def add_op_inputs(self, func, args, out) -> None:
        for t in tree_leaves(args):
            if isinstance(t, torch.Tensor) and t.device.type != "meta" and t.numel() and \
                    t.untyped_storage().data_ptr() == self._storage:
                # a gather reads what it returns; any other op all of its input
                self.elements += out.numel() if func in _GATHERS else t.numel()

    def __enter__(self) -> XReadCounter:
        if os.environ.get("TRITON_INTERPRET") == "1":
            from triton.runtime import interpreter

            builder = interpreter.interpreter_builder
            orig = builder.create_masked_load

            def load(ptrs, mask, *rest):
                self.kernel_loads_seen = True
                self._count_addresses(ptrs.data, mask.data.astype(bool))
                return orig(ptrs, mask, *rest)

            builder.create_masked_load = load
            self._undo = lambda: delattr(builder, "create_masked_load")
        return self

    def __exit__(self, *exc) -> None:
        if self._undo is not None:
            self._undo()


class LaunchCounter(TorchDispatchMode):
    """Triton launches and non-view torch ops issued while active (torch ops inside a
    Triton launch are the interpreter's own and are skipped); see the module docstring."""

    def __init__(self, nbytes: int, reads: XReadCounter | None = None):
        super().__init__()
        self.nbytes, self.reads = nbytes, reads
        self.triton, self.torch_ops, self.full_size_ops, self.names = 0, 0, 0, []
        self._inside_kernel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not self._inside_kernel and not func.is_view:
            self.torch_ops += 1
            self.names.append(str(func))
            touched = (args, kwargs) if func in _ALLOCATIONS else (args, kwargs, out)  # an allocation touches nothing
            tensors = [t for t in tree_leaves(touched) if isinstance(t, torch.Tensor)]
            self.full_size_ops += any(t.numel() * t.element_size() >= self.nbytes for t in tensors)
            if self.reads is not None:
                self.reads.add_op_inputs(func, (args, kwargs), out)
        return out

    @property
    def launches(self) -> int:
        return self.triton + self.torch_ops

    @contextlib.contextmanager
    def kernels_counted(self):
        """Count every Triton launch (interpreted or compiled) while this is active."""
        import triton.runtime.interpreter as interpreter
        import triton.runtime.jit as jit

        undo = []
        for cls in (jit.JITFunction, interpreter.InterpretedFunction):
            orig = cls.run

            def run(fn_self, *args, _orig=orig, **kwargs):
                if not kwargs.get("warmup"):
                    self.triton += 1
                self._inside_kernel += 1
                try:
                    return _orig(fn_self, *args, **kwargs)
                finally:
                    self._inside_kernel -= 1

            cls.run = run
            undo.append((cls, orig))
        try:
            yield self
        finally:
            for cls, orig in undo:
                cls.run = orig


def mstopk_counts(x: torch.Tensor, k: int, kernel: str, generator: torch.Generator | None = None) -> dict:
    """One ``mstopk(x, k, kernel=kernel)`` call, instrumented; see the module docstring."""
    seen = {"candidates": None, "fine_bin": None}
    with contextlib.ExitStack() as stack:
        stack.enter_context(_candidates_seen(kernel, seen))
        reads = stack.enter_context(XReadCounter(x))
        launches = LaunchCounter(x.numel() * x.element_size(), reads)
        if kernel == "gpu":
            stack.enter_context(launches.kernels_counted())
        syncs = stack.enter_context(HostSyncCounter())
        with launches:
            mstopk(x, k, kernel=kernel, generator=generator)
    cand = seen["candidates"]
    blind = kernel == "gpu" and x.is_cuda  # compiled kernels' loads cannot be counted
    return dict(candidates=cand, candidates_per_k=cand / k if cand is not None else None,
                fine_bin=seen["fine_bin"], read_passes=None if blind else reads.elements / x.numel(),
                launches=launches.launches, triton_launches=launches.triton, full_size_ops=launches.full_size_ops,
                host_syncs=syncs.count)


@contextlib.contextmanager
def _candidates_seen(kernel: str, seen: dict):
    """Record the candidate count (and the fine bin) of the call into ``seen``."""
    if kernel == "gpu":
        import comm.topk.mstopk_triton as kernels

        orig = kernels.read_summary

        def summary(*args, **kwargs):
            s = orig(*args, **kwargs)
            seen["candidates"], seen["fine_bin"] = s.candidates, s.fine_bin
            return s

        kernels.read_summary = summary
        try:
            yield
        finally:
            kernels.read_summary = orig
        return
    import comm.topk.mstopk_torch as torch_path

    orig_scan = torch_path.scan

    def scan(xs, cut):
        s = orig_scan(xs, cut)
        if cut != float("inf"):
            seen["candidates"] = s.idx.numel()
        return s

    torch_path.scan = scan
    try:
        yield
    finally:
        torch_path.scan = orig_scan


def op_times_us(fn, calls: int, device: torch.device) -> dict[str, float]:
    """Microseconds per call of ``fn`` in each kernel (CUDA: device time, copies included)
    or each op (CPU: its own CPU time), largest first; ``fn`` runs once before, untimed."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    fn()
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            fn()
        if cuda:
            torch.cuda.synchronize(device)
    attr = "self_device_time_total" if cuda else "self_cpu_time_total"
    times = {e.key: getattr(e, attr, 0) / calls for e in prof.key_averages()}
    return {key: round(t, 1) for key, t in sorted(times.items(), key=lambda kv: -kv[1]) if t > 0}
