"""Parsed YAML (or a ``Recipe.to_dict``) into a validated :class:`trainer.config.Recipe`.

Unknown sections and keys, wrong types and impossible values are one line naming the
recipe, the section and the field. Fields whose type allows ``None`` (a warm-up given in
epochs *or* steps, NOTE [warm-ups in steps] in trainer/schedules.py) take ``null``.
"""
from __future__ import annotations

import dataclasses

from trainer.config import ModelConfig, OptimConfig, PhaseConfig, Recipe, ScheduleConfig, TrainConfig, option_keys

__all__ = ["from_dict"]

_SECTIONS = {"model": ModelConfig, "optim": OptimConfig, "schedule": ScheduleConfig, "train": TrainConfig}


def _need(ok: bool, msg: str) -> None:
    if not ok:
        raise ValueError(msg)


def from_dict(data: dict, name: str) -> Recipe:
    """Build a ``Recipe`` from parsed YAML, rejecting unknown keys and wrong types.

    Raises:
        ValueError: one line naming the recipe, the section and the field to fix.
    """
    if not isinstance(data, dict):
        raise ValueError(f"recipe {name}: top level must be a mapping with {sorted(_SECTIONS) + ['phases']}")
    unknown = set(data) - set(_SECTIONS) - {"phases", "name"}
    _need(not unknown, f"recipe {name}: unknown section(s) {sorted(unknown)}; valid: {sorted(_SECTIONS) + ['phases']}")
    try:
        kwargs = {key: _section(cls, data.get(key) or {}, f"recipe {name}: {key}") for key, cls in _SECTIONS.items()}
        phases = data.get("phases")
        _need(isinstance(phases, (list, tuple)) and phases, f"recipe {name}: 'phases' must be a non-empty list")
        kwargs["phases"] = tuple(_phase(p, f"recipe {name}: phases[{i}]") for i, p in enumerate(phases))
        return Recipe(name=str(data.get("name", name)), **kwargs)
    except ValueError as exc:
        msg = str(exc)
        raise ValueError(msg if msg.startswith("recipe ") else f"recipe {name}: {msg}") from None


def _phase(values, where: str) -> PhaseConfig:
    """A phase, its algorithm's options taken from their flat keys (NOTE [algorithm options
    in a recipe] in trainer/config.py)."""
    from comm.registry import ALGORITHMS

    _need(isinstance(values, dict), f"{where} must be a mapping; got {type(values).__name__}")
    keys, values = option_keys(), dict(values)
    comm = values.get("comm", PhaseConfig.comm)
    chosen = {keys[k][1].name: _coerce(values.pop(k), keys[k][1], f"{where}.{k}") for k in list(values)
              if k in keys and keys[k][0] == comm}
    for k in [k for k in values if k in keys]:
        del values[k]  # another algorithm's option: ignored
    options = None
    if comm in ALGORITHMS:  # else the phase says the name is unknown
        try:
            options = ALGORITHMS[comm].make_options(**chosen)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
    return _section(PhaseConfig, values, where, options=options, valid=sorted(keys))


def _section(cls, values, where: str, valid: list[str] = (), **extra):
    _need(isinstance(values, dict), f"{where} must be a mapping; got {type(values).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name not in extra}
    unknown = set(values) - set(fields)
    _need(not unknown, f"{where}: unknown key(s) {sorted(unknown)}; valid: {sorted(fields) + list(valid)}")
    kwargs = {k: _coerce(v, fields[k], f"{where}.{k}") for k, v in values.items()} | extra
    try:
        return cls(**kwargs)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


def _coerce(value, f: dataclasses.Field, where: str):
    kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    if kind.endswith(" | None"):
        if value is None:
            return None
        kind = kind[: -len(" | None")]
    if kind == "bool":
        _need(isinstance(value, bool), f"{where} must be true or false; got {value!r}")
        return value
    if kind == "int":
        _need(isinstance(value, int) and not isinstance(value, bool), f"{where} must be an integer; got {value!r}")
        return value
    if kind == "float":
        _need(isinstance(value, (int, float)) and not isinstance(value, bool), f"{where} must be a number; got {value!r}")
        return float(value)
    if kind == "str":
        _need(isinstance(value, str), f"{where} must be a string; got {value!r}")
        return value
    _need(isinstance(value, (list, tuple)), f"{where} must be a list; got {value!r}")
    return tuple(value)
