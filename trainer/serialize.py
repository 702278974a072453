"""Pickle-free state files: nested dicts/lists of tensors, arrays and JSON scalars in one ``.npz``.

NOTE [no pickle on disk]: checkpoints are read back from disk, so they never go through
pickle (``torch.load`` included). The structure is stored as JSON, every tensor as a
numpy array (``np.load(allow_pickle=False)``); bf16 tensors travel as int16 bit patterns.
"""
from __future__ import annotations

import io
import json
import os
import tempfile
from pathlib import Path

import numpy as np
import torch

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
        dtype = getattr(torch, obj["dtype"])
        t = torch.from_numpy(np.array(arrays[f"a{obj['__tensor__']}"]))
        return t.view(dtype) if dtype in _BITCAST else t
    if "__array__" in obj:
        return np.array(arrays[f"a{obj['__array__']}"])
    if "__tuple__" in obj:
        return tuple(_decode(v, arrays) for v in obj["__tuple__"])
    if "__items__" in obj:
        return {_decode(k, arrays): _decode(v, arrays) for k, v in obj["__items__"]}
    return {k: _decode(v, arrays) for k, v in obj["__dict__"].items()}


def save_state(path: str | os.PathLike, state) -> None:
    """Write ``state`` to ``path`` atomically (temporary file + ``os.replace``).

    Raises:
        TypeError: for an object that is not a tensor, array, dict, list, tuple or JSON scalar.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays: list = []
    meta = json.dumps(_encode(state, arrays)).encode()
    buf = io.BytesIO()
    np.savez(buf, meta=np.frombuffer(meta, dtype=np.uint8), **{f"a{i}": a for i, a in enumerate(arrays)})
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(buf.getbuffer())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_state(path: str | os.PathLike):
    """Read a state written by ``save_state`` (no pickle involved).

    Raises:
        ValueError: if the file is not a state file.
    """
    try:
        with np.load(path, allow_pickle=False) as arrays:
            meta = json.loads(bytes(arrays["meta"]).decode())
            return _decode(meta, arrays)
    except (OSError, KeyError, ValueError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path} is not a cachepipe state file ({exc})") from None
