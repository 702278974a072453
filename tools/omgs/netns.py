"""An emulated cluster on one machine: one network namespace per node, joined by a veth
pair whose both ends are rate-limited by ``tc tbf``; workers of a node share its
namespace (their traffic to each other stays on the node). Needs root and iproute2.

NOTE [emulated cluster]
Two nodes only (one veth pair). Node n has address ``10.<net>.0.<n+1>`` on interface
``<prefix>v<n>``; the workers of node n run under ``ip netns exec <prefix><n>`` with
``GLOO_SOCKET_IFNAME`` set to that interface. Without root (or with ``--no-netns``) the
benchmark falls back to all workers on loopback with no rate limit, and says so.
"""
from __future__ import annotations

import os
import subprocess

__all__ = ["EmulatedCluster", "netns_available"]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def netns_available() -> bool:
    """True when we are root and ``ip`` and ``tc`` exist."""
    from shutil import which
    return os.geteuid() == 0 and which("ip") is not None and which("tc") is not None


class EmulatedCluster:
    """Context manager that builds (and always removes) a two-node namespace cluster.

    Args:
        rate_mbit: inter-node bandwidth in Mbit/s, each direction (default 200).
        prefix: name prefix of the namespaces and interfaces (default ``"omgs"``).
        net: second octet of the 10.x.0.0/24 subnet (default 211).

    Raises:
        RuntimeError: when not run as root, or when ``ip``/``tc`` fail.
    """

    def __init__(self, rate_mbit: float = 200.0, prefix: str = "omgs", net: int = 211):
        if not netns_available():
            raise RuntimeError("network namespaces need root and iproute2 (ip, tc)")
        self.rate_mbit, self.prefix, self.net = rate_mbit, prefix, net
        self.namespaces = [f"{prefix}{n}" for n in range(2)]
        self.interfaces = [f"{prefix}v{n}" for n in range(2)]
        self.addresses = [f"10.{net}.0.{n + 1}" for n in range(2)]

    def __enter__(self) -> "EmulatedCluster":
        self._teardown()
        try:
            for ns in self.namespaces:
                _ip("netns", "add", ns)
                _ip("-n", ns, "link", "set", "lo", "up")
            _ip("link", "add", self.interfaces[0], "type", "veth", "peer", "name", self.interfaces[1])
            for ns, dev, addr in zip(self.namespaces, self.interfaces, self.addresses):
                _ip("link", "set", dev, "netns", ns)
                _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
                _ip("-n", ns, "link", "set", dev, "up")
                subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf",
                                "rate", f"{self.rate_mbit}mbit", "burst", "32kb", "latency", "50ms"],
                               check=True, capture_output=True, text=True)
        except subprocess.CalledProcessError as exc:
            self._teardown()
            raise RuntimeError(f"building the emulated cluster failed: {exc.stderr.strip()}") from exc
        return self

    def __exit__(self, *exc) -> None:
        self._teardown()

    def _teardown(self) -> None:
        for ns in self.namespaces:  # deleting a namespace deletes its veth end (and the pair)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)

    def command(self, node: int, argv: list[str]) -> list[str]:
        """``argv`` wrapped to run inside node ``node``'s namespace."""
        return ["ip", "netns", "exec", self.namespaces[node], *argv]

    def env(self, node: int) -> dict[str, str]:
        """Environment for a worker on ``node``: gloo bound to the node's interface."""
        return {"GLOO_SOCKET_IFNAME": self.interfaces[node], "MASTER_ADDR": self.addresses[0]}
