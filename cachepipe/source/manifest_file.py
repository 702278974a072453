"""The saved manifest: one binary file of flat arrays, memory-mapped read-only.

NOTE [manifest file]
``<cache_dir>/<fingerprint>/manifest.cpm`` holds NOTE [manifest columns] as FFCV's
``.beton`` holds its index: a fixed little-endian header, then each section at a
64-byte-aligned offset, so that every column is a numpy view of the mapped file with no
copy and no parsing per file. Nothing is unpickled: the header is ``struct``-parsed, the
one variable section of metadata (root, classes) is JSON.

Header (112 bytes): magic ``b"CPMANIF\\n"``, format u32 (3), sections u32 (8), samples
u64, classes u64, fingerprint 16 ASCII hex digits (NOTE [fingerprint stable across file
formats]), total bytes u64, largest file u64, file length u64, XXH3-64 checksum u64 of
the whole file with this field zeroed (NOTE [checksum]), then the section table, (offset
u64, length u64) for ``meta`` (JSON: ``root``, ``classes``), ``labels``, ``sizes``,
``mtimes``, ``inos``, ``ctimes``, ``offsets``, ``names``. It holds the scan's result
only, so two scans of an unchanged tree write the same bytes.

Opening checks the magic, the format, the lengths of every section against the sample
count and the file's length, and (``verify=True``) the checksum, which reads the file
once through a small buffer (not through the map, so the pages stay out of this process's
RSS). Anything wrong is a :class:`ManifestFileError` naming the file and what is wrong; the
caller rescans (NOTE [manifest reuse]). A process that receives a manifest by path (a
spawn or forkserver DataLoader worker) opens it with the checksum its sender verified
and compares the stored one instead of reading the file again. Files are written once,
atomically (temp name, then ``os.replace``), and never modified, so a mapped file never
changes under its readers.
"""
from __future__ import annotations

import json
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import xxhash

from cachepipe.private_files import write_private
from cachepipe.source.columns import DTYPES, IDENTITY, Columns

__all__ = ["FILE_NAME", "FORMAT", "ManifestFile", "ManifestFileError", "read_root", "write_manifest"]

FILE_NAME = "manifest.cpm"
FORMAT = 3  # 1, 2: manifest.json (NOTE [fingerprint stable across file formats] keeps 2's fingerprints)
_MAGIC = b"CPMANIF\n"
_SECTIONS = ("meta", "labels", *IDENTITY, "offsets", "names")
_HEAD = struct.Struct("<8sIIQQ16sQQQQ")
_TABLE = struct.Struct("<" + "QQ" * len(_SECTIONS))
_CHECKSUM_AT = _HEAD.size - 8
_HEADER_BYTES = _HEAD.size + _TABLE.size
_ALIGN = 64
_READ_CHUNK = 4 << 20


class ManifestFileError(ValueError):
    """A manifest file that cannot be used (truncated, foreign, another format, damaged)."""


@dataclass(frozen=True)
class ManifestFile:
    """A parsed manifest file: its metadata and its columns (views of the map).

    Attributes:
        path: the file.
        meta: ``root``, ``classes``.
        columns: NOTE [manifest columns], read-only views of the mapped file.
        fingerprint, total_bytes, largest, checksum: from the header.
    """

    path: Path
    meta: dict
    columns: Columns
    fingerprint: str
    total_bytes: int
    largest: int
    checksum: int

    @classmethod
    def open(cls, path: str | os.PathLike, *, verify: bool = True, checksum: int | None = None) -> ManifestFile:
        """Map and check ``path`` (NOTE [manifest file]).

        Args:
            verify: read the whole file once and compare its checksum.
            checksum: instead of ``verify``, the checksum the file must state (what the
                process that verified it saw).

        Raises:
            FileNotFoundError: no such file.
            ManifestFileError: anything else wrong with it (the message names the file).
        """
        path = Path(path)
        with open(path, "rb") as f:
            head = f.read(_HEADER_BYTES)
            size = os.fstat(f.fileno()).st_size
            if len(head) < _HEADER_BYTES or head[:8] != _MAGIC:
                raise ManifestFileError(f"{path} is not a cachepipe manifest (truncated or foreign)")
            magic, fmt, nsec, n, ncls, fp, total, largest, length, stated = _HEAD.unpack_from(head)
            if fmt != FORMAT or nsec != len(_SECTIONS):
                raise ManifestFileError(f"{path} is manifest format {fmt}; this cachepipe reads format {FORMAT}")
            if length != size:
                raise ManifestFileError(f"{path} is {size} bytes; its header says {length} (truncated?)")
            table = _TABLE.unpack_from(head, _HEAD.size)
            spans = dict(zip(_SECTIONS, zip(table[::2], table[1::2])))
            _check_spans(path, spans, n, size)
            if checksum is not None and stated != checksum:
                raise ManifestFileError(f"{path} was replaced since it was opened (checksum {stated:016x}, "
                                        f"expected {checksum:016x})")
            if verify and checksum is None and _file_checksum(f, size) != stated:
                raise ManifestFileError(f"{path} fails its checksum (damaged)")
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            meta = json.loads(bytes(mapped[spans["meta"][0]:sum(spans["meta"])]).decode("ascii"))
            if not isinstance(meta.get("root"), str) or not isinstance(meta.get("classes"), list) \
                    or len(meta["classes"]) != ncls:
                raise ValueError("bad metadata")
            cols = Columns(**{name: np.frombuffer(mapped, dtype=DTYPES[name], offset=off,
                                                  count=ln // DTYPES[name].itemsize)
                              for name, (off, ln) in spans.items() if name != "meta"})
        except (ValueError, UnicodeDecodeError) as exc:
            raise ManifestFileError(f"{path} has unusable contents ({exc})") from None
        return cls(path, meta, cols, fp.decode("ascii", "replace"), total, largest, stated)


def _check_spans(path: Path, spans: dict, n: int, size: int) -> None:
    for name, (off, ln) in spans.items():
        want = None if name in ("meta", "names") else (n + 1 if name == "offsets" else n) * DTYPES[name].itemsize
        if off < _HEADER_BYTES or off % _ALIGN or off + ln > size or (want is not None and ln != want):
            raise ManifestFileError(f"{path} has a damaged section table ({name} at {off}, {ln} bytes)")


def _file_checksum(f, size: int) -> int:
    h = xxhash.xxh3_64()
    f.seek(0)
    buf = bytearray(_READ_CHUNK)
    view = memoryview(buf)
    done = 0
    while done < size:
        got = f.readinto(view)
        if not got:
            break
        chunk = view[:got]
        if done <= _CHECKSUM_AT < done + got:  # the checksum field hashes as zeros
            at = _CHECKSUM_AT - done
            h.update(chunk[:at])
            h.update(bytes(8))
            h.update(chunk[at + 8:])
        else:
            h.update(chunk)
        done += got
    return h.intdigest()


def write_manifest(path: str | os.PathLike, meta: dict, cols: Columns, fingerprint: str) -> int:
    """Write a manifest file atomically (mode 0600, NOTE [private cache files]); returns its checksum."""
    meta_bytes = json.dumps(meta, separators=(",", ":"), ensure_ascii=True).encode("ascii")  # keeps surrogates
    parts = [memoryview(meta_bytes)] + [np.ascontiguousarray(getattr(cols, name)).data for name in _SECTIONS[1:]]
    table, body, at = [], [], _HEADER_BYTES
    for part in parts:
        pad = -at % _ALIGN
        body += [bytes(pad), part]
        at += pad
        table += [at, part.nbytes]
        at += part.nbytes
    sizes = cols.sizes
    head = _HEAD.pack(_MAGIC, FORMAT, len(_SECTIONS), len(cols), len(meta["classes"]), fingerprint.encode("ascii"),
                      int(sizes.sum()), int(sizes.max(initial=0)), at, 0) + _TABLE.pack(*table)
    h = xxhash.xxh3_64(head)
    for part in body:
        h.update(part)
    checksum = h.intdigest()
    head = head[:_CHECKSUM_AT] + struct.pack("<Q", checksum) + head[_CHECKSUM_AT + 8:]
    write_private(path, [head, *body])
    return checksum


def read_root(directory: str | os.PathLike) -> str | None:
    """The source root of the manifest saved in ``directory`` (a fingerprint's directory),
    from its header and metadata alone; ``None`` when there is none or it cannot be read.
    A manifest.json of formats 1 and 2 is read as far as its root (its first field)."""
    directory = Path(directory)
    try:
        with open(directory / FILE_NAME, "rb") as f:
            head = f.read(_HEADER_BYTES)
            if len(head) < _HEADER_BYTES or head[:8] != _MAGIC:
                return None
            off, ln = _TABLE.unpack_from(head, _HEAD.size)[:2]
            f.seek(off)
            return json.loads(f.read(ln).decode("ascii")).get("root")
    except FileNotFoundError:
        return _legacy_root(directory / "manifest.json")
    except (OSError, ValueError, AttributeError):
        return None


def _legacy_root(path: Path) -> str | None:
    """The root of a format 1 or 2 ``manifest.json``, which starts ``{"format":F,"root":"..."``."""
    try:
        with open(path, "rb") as f:
            head = f.read(64 << 10).decode("ascii", "replace")
        start = head.index('"root":') + len('"root":')
        value, _ = json.JSONDecoder().raw_decode(head, start)
        return value if isinstance(value, str) else None
    except (OSError, ValueError):
        return None
