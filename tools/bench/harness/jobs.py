"""Jobs of ranks, on the emulated cluster or on this host's loopback, and the link counters.

- :func:`launch`: ``nodes x local_size`` processes, rank ``r`` inside node ``r // local_size``
  with torchrun's environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
  ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``MASTER_ADDR``/``MASTER_PORT`` on node 0,
  ``GLOO_SOCKET_IFNAME``). The first rank that fails stops the job (only processes started
  here are signalled, through their own handles); every rank ends with this process, even
  when it is killed with SIGKILL (a parent-death signal, and a forked rank's launcher watch). A rank that runs a module of this
  interpreter (``python -m ...``) is forked from a fork server that imported torch once
  (NOTE [forked emulated ranks] in tools/forked_command.py).
- :func:`run_on_node`: one command to completion inside a node.
- :func:`link_bytes`: bytes sent and received on each node's ``eth0`` (the kernel's
  counters): the ground truth of what crossed between nodes, gradients and samples alike.

Example:
    >>> with EmulatedCluster(nodes=2, inter_mbit=200) as cluster:        # doctest: +SKIP
    ...     before = link_bytes(cluster)
    ...     codes = launch(cluster, lambda rank: [sys.executable, "-m", ...], local_size=2)
    ...     sent = sum(b["tx"] for b in link_bytes(cluster)) - sum(b["tx"] for b in before)
"""
from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from cachepipe.server.process import die_with_parent
from tools.bench.harness.cluster import EmulatedCluster
from tools.forked_command import ForkedCommand, forkable

__all__ = ["JobFailed", "launch", "link_bytes", "run_on_node", "stop_child"]

RENDEZVOUS_PORT = 29500  # on node 0's address: a fresh namespace has every port free


class JobFailed(RuntimeError):
    """A rank of an emulated job failed or the job timed out; the message names the rank and its log."""


def stop_child(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    """Stop a child process this program started: terminate, then kill after ``timeout`` s."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run_on_node(cluster: EmulatedCluster, node: int, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
                timeout: float | None = None, **kwargs) -> subprocess.CompletedProcess:
    """Run ``argv`` to completion inside node ``node`` (output captured as text unless redirected)."""
    kwargs.setdefault("capture_output", "stdout" not in kwargs and "stderr" not in kwargs)
    kwargs.setdefault("preexec_fn", die_with_parent())  # it ends with this process (a SIGKILLed bench)
    return subprocess.run(cluster.command(node, list(argv)), env=_env(env), timeout=timeout, text=True, **kwargs)


def _env(extra: Mapping[str, str] | None) -> dict[str, str]:
    # c10d warns about unresolvable hostnames in namespaces; those lines are noise here
    return dict(os.environ, TORCH_CPP_LOG_LEVEL="ERROR", **(extra or {}))


def launch(cluster: EmulatedCluster | None, argv_for_rank: Callable[[int], Sequence[str]], *, local_size: int,
           nodes: int | None = None, port: int | None = None, env: Mapping[str, str] | None = None,
           timeout: float | None = None, log_dir: str | os.PathLike | None = None, fork: bool = True) -> list[int]:
    """Run one rank per process, ``local_size`` per node, and wait for all of them.

    Args:
        cluster: a started :class:`EmulatedCluster`, or None to run every rank on this
            host's loopback (no namespaces, no rate limit; for machines without root).
        argv_for_rank: the command of each rank (e.g. ``cachepipe train ...``).
        local_size: ranks per node; the world size is ``nodes * local_size``.
        nodes: number of nodes (default: the cluster's; required without a cluster).
        port: rendezvous port on node 0's address (default: 29500 in a cluster, a free
            one on loopback).
        env: extra environment for every rank.
        timeout: seconds before the whole job is stopped; None = no limit.
        log_dir: each rank's stdout+stderr go to ``rank<R>.log`` there; None = inherited.
        fork: fork a rank that runs ``python -m MODULE`` from the fork server (NOTE [forked
            emulated ranks]); False: every rank is a new interpreter, as a measurement of a
            process's own memory needs.

    Returns:
        The exit status of every rank (all 0 on success).

    Raises:
        JobFailed: a rank exited non-zero (the others are stopped) or the job timed out.
        ValueError: for ``local_size < 1`` or a missing node count.
    """
    nodes = cluster.nodes if cluster is not None else nodes
    if local_size < 1 or not nodes or nodes < 1:
        raise ValueError(f"need local_size >= 1 and nodes >= 1, got {local_size=}, {nodes=}")
    world = nodes * local_size
    if port is None:
        from trainer.launch import free_port

        port = RENDEZVOUS_PORT if cluster is not None else free_port()
    logs = Path(log_dir) if log_dir is not None else None
    if logs is not None:
        logs.mkdir(parents=True, exist_ok=True)
    procs: list[subprocess.Popen | ForkedCommand] = []
    files = []
    try:
        for rank in range(world):
            node = rank // local_size
            where = cluster.env(node) if cluster else {"GLOO_SOCKET_IFNAME": "lo", "MASTER_ADDR": "127.0.0.1"}
            rank_env = dict(env or {}, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank % local_size),
                            LOCAL_WORLD_SIZE=str(local_size), GROUP_RANK=str(node), MASTER_PORT=str(port), **where)
            argv = list(argv_for_rank(rank))
            out = None
            if logs is not None:
                out = open(logs / f"rank{rank}.log", "w")
                files.append(out)
            if fork and forkable(argv):  # NOTE [forked emulated ranks] in tools/forked_command.py
                procs.append(ForkedCommand(argv, env=_env(rank_env), netns=cluster.namespaces[node] if cluster else None,
                                           stdout=out, stderr=out))
            else:
                procs.append(subprocess.Popen(cluster.command(node, argv) if cluster else argv, env=_env(rank_env),
                                              stdin=subprocess.DEVNULL, stdout=out,
                                              stderr=subprocess.STDOUT if out else None,
                                              preexec_fn=die_with_parent()))
        deadline = None if timeout is None else time.monotonic() + timeout
        while any(p.poll() is None for p in procs):
            failed = [r for r, p in enumerate(procs) if p.poll() not in (None, 0)]
            if failed:
                raise JobFailed(f"rank {failed[0]} exited with status {procs[failed[0]].returncode}"
                                + (f"; see {logs / f'rank{failed[0]}.log'}" if logs else ""))
            if deadline is not None and time.monotonic() > deadline:
                raise JobFailed(f"job still running after {timeout:.0f} s; stopped")
            time.sleep(0.1)
        codes = [p.returncode for p in procs]
        if any(codes):
            bad = next(r for r, c in enumerate(codes) if c)
            raise JobFailed(f"rank {bad} exited with status {codes[bad]}"
                            + (f"; see {logs / f'rank{bad}.log'}" if logs else ""))
        return codes
    finally:
        for p in procs:  # only the processes started here, by their own handles
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for f in files:
            f.close()


def link_bytes(cluster: EmulatedCluster) -> list[dict[str, int]]:
    """``[{"tx": bytes, "rx": bytes}, ...]``: what each node's ``eth0`` has sent and received so far."""
    out = []
    for ns in cluster.namespaces:
        proc = subprocess.run(["ip", "-n", ns, "-s", "-j", "link", "show", "eth0"], capture_output=True, text=True)
        if proc.returncode:
            raise RuntimeError(f"cannot read the link counters of {ns}: {proc.stderr.strip()}")
        stats = json.loads(proc.stdout)[0]["stats64"]
        out.append({"tx": int(stats["tx"]["bytes"]), "rx": int(stats["rx"]["bytes"])})
    return out
