"""L2 value format: round trip and rejection of anything that is not exactly right."""
from __future__ import annotations

import numpy as np
import pytest

from cachepipe.l2.codec import HEADER, VERSION, decode_sample, encode_sample


def test_round_trip_and_views():
    arr = np.random.default_rng(0).integers(0, 256, (5, 7, 3), dtype=np.uint8)
    value = encode_sample(42, arr)
    assert len(value) == HEADER.size + arr.nbytes and value[:4] == b"CPL2"
    out = decode_sample(value, 42)
    np.testing.assert_array_equal(out, arr)
    assert out.flags.writeable
    assert not decode_sample(value, 42, copy=False).flags.writeable


def test_rejects_corruption():
    arr = np.zeros((4, 4, 3), dtype=np.uint8)
    value = encode_sample(3, arr)
    flipped = bytearray(value)
    flipped[-1] ^= 0x10
    for bad, msg in [(bytes(flipped), "checksum"), (value[:-1], "length"), (value[:10], "shorter"),
                     (b"XXXX" + value[4:], "magic"), (value, "belongs to sample 3")]:
        with pytest.raises(ValueError, match=msg):
            decode_sample(bad, 4 if msg.startswith("belongs") else 3)
    with pytest.raises(ValueError, match="uint8"):
        encode_sample(0, arr.astype(np.float32))


def test_values_of_another_format_version_are_rejected():
    """Format 1 (the Fletcher checksum) and any later format read as foreign, never as pixels."""
    value = encode_sample(3, np.zeros((4, 4, 3), dtype=np.uint8))
    for version in (1, VERSION + 1):
        other = value[:4] + version.to_bytes(2, "little") + value[6:]
        with pytest.raises(ValueError, match=f"version.*/{version}"):
            decode_sample(other, 3)
