"""checksum64 is XXH3-64 (NOTE [checksum]), and catches what it is meant to catch.

Its values are stored in every L1 entry and L2 value, so a change of the numbers would
make existing caches read as corrupt: the values below pin them.
"""
import random

import numpy as np
import pytest

from cachepipe.checksum import checksum64


def pattern(n: int) -> bytes:
    return bytes(i % 251 for i in range(n))


@pytest.mark.parametrize("n, expected", [
    (0, 0x2D06800538D394C2),  # XXH3_64bits of the empty input, xxHash's own test vector
    (1, 0xC44BDFF4074EECDB),  # XXH3 has separate code paths for 1-16, 17-128, 129-240 and longer inputs
    (17, 0x9EF341A99DE37328),
    (200, 0xF42A8864FEAF0703),
    (262_144, 0x19E33139F5534930),
])
def test_pinned_values(n, expected):
    assert checksum64(pattern(n)) == expected


def test_every_bytes_like_form_of_the_same_bytes_gives_the_same_value():
    data = random.Random(1).randbytes(1000)
    arr = np.frombuffer(data, dtype=np.uint8).reshape(10, 100)
    assert checksum64(data) == checksum64(memoryview(data)) == checksum64(arr) == checksum64(bytearray(data))
    assert checksum64(memoryview(data)[32:]) == checksum64(data[32:])  # a value's body, as decode_sample passes it


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
