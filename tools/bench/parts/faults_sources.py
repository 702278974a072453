"""Bad source trees for ``cachepipe bench faults`` (issue 32): each scenario trains from a
copy of the bench's dataset with one real fault in its files.

- ``fifo``: a FIFO named ``zz_fifo.JPEG`` in a class folder (opening it would wait for a
  writer forever);
- ``huge``: a 40 GB sparse file ``zz_huge.JPEG`` (a JPEG header, then holes: no disk used);
- ``replaced``: after the cache was warmed, a file replaced by another image of the same
  size with the same mtime (``os.utime``, ``os.replace``); the row's ``stale`` says whether
  the cache still serves the old pixels after the run.
"""
from __future__ import annotations

import io
import os
import shutil
from pathlib import Path

__all__ = ["SOURCE_FAULTS", "source_fault"]

SOURCE_FAULTS = ("fifo", "huge", "replaced")
_SIZE = 64  # the bench's cache size


def _first_class(data: Path) -> Path:
    return sorted(p for p in (data / "train").iterdir() if p.is_dir())[0]


def _impostor(path: Path) -> bytes:
    """Another image (inverted) as a JPEG padded to ``path``'s size."""
    import numpy as np
    from PIL import Image

    original = path.read_bytes()
    img = Image.fromarray(255 - np.asarray(Image.open(io.BytesIO(original)).convert("RGB")))
    for quality in (75, 50, 25, 10):
        buf = io.BytesIO()
        img.save(buf, "JPEG", quality=quality)
        if buf.tell() <= len(original):
            return buf.getvalue() + b"\0" * (len(original) - buf.tell())
    raise RuntimeError(f"cannot make a JPEG smaller than {path}")


def _replace(path: Path) -> bytes:
    """Replace ``path`` by another image of its size and mtime; returns the new bytes."""
    st, new = path.stat(), _impostor(path)
    tmp = path.with_name(".incoming")
    tmp.write_bytes(new)
    os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(tmp, path)
    return new


def _stale(data: Path, cache: Path, urls: list[str], relpath: str, new: bytes) -> str:
    """``"yes"`` when the cache serves other pixels than the file's for ``relpath``."""
    import numpy as np

    from cachepipe import TwoLevelCache, decode_and_resize

    with TwoLevelCache(data / "train", cache, urls, _SIZE) as c:
        got = c.get(c.manifest.relpaths.index(relpath))
    return "no" if np.array_equal(got, decode_and_resize(new, _SIZE)) else "yes"


def source_fault(bench, name: str, out: Path) -> tuple[int, bool]:
    """Run scenario ``name`` of :data:`SOURCE_FAULTS` on ``bench`` (a ``tools.bench.faults``
    bench); sets ``bench.stale`` for ``replaced``."""
    from cachepipe import CacheConfig
    from tools.demo import prepare_cache

    data, cache = bench.work / f"data-{name}", bench.work / f"cache-{name}"
    shutil.copytree(bench.data, data)
    victim = _first_class(data) / f"zz_{name}.JPEG"
    if name == "fifo":
        os.mkfifo(victim)
    elif name == "huge":
        victim.write_bytes(next(_first_class(data).glob("*.JPEG")).read_bytes()[:600])
        os.truncate(victim, 40 << 30)
    else:
        victim = sorted(_first_class(data).glob("*.JPEG"))[3]
        prepare_cache(CacheConfig(data, cache, bench.urls, _SIZE))  # L1 and L2 hold the old pixels
        new = _replace(victim)
    result = bench.run(bench.train_argv(out, data, cache))
    if name == "replaced":
        bench.stale = _stale(data, cache, bench.urls, str(victim.relative_to(data / "train")), new)
    return result
