"""NOTE [manifest through the store]: one node's scan serves the others, verified on load."""
from __future__ import annotations

import os
import time

import pytest

from cachepipe import TwoLevelCache
from cachepipe.shared_manifest import _root_key
from cachepipe.source.manifest import Manifest


@pytest.fixture
def scans(monkeypatch):
    """Counts the scans of the source."""
    real = Manifest.scan.__func__
    done = []

    def counted(cls, *args, **kwargs):
        done.append(args[0])
        return real(cls, *args, **kwargs)

    monkeypatch.setattr(Manifest, "scan", classmethod(counted))
    return done


def _age(root):
    for d, _, _ in os.walk(root):  # an old tree: its scans are trusted (NOTE [manifest reuse])
        os.utime(d, (time.time() - 3600,) * 2)


def test_one_scan_serves_every_node_and_a_bad_value_is_a_scan(source, tmp_path, redis_server, scans):
    _age(source)
    url = redis_server.url
    first = TwoLevelCache(source, tmp_path / "node0", url, 32, share_manifest=True)
    assert len(scans) == 1
    second = TwoLevelCache(source, tmp_path / "node1", url, 32, share_manifest=True)
    assert len(scans) == 1 and second.fingerprint == first.fingerprint  # node 1 took node 0's scan
    assert list(second.manifest.relpaths) == list(first.manifest.relpaths)
    assert (tmp_path / "node1" / first.fingerprint / "manifest.cpm").read_bytes() == \
        (tmp_path / "node0" / first.fingerprint / "manifest.cpm").read_bytes()
    TwoLevelCache(source, tmp_path / "node1", url, 32, share_manifest=True)  # its own saved scan now
    assert len(scans) == 1

    key = f"cachepipe:manifest:{_root_key(str(source))}:1"
    client = redis_server.client()
    client.setrange(key, 200, b"\xff" * 8)  # a damaged value: refused by its checksum, never used
    third = TwoLevelCache(source, tmp_path / "node2", url, 32, share_manifest=True)
    assert len(scans) == 2 and third.fingerprint == first.fingerprint

    (source / sorted(os.listdir(source))[0] / "new.jpg").write_bytes(
        (source / third.manifest.relpath(0)).read_bytes())  # the tree changed since the published scan
    fourth = TwoLevelCache(source, tmp_path / "node3", url, 32, share_manifest=True)
    assert len(scans) == 3 and len(fourth.manifest) == len(first.manifest) + 1


def test_without_share_manifest_nothing_is_published(source, tmp_path, redis_server, scans):
    TwoLevelCache(source, tmp_path / "node0", redis_server.url, 32)
    TwoLevelCache(source, tmp_path / "node1", redis_server.url, 32)
    assert len(scans) == 2 and redis_server.client().dbsize() == 0
