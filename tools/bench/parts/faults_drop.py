"""``cachepipe bench faults``: ``cachepipe drop`` beside a training run (issue 46, items 1-3).

- ``drop_other``: before the run, ``cachepipe drop DATA/train --fingerprint <val's current
  fingerprint>``: refused (exit 2), val's keys and manifest untouched; the run then trains
  from the shared cache as the baseline does.
- ``drop_prefix``: an older version of a copy of the data is cached under the prefixes
  ``exp1`` and ``exp[1]``, the current one under ``exp1``; ``drop --prefix 'exp[1]'`` must take
  exactly ``exp[1]``'s keys of the older version and ``drop --prefix '*' --fingerprint OLD``
  nothing of ``exp1``'s; the run trains with ``--prefix exp1``, then ``exp1``'s older keys
  are dropped by name.
- ``drop_training``: after the run's first epoch its source gains a file (a new version:
  the run's namespace is now an older one) and ``cachepipe drop`` is run: refused as in use
  (exit 5, NOTE [namespace lease]), every key kept; after the run a drop takes every key of
  that namespace (none left behind), and the file goes again.

A check that fails makes the row's ``exit`` 1 with what went wrong as its error, whatever
the run returned.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

__all__ = ["DROP_FAULTS", "drop_fault"]

DROP_FAULTS = ("drop_other", "drop_prefix", "drop_training")
_SIZE = 64  # the bench's cache size


def _fingerprint(root: Path, cache: Path) -> str:
    from cachepipe import Manifest

    return Manifest.load_or_scan(root, cache, save=False).fingerprint


def _keys(bench, prefix: str, fp: str) -> int:
    """Keys of ``fp`` under ``prefix`` on every shard, counted without a glob (the bench's own count)."""
    head = f"{prefix}:{fp}:".encode()
    return sum(k.startswith(head) for shard in bench.shards for k in shard.client().scan_iter(count=1000))


def _drop(bench, root: Path, cache: Path, *flags: str) -> tuple[int, str]:
    argv = [sys.executable, "-m", "tools", "drop", str(root), "--cache-dir", str(cache), *flags]
    for url in bench.urls:
        argv += ["--l2", url]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    return r.returncode, (r.stderr.strip().splitlines() or [""])[-1]


def _warm(bench, data: Path, cache: Path, prefix: str, splits=("train", "val")) -> None:
    from cachepipe import CacheConfig, TwoLevelCache
    from cachepipe.warmup import warmup

    for split in splits:
        with TwoLevelCache(CacheConfig(data / split, cache, bench.urls, _SIZE, prefix=prefix)) as level:
            warmup(level, workers=1, progress=False)


def _verdict(bench, result: tuple[int, bool], problems: list[str]) -> tuple[int, bool]:
    if problems:
        bench.log = "; ".join(problems)
        return 1, result[1]
    return result


def _other(bench, out: Path) -> tuple[int, bool]:
    val = _fingerprint(bench.data / "val", bench.cache)
    before, problems = _keys(bench, "cachepipe", val), []
    code, err = _drop(bench, bench.data / "train", bench.cache, "--fingerprint", val)
    if code != 2:
        problems.append(f"drop of val's current namespace from train exited {code} ({err})")
    if _keys(bench, "cachepipe", val) != before or not (bench.cache / val / "manifest.cpm").exists():
        problems.append(f"val's namespace lost keys ({before} -> {_keys(bench, 'cachepipe', val)}) or its manifest")
    return _verdict(bench, bench.run(bench.train_argv(out)), problems)


def _prefix(bench, out: Path) -> tuple[int, bool]:
    data, cache = bench.work / "data-prefix", bench.work / "cache-prefix"
    shutil.copytree(bench.data, data)
    first = sorted((data / "train").rglob("*.JPEG"))[0]
    extra = first.with_name("zz_old.JPEG")
    shutil.copy(first, extra)  # the older version: one more file
    for prefix in ("exp1", "exp[1]"):
        _warm(bench, data, cache, prefix, ("train",))
    old = _fingerprint(data / "train", cache)
    n_old = _keys(bench, "exp1", old)
    extra.unlink()  # the current version: the bench's files
    _warm(bench, data, cache, "exp1")
    problems = []
    for flags in (["--prefix", "exp[1]"], ["--prefix", "*", "--fingerprint", old]):
        code, err = _drop(bench, data / "train", cache, *flags)
        if code:
            problems.append(f"drop {' '.join(flags)} exited {code} ({err})")
    left = {p: _keys(bench, p, old) for p in ("exp1", "exp[1]")}
    if left != {"exp1": n_old, "exp[1]": 0} or not n_old:
        problems.append(f"keys of the older version after dropping exp[1]'s and *'s: {left} (want exp1: {n_old}, "
                        f"exp[1]: 0)")
    result = bench.run(bench.train_argv(out, data, cache, "--prefix", "exp1"))
    code, err = _drop(bench, data / "train", cache, "--prefix", "exp1", "--fingerprint", old)
    if code or _keys(bench, "exp1", old):
        problems.append(f"drop --prefix exp1 --fingerprint {old} exited {code} ({err}), "
                        f"{_keys(bench, 'exp1', old)} keys left")
    return _verdict(bench, result, problems)


def _training(bench, out: Path) -> tuple[int, bool]:
    from cachepipe import CacheConfig
    from tools.demo import prepare_cache

    data, cache = bench.work / "data-drop", bench.work / "cache-drop"
    shutil.copytree(bench.data, data)
    prepare_cache(CacheConfig(data, cache, bench.urls, _SIZE))
    old = _fingerprint(data / "train", cache)
    n_old = _keys(bench, "cachepipe", old)
    first = sorted((data / "train").rglob("*.JPEG"))[0]
    extra, seen, problems = first.with_name("zz_new.JPEG"), {}, []

    def inject(job) -> bool:
        metrics = out / "metrics.jsonl"
        if not metrics.exists() or not metrics.read_text().strip():
            return False
        shutil.copy(first, extra)  # a new version of the source, while the run reads the old one
        seen["code"], seen["err"] = _drop(bench, data / "train", cache)
        seen["keys"], seen["dir"] = _keys(bench, "cachepipe", old), (cache / old / "manifest.cpm").exists()
        return True

    result = bench.run(bench.train_argv(out, data, cache), inject)
    if seen and (seen["code"] != 5 or seen["keys"] < n_old or not seen["dir"]):
        problems.append(f"drop while the run trained exited {seen['code']} ({seen['err']}); its namespace kept "
                        f"{seen['keys']} of {n_old} keys, manifest {'kept' if seen['dir'] else 'gone'}")
    code, err = _drop(bench, data / "train", cache)
    if code or _keys(bench, "cachepipe", old) or (cache / old).exists():
        problems.append(f"drop after the run exited {code} ({err}); {_keys(bench, 'cachepipe', old)} keys of "
                        f"{old} left")
    extra.unlink(missing_ok=True)
    return _verdict(bench, result, problems)


def drop_fault(bench, name: str, out: Path) -> tuple[int, bool]:
    """Run scenario ``name`` of :data:`DROP_FAULTS` on ``bench`` (a ``tools.bench.faults`` bench)."""
    return {"drop_other": _other, "drop_prefix": _prefix, "drop_training": _training}[name](bench, out)
