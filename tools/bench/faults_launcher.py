"""``cachepipe bench faults``: the launcher's processes, its stop signal and its run directory.

- :class:`ProcessWatch` records, while a job runs, the processes it spawned (its ranks
  and their DataLoader workers) by pid and start time; after the job it counts those
  still alive (``procs_left``; NOTE [ranks end with their launcher] in
  ``trainer/launch.py``) and kills them: they are this benchmark's own.
- ``launcher``: SIGTERM to ``cachepipe train`` itself after the third checkpoint; its
  ranks must end with it, and ``--resume`` finishes the run.
- ``other_out``: a run stopped at step 10 (``--stop-after-steps``) is resumed with
  another, finished run's directory as ``--out`` (NOTE [refusing a used --out] in
  ``trainer/run_dir.py``): that must be refused and leave the other run byte for byte as
  it was; resumed into its own directory it then finishes.
"""
from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path

__all__ = ["ProcessWatch", "other_out", "spawned_children", "stop_launcher"]


def spawned_children(pid: int) -> list[int]:
    """The multiprocessing children (ranks, loader workers) of process ``pid``, oldest first,
    without its resource tracker: only processes that ``pid`` (one of ours) started."""
    children = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            children += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    found = []
    for child in sorted(children):
        try:
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            continue
        if b"multiprocessing" in cmdline and b"resource_tracker" not in cmdline:
            found.append(child)
    return found


def _start_time(pid: int) -> int | None:
    """``pid``'s start time (clock ticks since boot), None when it is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2:].split()
    return None if fields[0] == b"Z" else int(fields[19])


class ProcessWatch:
    """The processes a job spawned, proven ours by pid and start time."""

    def __init__(self) -> None:
        self.seen: dict[int, int] = {}

    def poll(self, job_pid: int) -> None:
        """Record the job's ranks and their loader workers as they are now."""
        try:
            for rank in spawned_children(job_pid):
                for pid in (rank, *spawned_children(rank)):
                    self.seen.setdefault(pid, _start_time(pid))
        except OSError:  # the job ended meanwhile
            pass

    def alive(self) -> list[int]:
        return [pid for pid, start in self.seen.items() if start is not None and _start_time(pid) == start]

    def leftovers(self, grace: float = 10.0) -> int:
        """After the job: how many of its processes outlived it by ``grace`` seconds (each is
        then killed: they are ours)."""
        deadline = time.monotonic() + grace
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        left = self.alive()
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        return len(left)


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
