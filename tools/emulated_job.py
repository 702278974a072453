"""Jobs on the emulated cluster: one Redis server per node, torchrun-style ranks, link counters.

:class:`tools.cluster.EmulatedCluster` builds the nodes and the rate-limited links; this
module puts a workload on them the way a real cluster runs it:

- :class:`NodeRedis`: a ``redis-server`` inside node ``i``'s namespace, bound to that
  node's address, so an L2 read of a sample held by another node crosses the limited link
  exactly as it would between two machines (persistence off, ``noeviction``).
- :func:`launch`: ``nodes x local_size`` processes, rank ``r`` inside node ``r // local_size``
  with torchrun's environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
  ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``MASTER_ADDR``/``MASTER_PORT`` on node 0,
  ``GLOO_SOCKET_IFNAME=eth0``). The first rank that fails stops the job (only processes
  started here are signalled, through their own handles). A rank that runs a module of
  this interpreter (``python -m ...``) is forked from a fork server that imported torch
  once (NOTE [forked emulated ranks] in tools/forked_command.py).
- :func:`parse_emulate`: the ``--emulate MxN@MBIT`` of every command that runs on the
  emulated cluster, one rule for all (NOTE [emulate flag]), and its links' ``--burst`` (:func:`burst_bytes`).
- :func:`node_servers`, :func:`warm_node`: a server on every node, and each node's
  ``cachepipe warmup`` of its L1 and its share of L2 (``redis_flags``: the ``--redis``
  flags naming every node's server, in node order).
- :func:`link_bytes`: bytes sent and received on each node's ``eth0`` (the kernel's
  counters): the ground truth of what crossed between nodes, gradients and samples alike.

Example:
    >>> with EmulatedCluster(nodes=2, inter_mbit=200) as cluster:        # doctest: +SKIP
    ...     servers = [NodeRedis(cluster, i, workdir / f"redis{i}") for i in range(2)]
    ...     before = link_bytes(cluster)
    ...     codes = launch(cluster, lambda rank: ["cachepipe", "train", ...], local_size=2)
    ...     sent = sum(b["tx"] for b in link_bytes(cluster)) - sum(b["tx"] for b in before)
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tools.cluster import EmulatedCluster
from tools.forked_command import ForkedCommand, forkable

__all__ = ["Emulation", "NodeRedis", "JobFailed", "burst_bytes", "launch", "link_bytes", "node_servers",
           "parse_emulate", "redis_flags", "run_on_node", "stop_child", "warm_node"]

REDIS_PORT = 6379
MAX_NODES = 250  # EmulatedCluster's limit: one address per node in a /24
_EMULATE = re.compile(r"(\d+)x(\d+)(?:@(\d+(?:\.\d+)?))?")


@dataclass(frozen=True)
class Emulation:
    """``nodes`` emulated nodes of ``local_size`` processes, ``mbit`` Mbit/s between nodes."""

    nodes: int
    local_size: int
    mbit: float


def parse_emulate(text: str, default_mbit: float | None = None) -> Emulation:
    """Parse ``--emulate MxN@MBIT``, e.g. ``2x2@10``.

    NOTE [emulate flag]: one rule for every command (``bench train``, ``bench loader``,
    ``bench overlap``): ``M`` nodes, 1 to 250 (:class:`EmulatedCluster`'s limit); ``N``
    processes per node, at least 1, and at least 2 processes in all (a job of one process
    crosses no link); ``MBIT`` Mbit/s between nodes, a positive number. ``@MBIT`` may be
    left out only where the command has a default rate (``default_mbit``); surrounding
    blanks are ignored.

    Args:
        text: the flag's value.
        default_mbit: the rate of ``MxN`` without ``@MBIT``; None: ``@MBIT`` is required.

    Raises:
        ValueError: one line naming ``--emulate``, its value and the rule it breaks.
    """
    m = _EMULATE.fullmatch(text.strip())
    if not m or (m[3] is None and default_mbit is None):
        raise ValueError(f"--emulate {text!r}: expected MxN@MBIT (M nodes x N processes each, MBIT Mbit/s "
                         "between nodes), e.g. 2x2@10")
    nodes, local, mbit = int(m[1]), int(m[2]), float(m[3]) if m[3] else float(default_mbit)
    if not 1 <= nodes <= MAX_NODES or local < 1 or nodes * local < 2:
        raise ValueError(f"--emulate {text!r}: need 1 <= M <= {MAX_NODES} nodes, N >= 1 processes each and at "
                         "least 2 processes in all")
    if mbit <= 0:
        raise ValueError(f"--emulate {text!r}: the link rate MBIT must be > 0")
    return Emulation(nodes, local, mbit)


def burst_bytes(kib: int | None) -> int | None:
    """``--burst KIB`` as the tbf bucket in bytes (None: the cluster's default, NOTE [tbf
    burst] in tools/cluster.py).

    Raises:
        ValueError: one line naming ``--burst``, for a bucket under one packet (2 KiB).
    """
    if kib is not None and kib < 2:
        raise ValueError(f"--burst {kib}: the tbf bucket must hold one packet: at least 2 KiB")
    return None if kib is None else kib * 1024


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


class NodeRedis:
    """A real ``redis-server`` inside one emulated node, reachable at :attr:`url` from every node.

    Args:
        cluster: a started :class:`EmulatedCluster`.
        node: the node that hosts the server.
        workdir: directory for its log (created).
        maxmemory: ``maxmemory`` of the server (Redis syntax, e.g. ``"2gb"``).
        port: TCP port on the node's address.
        timeout: seconds to wait for the server to answer.

    Raises:
        RuntimeError: the server did not come up (the message quotes its log).
    """

    def __init__(self, cluster: EmulatedCluster, node: int, workdir: str | os.PathLike, *,
                 maxmemory: str = "2gb", port: int = REDIS_PORT, timeout: float = 10.0) -> None:
        from cachepipe.server.redis_binary import find_redis_server, server_env

        self.cluster, self.node, self.port = cluster, node, port
        self.workdir = Path(workdir).absolute()  # redis-server chdirs into --dir: a relative --logfile would miss
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log = self.workdir / f"redis-node{node}.log"
        # Bound to the node's private address only; protected mode would refuse the other
        # nodes' clients (no password on an emulated, unreachable-from-outside network).
        argv = [find_redis_server(), "--bind", cluster.address(node), "--port", str(port),
                "--protected-mode", "no", "--save", "", "--appendonly", "no", "--maxmemory", maxmemory,
                "--maxmemory-policy", "noeviction", "--dir", str(self.workdir), "--logfile", str(self.log)]
        self.proc = subprocess.Popen(cluster.command(node, argv), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=server_env())
        deadline = time.monotonic() + timeout
        while not self._answers():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                log = self.log.read_text()[-500:] if self.log.exists() else "(no log)"
                raise RuntimeError(f"redis-server on node {node} ({self.url}) did not start: {log}")
            time.sleep(0.05)

    @property
    def url(self) -> str:
        return f"redis://{self.cluster.address(self.node)}:{self.port}/0"

    def _answers(self) -> bool:
        probe = ("import redis,sys; sys.exit(0 if redis.Redis.from_url(sys.argv[1], socket_timeout=1)"
                 ".ping() else 1)")
        return run_on_node(self.cluster, self.node, [sys.executable, "-c", probe, self.url]).returncode == 0

    def stop(self) -> None:
        """Stop the server (our own child process: terminate, then kill after 10 s)."""
        stop_child(self.proc)

    def __enter__(self) -> "NodeRedis":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


@contextlib.contextmanager
def node_servers(cluster: EmulatedCluster, workdirs: Sequence[str | os.PathLike], **kwargs) -> Iterator[list[NodeRedis]]:
    """One :class:`NodeRedis` per node (node ``i`` logs in ``workdirs[i]``; ``kwargs`` as
    there), every one stopped on the way out."""
    servers: list[NodeRedis] = []
    try:
        for node, workdir in enumerate(workdirs):
            servers.append(NodeRedis(cluster, node, workdir, **kwargs))
        yield servers
    finally:
        for server in servers:
            server.stop()


def redis_flags(urls: Sequence[str]) -> list[str]:
    """``--redis URL`` for every shard, in node order, for a ``cachepipe`` command's argv."""
    return [word for url in urls for word in ("--redis", url)]


def warm_node(cluster: EmulatedCluster, node: int, root: str | os.PathLike, cache_dir: str | os.PathLike,
              urls: Sequence[str], cache_size: int, *extra: str, timeout: float = 1800.0) -> None:
    """Run ``cachepipe warmup`` inside ``node``: its own L1 in ``cache_dir`` and its share of
    L2 (``--node-rank node --num-nodes``, the shards ``urls``), as on a real cluster.

    Raises:
        RuntimeError: the warm-up failed (the message ends with its last output).
    """
    argv = [sys.executable, "-m", "tools", "warmup", str(root), "--cache-dir", str(cache_dir), "--cache-size",
            str(cache_size), "--node-rank", str(node), "--num-nodes", str(cluster.nodes), *extra, *redis_flags(urls)]
    done = run_on_node(cluster, node, argv, timeout=timeout)
    if done.returncode:
        raise RuntimeError(f"warm-up of {root} on node {node} failed: {(done.stderr or done.stdout).strip()[-500:]}")


def run_on_node(cluster: EmulatedCluster, node: int, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
                timeout: float | None = None, **kwargs) -> subprocess.CompletedProcess:
    """Run ``argv`` to completion inside node ``node`` (output captured as text unless redirected)."""
    kwargs.setdefault("capture_output", "stdout" not in kwargs and "stderr" not in kwargs)
    return subprocess.run(cluster.command(node, list(argv)), env=_env(env), timeout=timeout, text=True, **kwargs)


def _env(extra: Mapping[str, str] | None) -> dict[str, str]:
    # c10d warns about unresolvable hostnames in namespaces; those lines are noise here
    return dict(os.environ, TORCH_CPP_LOG_LEVEL="ERROR", **(extra or {}))


def launch(cluster: EmulatedCluster | None, argv_for_rank: Callable[[int], Sequence[str]], *, local_size: int,
           nodes: int | None = None, port: int = 29500, env: Mapping[str, str] | None = None,
           timeout: float | None = None, log_dir: str | os.PathLike | None = None, fork: bool = True) -> list[int]:
    """Run one rank per process, ``local_size`` per node, and wait for all of them.

    Args:
        cluster: a started :class:`EmulatedCluster`, or None to run every rank on this
            host's loopback (no namespaces, no rate limit; for machines without root).
        argv_for_rank: the command of each rank (e.g. ``cachepipe train ...``).
        local_size: ranks per node; the world size is ``nodes * local_size``.
        nodes: number of nodes (default: the cluster's; required without a cluster).
        port: rendezvous port on node 0's address.
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
                                              stderr=subprocess.STDOUT if out else None))
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
