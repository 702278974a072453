"""checksum64 equals NOTE [checksum]'s formula, and catches what it is meant to catch.

Its values are stored in every L1 entry and L2 value, so a change of the numbers would
make existing caches read as corrupt: the reference below pins them.
"""
import random

import numpy as np
import pytest

from cachepipe.checksum import checksum64

MASK = (1 << 64) - 1
MIX = 0x9E3779B97F4A7C15


def reference(data: bytes) -> int:
    """NOTE [checksum] in plain Python: 64-bit little-endian words (the tail bytes as a last word)."""
    words = [int.from_bytes(data[i:i + 8], "little") for i in range(0, len(data), 8)]
    s1 = sum(words) & MASK
    s2 = sum((i + 1) * w for i, w in enumerate(words)) & MASK
    return s1 ^ ((s2 * MIX) & MASK) ^ len(data)


@pytest.mark.parametrize("n", [*range(0, 19), 4096, 262_144 + 32, 70_001])
def test_equals_the_documented_formula(n):
    data = random.Random(n).randbytes(n)
    assert checksum64(data) == reference(data)


def test_every_bytes_like_form_of_the_same_bytes_gives_the_same_value():
    data = random.Random(1).randbytes(1000)
    arr = np.frombuffer(data, dtype=np.uint8).reshape(10, 100)
    assert checksum64(data) == checksum64(memoryview(data)) == checksum64(arr) == checksum64(bytearray(data))


def test_detects_swapped_words_truncation_and_a_flipped_bit():
    data = bytearray(random.Random(2).randbytes(8 * 64))
    base = checksum64(data)
    swapped = data[8:16] + data[:8] + data[16:]
    flipped = bytearray(data)
    flipped[100] ^= 0x10
    assert checksum64(swapped) != base  # a plain sum would not see this
    assert checksum64(data[:-8]) != base
    assert checksum64(data + b"\0") != base  # the length is part of it
    assert checksum64(flipped) != base
