"""``cachepipe bench faults``: the launcher's processes, its stop signal and its run directory.

- ``launcher``: SIGTERM to ``cachepipe train`` itself after the third checkpoint; its
  ranks must end with it (``procs_left`` counts those that do not; NOTE [ranks end with
  their launcher] in ``trainer/launch.py``), and ``--resume`` finishes the run.
- ``other_out``: a run stopped at step 10 (``--stop-after-steps``) is resumed with
  another, finished run's directory as ``--out`` (NOTE [refusing a used --out] in
  ``trainer/run_dir.py``): that must be refused and leave the other run byte for byte as
  it was; resumed into its own directory it then finishes.
"""
from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

__all__ = ["other_out", "spawned_children", "stop_launcher"]


def spawned_children(pid: int) -> list[int]:
    """The multiprocessing children (ranks, loader workers) of process ``pid``, oldest first,
    without its resource tracker; a launcher's ranks are its fork server's children, so
    they are taken from there: only processes that ``pid`` (one of ours) started."""
    children = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            children += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    found, own = [], _cmdline(pid)
    for child in sorted(children):
        cmdline = _cmdline(child)
        if b"forkserver" in cmdline and b"forkserver" not in own:  # the launcher's fork server:
            found += spawned_children(child)  # its children are the ranks (NOTE [forked ranks])
        elif b"multiprocessing" in cmdline and b"resource_tracker" not in cmdline:
            found.append(child)
    return found


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def stop_launcher(bench, out: Path) -> tuple[int, bool]:
    """``launcher``: SIGTERM the job after the third checkpoint, then ``--resume`` it."""
    def inject(job) -> bool:
        if not (out / "checkpoints/gen3.npz").exists():
            return False
        os.kill(job.pid, signal.SIGTERM)  # our own job
        return True

    code, injected = bench.run(bench.train_argv(out), inject)
    if code != 128 + signal.SIGTERM:
        return code, injected
    code, _ = bench.run(bench.train_argv(out, None, None, "--resume", str(out)))
    return code, injected


def _snapshot(run: Path) -> dict:
    return {p.relative_to(run): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}


def other_out(bench, out: Path) -> tuple[int, bool]:
    """``other_out``: resume a stopped run into another run's ``--out`` (refused, that run
    untouched), then into its own. Exit 1 (and ``bench.log`` says so) when the other run
    changed, whatever the commands returned."""
    other = out.parent / "other-finished-run"
    shutil.copytree(out.parent / "baseline", other)  # a finished run that must stay as it is
    before = _snapshot(other)
    code, _ = bench.run(bench.train_argv(out, None, None, "--stop-after-steps", "10"))
    if code:
        return code, False
    refused, _ = bench.run(bench.train_argv(other, None, None, "--resume", str(out)))
    changed = _snapshot(other) != before
    code, _ = bench.run(bench.train_argv(out, None, None, "--resume", str(out)))
    if changed:
        bench.log = f"resuming {out} with --out {other} changed that run (exit {refused})"
        return 1, True
    return code, True
