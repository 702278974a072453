"""The warm-up's completion record: "node R's partition is all in L2", checked against a sample.

NOTE [completion record]
Asking L2 which of N samples it lacks is N ``EXISTS`` (20-38 s at 1.28M files), and a
warm-up that finds nothing to do would pay it every time. A warm-up that leaves its whole
partition in L2 (nothing left out for room, no failed write, no unreadable or changed
file) records so in ``<cache_dir>/<fingerprint>/warm.json``: per namespace and node
(``"<node_rank>/<num_nodes>"``) the partition's size and digest and the shards it was
written to. The next warm-up trusts it when all of these hold, and otherwise deletes it
and asks L2 for every sample as before:
- the same namespace, node, partition (digest of its indices: the placement is the same)
  and shards (URLs, replicas);
- no shard evicts (NOTE [evicting shards]: keys may vanish without a trace);
- a random sample of 1,024 of the partition's samples (new each run) are all present:
  one pipelined ``EXISTS`` per shard. A restarted or flushed server (the embedded one
  keeps nothing across a restart) fails it at the first key; keys deleted by hand, 1 %
  of them, escape it with probability 0.99^1024 < 1e-4.
What escapes it is a miss, never a wrong sample: training reads it from L1 and writes it
back. A partition left a fixed subset (NOTE [fixed L2 subset]) is not recorded, so its
warm-ups still ask for every sample (the room may have grown).
"""
from __future__ import annotations

import hashlib
import json

import numpy as np

from cachepipe.private_files import write_private

__all__ = ["forget", "is_complete", "record_complete"]

SAMPLE = 1024


def _path(cache):
    return cache.l1_path.parent / "warm.json"


def _read(cache) -> dict:
    try:
        with open(_path(cache)) as f:
            obj = json.load(f)
        return obj if isinstance(obj, dict) else {}
    except (OSError, ValueError):
        return {}


def _entry(cache, part: np.ndarray) -> dict:
    return {"partition": int(len(part)),
            "digest": hashlib.blake2b(np.ascontiguousarray(part, dtype="<i8").tobytes(), digest_size=16).hexdigest(),
            "shards": [row["url"] for row in cache.store.shard_info()], "replicas": cache.config.replicas}


def is_complete(cache, node: str, part: np.ndarray, skip: np.ndarray, evicting: list[str]) -> bool:
    """Whether NOTE [completion record]'s record of ``node`` holds for ``part`` (``skip``: known
    corrupt samples, never in L2); deletes a record that does not.

    Raises:
        L2UnavailableError: a shard cannot be reached.
    """
    records = _read(cache)
    record = records.get(cache.namespace, {}).get(node)
    if record is None:
        return False
    ok = not evicting and record == _entry(cache, part)
    if ok:
        pool = np.setdiff1d(part, skip, assume_unique=True)
        pick = np.random.default_rng().choice(pool, size=min(SAMPLE, len(pool)), replace=False)
        ok = not cache.store.missing(np.sort(pick).tolist())
    if not ok:
        forget(cache, node)
    return ok


def record_complete(cache, node: str, part: np.ndarray) -> None:
    """Record that ``node``'s partition ``part`` is all in L2 (atomic, private)."""
    records = _read(cache)
    records.setdefault(cache.namespace, {})[node] = _entry(cache, part)
    write_private(_path(cache), json.dumps(records).encode())


def forget(cache, node: str) -> None:
    """Delete ``node``'s record in this namespace, if any."""
    records = _read(cache)
    if records.get(cache.namespace, {}).pop(node, None) is not None:
        write_private(_path(cache), json.dumps(records).encode())
