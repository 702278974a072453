"""Ranks of a benchmark: the command that starts one, and the entry every rank module shares.

NOTE [benchmark ranks]: a benchmark that measures a job of ranks writes what the ranks
need as one JSON spec (:func:`rank_argv`), and each rank runs ``python -m
tools.bench.ranks.NAME SPEC`` under :func:`tools.bench.harness.jobs.launch`, which gives it
torchrun's environment. The rank module's ``main`` is :func:`run_rank` around a function
of the spec: it sets the torch threads (one: ranks share the machine's cores), joins the
gloo group from the environment, runs the function, writes its result (rank 0's, or with
``per_rank`` every rank's as ``rank<R>.json``) to the spec's ``out``, and leaves the group
whatever happened.
"""
from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

__all__ = ["rank_argv", "read_rank_results", "run_rank"]


def rank_argv(module: str, spec: dict, workdir: str | os.PathLike) -> list[str]:
    """Write ``spec`` (with ``out``: ``workdir`` / ``result.json``, or ``workdir`` for
    per-rank results) to ``workdir/spec.json``; the command of every rank of the job."""
    workdir = Path(workdir).absolute()
    workdir.mkdir(parents=True, exist_ok=True)
    spec = dict(spec, out=str(workdir / "result.json"), workdir=str(workdir))
    (workdir / "spec.json").write_text(json.dumps(spec))
    return [sys.executable, "-m", module, str(workdir / "spec.json")]


def read_rank_results(workdir: str | os.PathLike, per_rank: bool = False) -> dict | list[dict]:
    """What the ranks of a job wrote: rank 0's result, or every rank's in rank order."""
    workdir = Path(workdir)
    if not per_rank:
        return json.loads((workdir / "result.json").read_text())
    files = sorted(workdir.glob("rank*.json"), key=lambda p: int(p.stem[4:]))
    return [json.loads(p.read_text()) for p in files]


def run_rank(body: Callable[[dict], object], argv: list[str] | None = None, *, per_rank: bool = False,
             setup: Callable[[dict], None] | None = None, group_timeout_min: float = 30.0) -> int:
    """The ``main`` of a rank module (NOTE [benchmark ranks]).

    Args:
        body: the rank's work, a function of the spec; returns a JSON-able result.
        argv: ``[SPEC]`` (default: ``sys.argv[1:]``).
        per_rank: every rank writes its result (default: rank 0's only).
        setup: run on the spec before torch is imported (e.g. an address-space limit).
        group_timeout_min: the gloo group's timeout.

    Returns:
        0 (a failure raises, so the job sees a failed rank).
    """
    argv = sys.argv[1:] if argv is None else argv
    spec = json.loads(Path(argv[0]).read_text())
    if setup is not None:
        setup(spec)
    import torch
    import torch.distributed as dist

    from trainer.atomic_file import write_atomic

    torch.set_num_threads(int(spec.get("threads", 1)))
    dist.init_process_group("gloo", timeout=timedelta(minutes=group_timeout_min))
    try:
        result = body(spec)
        rank = dist.get_rank()
        if per_rank:
            write_atomic(Path(spec["workdir"]) / f"rank{rank}.json", json.dumps(result))
        elif rank == 0:
            write_atomic(spec["out"], json.dumps(result))
    finally:
        dist.destroy_process_group()
    return 0
