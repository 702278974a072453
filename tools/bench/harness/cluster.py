"""An emulated cluster on one machine: network namespaces as nodes, a rate-limited link.

``EmulatedCluster(nodes=M, inter_mbit=R)`` creates a "switch" namespace holding a bridge
and ``M`` node namespaces, each joined to the bridge by a veth pair whose node end is
``eth0`` with address ``10.77.0.<i+1>/24`` and an egress ``tc tbf`` limit of ``R`` Mbit/s.
Workers started with :meth:`EmulatedCluster.command` run inside a node: traffic between
two workers of one node stays on that namespace's loopback (fast), traffic between
nodes crosses the limited veth. Nothing touches the host's own namespace or addresses.

Needs root and iproute2 (``apt-get install -y iproute2``). The namespaces are removed on
exit, on exceptions, and on SIGINT/SIGTERM (see :meth:`EmulatedCluster.close`), and by a
watcher when the process that made them is killed with SIGKILL (NOTE [namespaces end with
their owner] in ``netns_watch.py``).

Example:
    >>> with EmulatedCluster(nodes=2, inter_mbit=200) as cluster:     # doctest: +SKIP
    ...     subprocess.run(cluster.command(1, ["ping", "-c1", cluster.address(0)]))
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator

from tools.bench.harness import netns_watch
from tools.bench.harness.netns_watch import stale, start_time

__all__ = ["EmulatedCluster", "maybe_cluster", "netns_unavailable_reason", "require_netns"]

SUBNET = "10.77.0"


def netns_unavailable_reason() -> str | None:
    """Why namespaces cannot be built here (None when they can): root and ``ip``/``tc``."""
    if os.geteuid() != 0:
        return "network namespaces need root (run as root, e.g. in a container or with sudo)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` not found: apt-get install -y iproute2"
    name = f"cpprobe{uuid.uuid4().hex[:6]}"
    probe = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if probe.returncode:
        return f"`ip netns add` failed: {probe.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return None


def require_netns(flag: str = "--emulate") -> None:
    """Refuse ``flag`` where namespaces cannot be built.

    Raises:
        ValueError: one line naming ``flag`` and :func:`netns_unavailable_reason`'s reason.
    """
    reason = netns_unavailable_reason()
    if reason:
        raise ValueError(f"{flag} needs network namespaces: {reason}")


def _ip(*args: str) -> None:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"`ip {' '.join(args)}` failed: {proc.stderr.strip()}")


class EmulatedCluster:
    """``nodes`` network namespaces joined through a bridge, inter-node egress limited.

    Args:
        nodes: number of node namespaces (1..250).
        inter_mbit: egress rate of every node's link in Mbit/s; None: unlimited.
        tag: short unique tag in namespace/interface names (default: random).
        burst_bytes: tbf bucket size, at least 2048; None: NOTE [tbf burst]. Benchmarks
            of small messages pass a smaller bucket so that each message pays the link rate.

    Raises:
        ValueError: for a bad node count or rate.
        RuntimeError: when a namespace command fails (already cleaned up).
    """

    def __init__(self, nodes: int, inter_mbit: float | None = None, *, tag: str | None = None,
                 burst_bytes: int | None = None):
        if not 1 <= nodes <= 250:
            raise ValueError(f"nodes must be in 1..250, got {nodes}")
        if inter_mbit is not None and inter_mbit <= 0:
            raise ValueError(f"inter_mbit must be > 0, got {inter_mbit}")
        if burst_bytes is not None and burst_bytes < 2048:
            raise ValueError(f"burst_bytes must be >= 2048 (one MTU-sized packet), got {burst_bytes}")
        self.nodes, self.inter_mbit, self.burst_bytes = nodes, inter_mbit, burst_bytes
        self.tag = tag or uuid.uuid4().hex[:5]
        if not re.fullmatch(r"[0-9a-z]+", self.tag):
            raise ValueError(f"a cluster tag is lower-case letters and digits, got {self.tag!r}")
        owner = f"cp-{os.getpid()}-{start_time(os.getpid())}-{self.tag}"  # NOTE [namespaces end with their owner]
        self.switch = f"{owner}-sw"
        self.namespaces = [f"{owner}-n{i}" for i in range(nodes)]
        self._created: list[str] = []
        self._old_handlers: dict[int, object] = {}

    def address(self, node: int) -> str:
        """The address of node ``node`` (inside its namespace)."""
        return f"{SUBNET}.{node + 1}"

    def command(self, node: int, argv: list[str]) -> list[str]:
        """``argv`` wrapped to run inside node ``node``'s namespace."""
        return ["ip", "netns", "exec", self.namespaces[node], *argv]

    def env(self, node: int) -> dict[str, str]:
        """Environment for a gloo worker on ``node``: bound to the node's link, rank 0 on node 0."""
        return {"GLOO_SOCKET_IFNAME": "eth0", "MASTER_ADDR": self.address(0)}

    def start(self) -> "EmulatedCluster":
        """Create the namespaces, links and limits (cleans up if anything fails); first delete
        those of clusters whose process is gone (NOTE [namespaces end with their owner])."""
        for name in stale():
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
        self._install_signal_handlers()
        try:
            self._add_ns(self.switch)
            _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.switch, "link", "set", "br0", "up")
            for i, ns in enumerate(self.namespaces):
                self._add_ns(ns)
                _ip("-n", ns, "link", "set", "lo", "up")
                peer = f"v{i}"
                _ip("-n", self.switch, "link", "add", peer, "type", "veth", "peer", "name", f"v{i}n")
                _ip("-n", self.switch, "link", "set", f"v{i}n", "netns", ns)
                _ip("-n", ns, "link", "set", f"v{i}n", "name", "eth0")
                _ip("-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", "eth0")
                _ip("-n", ns, "link", "set", "eth0", "up")
                _ip("-n", self.switch, "link", "set", peer, "master", "br0")
                _ip("-n", self.switch, "link", "set", peer, "up")
                if self.inter_mbit is not None:
                    self._limit(ns)
            subprocess.run([sys.executable, "-I", "-S", netns_watch.__file__, str(os.getpid()),
                            str(start_time(os.getpid())), *self._created], stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, timeout=30)
        except BaseException:
            self.close()
            raise
        return self

    def _add_ns(self, ns: str) -> None:
        _ip("netns", "add", ns)
        self._created.append(ns)

    def _limit(self, ns: str) -> None:
        # NOTE [tbf burst]: veth hands tbf GSO packets of up to 64 KiB; a bucket smaller
        # than one such packet drops it forever, so the burst is at least 256 KiB. That
        # lets a message under 256 KiB cross at line rate; benchmarks of small messages
        # (OMGS groups, ``bench overlap --burst``) pass ``burst_bytes`` (32 KiB for OMGS,
        # measured to limit correctly). An idle link refills the bucket, so its first
        # ``burst`` bytes cross at once: a real link has no such credit, and a bucket
        # near the size of a sparse exchange hides most of it. The old rule that a
        # bucket must hold rate / HZ bytes dates from jiffies timers; tbf keeps its
        # tokens in nanoseconds (high-resolution timers), and on the kernel of
        # docs/benchmarks/history/overlap.md (HZ 250) a 2 KiB bucket gave 9.5 of 10 and 92 of 100
        # Mbit/s of TCP payload, as 16 and 64 KiB buckets did (bulk TCP, GSO on: no
        # packet was lost for good there, tbf splits a GSO packet larger than its bucket).
        rate_bytes = self.inter_mbit * 1e6 / 8
        burst = self.burst_bytes or max(256 * 1024, int(rate_bytes / 100))
        cmd = ["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "eth0", "root", "tbf",
               "rate", f"{self.inter_mbit}mbit", "burst", str(burst), "latency", "200ms"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode:
            raise RuntimeError(f"`{' '.join(cmd)}` failed: {proc.stderr.strip()}")

    def close(self) -> None:
        """Delete every namespace this cluster created (their veths go with them)."""
        while self._created:
            subprocess.run(["ip", "netns", "del", self._created.pop()], capture_output=True)
        for sig, handler in self._old_handlers.items():
            signal.signal(sig, handler)
        self._old_handlers.clear()

    def _install_signal_handlers(self) -> None:
        def handler(signum, frame):
            raise KeyboardInterrupt(f"signal {signum}")  # unwinds through finally / __exit__

        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            try:
                self._old_handlers[sig] = signal.signal(sig, handler)
            except ValueError:  # not the main thread: rely on try/finally only
                pass

    def __enter__(self) -> "EmulatedCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


@contextlib.contextmanager
def maybe_cluster(emulation, tag: str) -> Iterator[EmulatedCluster | None]:
    """The started cluster of an :class:`~tools.bench.harness.emulate.Emulation` (tag
    ``tag`` plus a random part in its names), or None when it runs on loopback."""
    if emulation.mbit is None:
        yield None
        return
    with EmulatedCluster(emulation.nodes, emulation.mbit, tag=f"{tag}{uuid.uuid4().hex[:3]}",
                         burst_bytes=emulation.burst) as cluster:
        yield cluster
