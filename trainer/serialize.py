"""Pickle-free state files: nested dicts/lists of tensors, arrays and JSON scalars in one ``.npz``.

NOTE [no pickle on disk]: checkpoints are read back from disk, so they never go through
pickle (``torch.load`` included). The structure is stored as JSON, every tensor as a
numpy array (``np.load(allow_pickle=False)``); bf16 tensors travel as int16 bit patterns.

NOTE [checksummed state files]: a ``sha256`` entry holds the SHA-256 of the JSON and of
every array (dtype, shape, bytes). ``load_state`` checks it before decoding anything, so a
truncated or bit-flipped file is one ``ValueError`` naming it, never a half-read state;
a crafted file with a matching checksum still only yields plain arrays and JSON (dtype
names are checked, nothing is called or unpickled), and any malformed part is the same
``ValueError``.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import zipfile

import numpy as np
import torch

from trainer.atomic_file import write_atomic

__all__ = ["save_state", "load_state"]

_BITCAST = {torch.bfloat16: torch.int16}


def _encode(obj, arrays: list):
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu()
        dtype = str(t.dtype).removeprefix("torch.")
        if t.dtype in _BITCAST:
            t = t.view(_BITCAST[t.dtype])
        arrays.append(t.contiguous().numpy())
        return {"__tensor__": len(arrays) - 1, "dtype": dtype}
    if isinstance(obj, np.ndarray):
        arrays.append(obj)
        return {"__array__": len(arrays) - 1}
    if isinstance(obj, dict):
        if all(isinstance(k, str) for k in obj):
            return {"__dict__": {k: _encode(v, arrays) for k, v in obj.items()}}
        return {"__items__": [[_encode(k, arrays), _encode(v, arrays)] for k, v in obj.items()]}
    if isinstance(obj, tuple):
        return {"__tuple__": [_encode(v, arrays) for v in obj]}
    if isinstance(obj, list):
        return [_encode(v, arrays) for v in obj]
    if isinstance(obj, (np.integer, np.floating)):
        return obj.item()
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(f"cannot store {type(obj).__name__} in a state file")


def _decode(obj, arrays):
    if isinstance(obj, list):
        return [_decode(v, arrays) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if "__tensor__" in obj:
        dtype = getattr(torch, str(obj["dtype"]), None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"unknown tensor dtype {obj['dtype']!r}")
        t = torch.from_numpy(np.array(arrays[f"a{obj['__tensor__']}"]))
        return t.view(dtype) if dtype in _BITCAST else t
    if "__array__" in obj:
        return np.array(arrays[f"a{obj['__array__']}"])
    if "__tuple__" in obj:
        return tuple(_decode(v, arrays) for v in obj["__tuple__"])
    if "__items__" in obj:
        return {_decode(k, arrays): _decode(v, arrays) for k, v in obj["__items__"]}
    return {k: _decode(v, arrays) for k, v in obj["__dict__"].items()}


def _digest(meta: bytes, arrays: list[np.ndarray]) -> np.ndarray:
    h = hashlib.sha256(meta)
    for a in arrays:
        h.update(f"|{a.dtype.str}|{a.shape}|".encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return np.frombuffer(h.digest(), dtype=np.uint8)


def save_state(path: str | os.PathLike, state) -> None:
    """Write ``state`` to ``path`` atomically (NOTE [atomic files]), checksummed
    (NOTE [checksummed state files]).

    Raises:
        TypeError: for an object that is not a tensor, array, dict, list, tuple or JSON scalar.
        OSError: the file cannot be written (the previous one at ``path`` is kept).
    """
    arrays: list = []
    meta = json.dumps(_encode(state, arrays)).encode()
    buf = io.BytesIO()
    np.savez(buf, meta=np.frombuffer(meta, dtype=np.uint8), sha256=_digest(meta, arrays),
             **{f"a{i}": a for i, a in enumerate(arrays)})
    write_atomic(path, buf.getbuffer(), fsync=True)


def load_state(path: str | os.PathLike):
    """Read a state written by ``save_state`` after checking its checksum (no pickle involved).

    Raises:
        ValueError: one line naming ``path`` if it is missing, not a state file, truncated,
            damaged or malformed (NOTE [checksummed state files]).
    """
    try:
        with np.load(path, allow_pickle=False) as files:
            meta = bytes(files["meta"])
            count = sum(1 for name in files.files if name.startswith("a"))
            arrays = {f"a{i}": files[f"a{i}"] for i in range(count)}
            if not np.array_equal(files["sha256"], _digest(meta, list(arrays.values()))):
                raise ValueError("checksum mismatch: the file is damaged")
        return _decode(json.loads(meta.decode()), arrays)
    except (OSError, EOFError, KeyError, ValueError, TypeError, AttributeError, IndexError, RecursionError,
            zipfile.BadZipFile, UnicodeDecodeError) as exc:
        raise ValueError(f"{path} is not a valid cachepipe state file ({type(exc).__name__}: {exc})") from None
