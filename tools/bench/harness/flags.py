"""List-valued flags of the benchmarks: one rule for a comma-separated choice."""
from __future__ import annotations

from collections.abc import Iterable

from tools.cli import UsageError

__all__ = ["choices", "comms"]


def choices(flag: str, text: str, valid: Iterable[str]) -> list[str]:
    """``"a, b"`` -> ``["a", "b"]``, each of ``valid``, none twice.

    Raises:
        UsageError: naming ``flag``: empty, unknown names (the valid ones are listed) or a repeat.
    """
    valid = list(valid)
    chosen = [c.strip() for c in text.split(",") if c.strip()]
    bad = [c for c in chosen if c not in valid]
    if not chosen or bad:
        raise UsageError(f"{flag} {text!r}: unknown {bad or 'empty list'}; valid: {valid}")
    if len(set(chosen)) != len(chosen):
        raise UsageError(f"{flag} {text!r}: a name is listed twice")
    return chosen


def comms(text: str, flag: str = "--comm") -> list[str]:
    """The exchange algorithms of ``--comm dense,hitopk`` (the trainer's choices)."""
    from trainer.config import comm_choices

    return choices(flag, text, comm_choices())
