"""Issue 17, item 10: a cache dir on a network file system is refused by name.

No NFS server can run in the test machine, so the refusal is driven through a real
tmpfs mount whose statfs magic the test adds to the refused table: the statfs call, the
walk up to an existing parent and the messages are the real ones."""
from __future__ import annotations

import argparse

import pytest

from cachepipe import TwoLevelCache, netfs
from tests.faults.cache_faults import needs_root, tmpfs

TMPFS_MAGIC = 0x01021994


def test_local_dirs_are_accepted(source, tmp_path):
    assert netfs.fs_magic(tmp_path) not in netfs.NETWORK_FS
    netfs.check_cache_dir(tmp_path / "not" / "yet" / "there")
    assert 0x6969 in netfs.NETWORK_FS and netfs.NETWORK_FS[0x6969] == "NFS"


@needs_root()
def test_network_cache_dir_is_refused_naming_it(source, tmp_path, monkeypatch, capsys):
    from tools import stats, warmup

    with tmpfs(tmp_path / "mnt", size="4m") as mnt:
        assert netfs.fs_magic(mnt) == TMPFS_MAGIC  # the kernel's answer, read by our statfs call
        monkeypatch.setitem(netfs.NETWORK_FS, TMPFS_MAGIC, "NFS")
        cache_dir = mnt / "cache"
        with pytest.raises(ValueError, match=f"--cache-dir '{cache_dir}' is on NFS"):
            TwoLevelCache(source, cache_dir, False)
        assert not cache_dir.exists()
        for module in (warmup, stats):
            parser = argparse.ArgumentParser()
            module.configure(parser)
            assert module.main(parser.parse_args([str(source), "--cache-dir", str(cache_dir), "--no-l2"])) == 2
            assert "is on NFS, a network file system" in capsys.readouterr().err
