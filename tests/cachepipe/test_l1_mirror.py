"""L1 LMDB mirror: verification, full map, and a writer killed mid-batch."""
from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys

import pytest

from cachepipe import L1FullError
from cachepipe.l1.mirror import L1Mirror


def test_put_get_and_verification(tmp_path):
    l1 = L1Mirror(tmp_path / "l1", 1 << 22)
    assert l1.put_many([(0, b"abc"), (5, b"x" * 5000)]) == 2
    values, corrupt = l1.get_many([0, 1, 5])
    assert values == [b"abc", None, b"x" * 5000] and corrupt == []
    assert l1.present().tolist() == [0, 5] and l1.entries() == 2
    with l1.env.begin(write=True) as txn:  # damage the bytes behind the mirror's back
        txn.put(struct.pack(">Q", 5), b"y" * 5000, db=l1.data_db)
        txn.put(struct.pack(">Q", 0), b"ab", db=l1.data_db)
    values, corrupt = l1.get_many([0, 5])
    assert values == [None, None] and corrupt == [0, 5]
    l1.close()


def test_full_map_is_a_clear_error_and_keeps_data(tmp_path):
    l1 = L1Mirror(tmp_path / "l1", 1 << 17)
    l1.put_many([(0, b"a" * 1000)])
    with pytest.raises(L1FullError, match=r"is full: its LMDB map size is 0\.1 MiB.*nothing of this batch"):
        l1.put_many([(i, os.urandom(20_000)) for i in range(1, 20)])
    assert l1.get_many([0, 1]) == ([b"a" * 1000, None], [])
    l1.close()


_WRITER = """
import os, sys
from cachepipe.l1.mirror import L1Mirror
l1 = L1Mirror(sys.argv[1], 1 << 28)
i = 0
while True:
    l1.put_many([(i + k, os.urandom(1000 + (i + k) % 5000)) for k in range(32)])
    i += 32
    print(i, flush=True)
"""


def test_writer_killed_mid_batch_leaves_no_torn_entries(tmp_path):
    path = tmp_path / "l1"
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(path)], stdout=subprocess.PIPE,
                            cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    for _ in range(20):  # let it commit some batches, then kill it while writing
        proc.stdout.readline()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    l1 = L1Mirror(path, 1 << 28)
    present = sorted(l1.present())
    assert len(present) >= 20 * 32 and len(present) % 32 == 0  # whole batches only
    values, corrupt = l1.get_many(present)
    assert corrupt == [] and all(len(v) == 1000 + i % 5000 for i, v in zip(present, values))
    l1.put_many([(len(present), b"resumed")])  # the environment is still writable
    assert l1.get_many([len(present)])[0] == [b"resumed"]
    l1.close()
