"""Binary format of one decoded sample in L2 (never pickle).

NOTE [L2 value format]
A value is a 32-byte little-endian header followed by the raw ``H*W*C`` uint8 pixels in
HWC order::

    magic b"CPL2" | version u16 | channels u16 | height u32 | width u32
    | index u64 | checksum u64 (of the pixels, NOTE [checksum] in checksum.py)

The index in the header guards against a value stored under the wrong key; the checksum
against torn or foreign values. Any mismatch makes :func:`decode_sample` raise
``ValueError``, which readers count as a corrupt value and treat as a miss. Version 2
(the current one) checksums with XXH3-64; version 1 used a Fletcher-style sum, and its
values read as foreign.
"""
from __future__ import annotations

import struct

import numpy as np

from cachepipe.checksum import checksum64

__all__ = ["HEADER", "MAGIC", "VERSION", "decode_sample", "encode_sample", "encoded_size"]

MAGIC = b"CPL2"
VERSION = 2
HEADER = struct.Struct("<4sHHIIQQ")


def encoded_size(height: int, width: int, channels: int = 3) -> int:
    """Bytes of one encoded value (header + pixels)."""
    return HEADER.size + height * width * channels


def encode_sample(index: int, pixels: np.ndarray) -> bytes:
    """Serialize an ``(H, W, C)`` uint8 array for sample ``index``.

    Raises:
        ValueError: not a 3-D uint8 array.
    """
    if pixels.dtype != np.uint8 or pixels.ndim != 3:
        raise ValueError(f"need an (H, W, C) uint8 array, got {pixels.dtype} {pixels.shape}")
    h, w, c = pixels.shape
    body = np.ascontiguousarray(pixels).data
    header = HEADER.pack(MAGIC, VERSION, c, h, w, index, checksum64(body))
    return header + bytes(body)


def decode_sample(value: bytes | memoryview, index: int, *, copy: bool = True) -> np.ndarray:
    """Parse a value written by :func:`encode_sample` for sample ``index``.

    Args:
        value: the stored bytes (any bytes-like object).
        index: the index the caller asked for (must match the header).
        copy: return a writable copy (default) instead of a read-only view of ``value``.

    Raises:
        ValueError: wrong magic, version, index, length or checksum.
    """
    if len(value) < HEADER.size:
        raise ValueError(f"value of {len(value)} bytes is shorter than the header")
    magic, version, c, h, w, idx, checksum = HEADER.unpack_from(value)
    if magic != MAGIC or version != VERSION:
        raise ValueError(f"bad magic/version {magic!r}/{version}")
    if idx != index:
        raise ValueError(f"value belongs to sample {idx}, not {index}")
    if len(value) != HEADER.size + h * w * c:
        raise ValueError(f"length {len(value)} does not match {h}x{w}x{c}")
    body = memoryview(value)[HEADER.size:]
    if checksum64(body) != checksum:
        raise ValueError("checksum mismatch")
    arr = np.frombuffer(body, dtype=np.uint8).reshape(h, w, c)
    if copy:
        return arr.copy()
    arr.flags.writeable = False  # a view of the reply buffer, whatever its owner allows
    return arr
