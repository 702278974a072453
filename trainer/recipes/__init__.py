"""Recipe files: load by name (``trainer/recipes/<name>.yaml``) or path, then override.

Example:
    >>> r = load_recipe("dawnbench28")
    >>> r = override(r, epochs=1, size=64, sets=["optim.lr=0.5", "phases.0.powersgd_rank=4"])
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import yaml

from trainer.config import Recipe, option_keys
from trainer.recipes.parse import from_dict

__all__ = ["RECIPE_DIR", "available", "from_dict", "load_recipe", "override", "parse_yaml", "recipe_from_dict"]

RECIPE_DIR = Path(__file__).resolve().parent
# A warm-up is given in epochs or in steps (NOTE [warm-ups in steps] in trainer/schedules.py):
# a --set of one form replaces the recipe's other form instead of clashing with it.
_ONE_OF = ({"warmup_epochs", "warmup_steps"}, {"density_warmup_epochs", "density_warmup_steps"})


class _Loader(yaml.SafeLoader):
    """NOTE [numbers in recipes]: PyYAML follows YAML 1.1, whose floats need a dot: ``1e-5``,
    and ``1e-05`` (how Python writes 0.00001, which ``--lr 0.00001`` hands to ``--set``) are
    strings there, so ``optim.lr: 1e-5`` was refused as "must be a number". This loader adds
    YAML 1.2's exponent form (``1e-5``, ``2E3``, ``+1e-05``) to the float resolver; a quoted
    ``'1e-5'`` stays a string, as YAML says."""


_Loader.add_implicit_resolver("tag:yaml.org,2002:float",
                              re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
                              list("-+0123456789."))


def parse_yaml(text: str):
    """``text`` parsed as YAML, exponent-form numbers as floats (NOTE [numbers in recipes]).

    Raises:
        yaml.YAMLError: not valid YAML.
    """
    return yaml.load(text, Loader=_Loader)  # a SafeLoader: no Python objects


def available() -> list[str]:
    """Names of the recipes shipped with cachepipe."""
    return sorted(p.stem for p in RECIPE_DIR.glob("*.yaml"))


def load_recipe(name_or_path: str | os.PathLike) -> Recipe:
    """Load a shipped recipe by name, or a YAML file by path.

    Raises:
        ValueError: unknown name (lists the shipped ones), unreadable YAML, unknown keys or
            impossible values (one line saying what to fix).
    """
    text = str(name_or_path)
    path = Path(text)
    if not (text.endswith((".yaml", ".yml")) or os.sep in text):
        path = RECIPE_DIR / f"{text}.yaml"
        if not path.is_file():
            raise ValueError(f"unknown recipe {text!r}; shipped: {available()} (or pass a path to a .yaml file)")
    if not path.is_file():
        raise ValueError(f"recipe file {str(path)!r} does not exist")
    try:
        data = parse_yaml(path.read_text())
    except yaml.YAMLError as exc:
        raise ValueError(f"recipe {path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    return from_dict(data, path.stem)


def _parse_value(text: str):
    return parse_yaml(text)


def override(recipe: Recipe, *, epochs: int | None = None, comm: str | None = None, density: float | None = None,
             selector: str | None = None, batch_size: int | None = None, size: int | None = None,
             powersgd_rank: int | None = None, sets: list[str] | tuple[str, ...] = ()) -> Recipe:
    """Return ``recipe`` with single fields replaced.

    ``epochs``, ``comm``, ``density``, ``selector``, ``batch_size``, ``size`` and ``powersgd_rank`` apply to
    every phase (``epochs=N`` makes every phase N epochs long). Each ``sets`` entry is
    ``section.field=value`` (``optim.lr=0.2``) or ``phases.I.field=value``; the value is
    parsed as YAML. Setting a warm-up in steps drops the recipe's warm-up in epochs, and
    the other way round.

    Raises:
        ValueError: for a malformed assignment, an unknown field or an impossible value.
    """
    data = _jsonable(recipe.to_dict())
    for phase in data["phases"]:
        for key, value in (("epochs", epochs), ("comm", comm), ("density", density), ("selector", selector),
                           ("batch_size", batch_size), ("size", size), ("powersgd_rank", powersgd_rank)):
            if value is not None:
                phase[key] = value
    for item in sets:
        key, sep, value = item.partition("=")
        parts = key.strip().split(".")
        if not sep or len(parts) not in (2, 3):
            raise ValueError(f"--set {item!r}: expected section.field=value or phases.I.field=value")
        target = data
        try:
            for part in parts[:-1]:
                target = target[int(part)] if isinstance(target, list) else target[part]
        except (KeyError, IndexError, ValueError):
            raise ValueError(f"--set {item!r}: no such section {'.'.join(parts[:-1])!r}") from None
        if parts[0] == "phases" and isinstance(target, dict) and parts[-1] in option_keys():
            pass  # an algorithm's option (NOTE [algorithm options in a recipe] in trainer/config.py)
        elif not isinstance(target, dict) or parts[-1] not in target:
            valid = sorted(target) if isinstance(target, dict) else []
            raise ValueError(f"--set {item!r}: unknown field {parts[-1]!r}; valid: {valid}")
        for group in _ONE_OF:
            if parts[-1] in group:
                target.update(dict.fromkeys(group - {parts[-1]}))
        target[parts[-1]] = _parse_value(value)
    data["phases"] = [dict(p) for p in data["phases"]]
    return from_dict(_jsonable(data), recipe.name)


def _jsonable(data):
    if isinstance(data, dict):
        return {k: _jsonable(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_jsonable(v) for v in data]
    return data


def recipe_from_dict(data: dict, name: str) -> Recipe:
    """Rebuild a recipe saved by ``Recipe.to_dict`` (checkpoints, metrics)."""
    return from_dict(_jsonable(data), name)

