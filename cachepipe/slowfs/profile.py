"""How slow the emulated file share is.

NOTE [slowfs profile]
The defaults are Amazon EFS's published profile for a General Purpose file system in
Bursting throughput mode, the default an ML team gets when it puts ImageNet on a cloud
file share (Amazon EFS User Guide, "Amazon EFS performance specifications",
https://docs.aws.amazon.com/efs/latest/ug/performance.html):

- **1 ms per operation**: the guide's table gives read latency "as low as 250 µs" today and
  gave "~1 ms" before; 1 ms is also the upper end of the 0.5–1 ms per metadata call that NFS
  clients see over a data-centre network. Every request the kernel sends pays it: a lookup
  or stat, a readdir, an open, and each read call (NFS has no batching of small files: one
  image costs a lookup, an open and a read, ~3 round trips).
- **100 MB/s shared by all readers**: Bursting mode lets any file system burst to 100 MiB/s
  and gives a baseline of 50 MiB/s per TiB stored (about 7 MiB/s for ImageNet's 140 GB);
  Google Filestore's Basic HDD tier publishes the same 100 MiB/s of reads for 1–10 TiB
  (https://cloud.google.com/filestore/docs/performance). The cap is of the share, not of
  one client: concurrent readers divide it.

Requests in flight overlap, as an NFS client's do (its RPC slots): the latency is slept
per request without a lock; only the bandwidth is a shared, serial resource.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_LATENCY_MS", "DEFAULT_MBPS", "SlowProfile"]

DEFAULT_LATENCY_MS = 1.0  # NOTE [slowfs profile]
DEFAULT_MBPS = 100.0


@dataclass(frozen=True)
class SlowProfile:
    """The emulated share's latency and bandwidth (NOTE [slowfs profile]).

    Args:
        latency_ms: milliseconds each read call waits (and each metadata operation, unless
            ``metadata_latency_ms`` is given); default 1.0.
        mbps: the share's bandwidth in MB/s (10**6 bytes), shared by all readers; 0: no cap;
            default 100.
        metadata_latency_ms: milliseconds of each lookup/stat, readdir, open and readlink
            (``None``: ``latency_ms``).

    Raises:
        ValueError: a negative or non-finite value (names the field).

    Example:
        >>> SlowProfile(latency_ms=2, mbps=50).metadata_s
        0.002
    """

    latency_ms: float = DEFAULT_LATENCY_MS
    mbps: float = DEFAULT_MBPS
    metadata_latency_ms: float | None = None

    def __post_init__(self) -> None:
        for name in ("latency_ms", "mbps", "metadata_latency_ms"):
            value = getattr(self, name)
            if value is None and name == "metadata_latency_ms":
                continue
            if not (isinstance(value, (int, float)) and 0 <= value < float("inf")):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")

    @property
    def read_s(self) -> float:
        """Seconds each read call waits."""
        return self.latency_ms / 1e3

    @property
    def metadata_s(self) -> float:
        """Seconds each metadata operation waits."""
        return (self.latency_ms if self.metadata_latency_ms is None else self.metadata_latency_ms) / 1e3

    @property
    def bytes_per_s(self) -> float:
        """The bandwidth cap in bytes per second (0: none)."""
        return self.mbps * 1e6

    def describe(self) -> str:
        """``1 ms per read, 1 ms per metadata operation, 100 MB/s shared``."""
        cap = f"{self.mbps:g} MB/s shared" if self.mbps else "no bandwidth cap"
        return f"{self.read_s * 1e3:g} ms per read, {self.metadata_s * 1e3:g} ms per metadata operation, {cap}"
