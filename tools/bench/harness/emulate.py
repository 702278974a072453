"""The cluster flags of every benchmark that runs ranks: ``--emulate MxN[@MBIT]``,
``--burst KIB``, ``--job-timeout S`` (and ``--loopback`` where it runs without namespaces).

NOTE [emulate flag]: one rule for every benchmark: ``M`` nodes, 1 to 250 (the emulated
cluster's limit: one address each in a /24), ``N`` processes per node, at least 1, and at
least 2 processes in all (a job of one process crosses no link); ``MBIT`` Mbit/s between
nodes, a positive number. Without ``@MBIT`` a benchmark takes its own default rate (its
help says which), or, for one whose question is not the link (``bench memory``), runs the
ranks on this host's loopback with no namespaces. Surrounding blanks are ignored.
Nodes are network namespaces joined by ``tc tbf``-limited veth links
(``tools.bench.harness.cluster``); that needs root and iproute2, and a benchmark that can
answer its question without a slow link (``bench comm``, ``bench omgs``) offers
``--loopback`` and falls back to it, with a warning, where namespaces cannot be built.
"""
from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass

from tools.cli import UsageError

__all__ = ["ClusterFlags", "Emulation", "MAX_NODES", "add_cluster_flags", "burst_bytes", "emulation_from_args",
           "parse_emulate"]

MAX_NODES = 250
_EMULATE = re.compile(r"(\d+)x(\d+)(?:@(\d+(?:\.\d+)?))?")


@dataclass(frozen=True)
class ClusterFlags:
    """How a benchmark takes the cluster flags (its registry entry holds one).

    Attributes:
        default: ``--emulate``'s default (``"2x2@200"``); None: the flag is a mode switch,
            off unless given (``bench train``, ``bench loader``).
        rate: Mbit/s of ``MxN`` given without ``@MBIT``; None: such a job runs on loopback.
        timeout: ``--job-timeout``'s default, seconds.
        burst_kib: ``--burst``'s default (None: NOTE [tbf burst]).
        loopback: offer ``--loopback``, and fall back to it where namespaces cannot be built.
    """

    default: str | None
    rate: float | None
    timeout: float = 1800.0
    burst_kib: int | None = None
    loopback: bool = False


@dataclass(frozen=True)
class Emulation:
    """``nodes`` emulated nodes of ``local_size`` processes; ``mbit`` Mbit/s between them
    (None: all on this host's loopback, no namespaces); ``burst`` the tbf bucket in bytes
    (None: the cluster's default); ``timeout`` seconds a job may run."""

    nodes: int
    local_size: int
    mbit: float | None
    burst: int | None = None
    timeout: float = 1800.0

    @property
    def world(self) -> int:
        return self.nodes * self.local_size

    def describe(self) -> str:
        """``2x2 @ 200 Mbit/s`` (with the tbf bucket when set), or ``2x2 on loopback``."""
        shape = f"{self.nodes}x{self.local_size}"
        if self.mbit is None:
            return f"{shape} on loopback (no rate limit)"
        return f"{shape} @ {self.mbit:g} Mbit/s" + (f" (tbf burst {self.burst // 1024} KiB)" if self.burst else "")


def parse_emulate(text: str, default_mbit: float | None = None) -> Emulation:
    """Parse ``--emulate MxN[@MBIT]`` (NOTE [emulate flag]), e.g. ``2x2@10``.

    Args:
        text: the flag's value.
        default_mbit: the rate of ``MxN`` without ``@MBIT``; None: loopback.

    Raises:
        ValueError: one line naming ``--emulate``, its value and the rule it breaks.
    """
    m = _EMULATE.fullmatch(text.strip())
    if not m:
        raise ValueError(f"--emulate {text!r}: expected MxN[@MBIT] (M nodes x N processes each, MBIT Mbit/s "
                         "between nodes), e.g. 2x2@10")
    nodes, local = int(m[1]), int(m[2])
    mbit = float(m[3]) if m[3] else default_mbit
    if not 1 <= nodes <= MAX_NODES or local < 1 or nodes * local < 2:
        raise ValueError(f"--emulate {text!r}: need 1 <= M <= {MAX_NODES} nodes, N >= 1 processes each and at "
                         "least 2 processes in all")
    if mbit is not None and mbit <= 0:
        raise ValueError(f"--emulate {text!r}: the link rate MBIT must be > 0")
    return Emulation(nodes, local, mbit)


def burst_bytes(kib: int | None) -> int | None:
    """``--burst KIB`` as the tbf bucket in bytes (None: the cluster's default, NOTE [tbf
    burst] in tools/bench/harness/cluster.py).

    Raises:
        ValueError: one line naming ``--burst``, for a bucket under one packet (2 KiB).
    """
    if kib is not None and kib < 2:
        raise ValueError(f"--burst {kib}: the tbf bucket must hold one packet: at least 2 KiB")
    return None if kib is None else kib * 1024


def add_cluster_flags(parser: argparse.ArgumentParser, flags: ClusterFlags) -> None:
    """Add the cluster flags of NOTE [emulate flag] to a benchmark's parser."""
    group = parser.add_argument_group("emulated cluster (network namespaces; needs root and iproute2)")
    rate = f"without @MBIT: {flags.rate:g} Mbit/s" if flags.rate else "without @MBIT: on loopback, no namespaces"
    what = f"default: {flags.default}" if flags.default else "default: off"
    group.add_argument("--emulate", default=flags.default, metavar="MxN[@MBIT]",
                       help=f"M nodes x N processes each, MBIT Mbit/s between nodes ({what}; {rate})")
    group.add_argument("--burst", type=int, default=flags.burst_kib, metavar="KIB",
                       help="tbf bucket of the emulated links in KiB, at least 2 (default: "
                            + (f"{flags.burst_kib}" if flags.burst_kib else "256 KiB or more, NOTE [tbf burst]")
                            + "); a smaller one makes a small exchange pay the link rate")
    group.add_argument("--job-timeout", type=float, default=flags.timeout, metavar="S",
                       help=f"seconds before a job of ranks is stopped (default: {flags.timeout:g})")
    if flags.loopback:
        group.add_argument("--loopback", action="store_true",
                           help="run every rank on this host's loopback: no namespaces, no rate limit (used "
                                "anyway, with a warning, where namespaces cannot be built)")


def emulation_from_args(args: argparse.Namespace, flags: ClusterFlags) -> Emulation | None:
    """The :class:`Emulation` the flags name (None: ``--emulate`` off), checked before any
    work; ``--loopback``, or no root where the benchmark allows it, drops the link.

    Raises:
        UsageError: a malformed ``--emulate``, ``--burst`` or ``--job-timeout``; namespaces
            needed and impossible here.
    """
    from tools.bench.harness.cluster import netns_unavailable_reason

    if args.emulate is None:
        return None
    try:
        emu = parse_emulate(args.emulate, flags.rate)
        burst = burst_bytes(args.burst)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if not args.job_timeout > 0:
        raise UsageError(f"--job-timeout {args.job_timeout:g}: must be > 0 seconds")
    mbit = emu.mbit
    if mbit is not None:
        reason = "--loopback given" if getattr(args, "loopback", False) else netns_unavailable_reason()
        if reason and not flags.loopback:
            raise UsageError(f"--emulate needs network namespaces: {reason}")
        if reason:
            print(f"no emulated cluster ({reason}): every rank runs on loopback without a rate limit",
                  file=sys.stderr)
            mbit = None
    return Emulation(emu.nodes, emu.local_size, mbit, burst, args.job_timeout)
