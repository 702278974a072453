"""``cachepipe bench train --convergence DIR``: accuracy per epoch of exchange algorithms.

Trains ``--recipe`` (default ``demo``) once per ``--comm`` algorithm at ``--density`` (default:
each algorithm's own, NOTE [gtopk's training defaults] in comm/collectives/gtopk.py), same
seed and data, on 4 processes as 2 nodes x 2 (``tools.bench.parts.train_convergence_runs``), then once per
``--variant`` and sparse algorithm: ``--variant NAME:SET[,SET...]`` adds a row
``<comm>-<NAME>`` with extra recipe overrides (``section.field=value``, as ``--set``), for
ablations such as ``--variant nomc:comm.momentum_correction=false``. Dense runs once, as
the reference of ``top1 - dense`` and ``bytes / dense``. Without ``--data`` it trains on a
generated demo dataset in ``DIR/data``.
"""
from __future__ import annotations

import argparse
import re
from pathlib import Path

from tools.bench.harness import Result
from tools.cli import UsageError

__all__ = ["DEFAULT_COMMS", "configure", "run", "parse_variant", "build_runs"]

DEFAULT_COMMS = "dense,hitopk,gtopk"
COLUMNS = ["name", "density", "epochs", "final_top1", "best_top1", "final_loss", "delta_top1_vs_dense",
           "inter_node_bytes", "bytes_vs_dense", "seconds"]
# a comma starts a new assignment only before "a.b=" (values may hold commas: [0.25, 0.0625])
_NEXT_SET = re.compile(r",\s*(?=[A-Za-z_]\w*(?:\.\w+)+\s*=)")
_NAME = re.compile(r"[A-Za-z0-9_.+-]+")


def configure(group: argparse._ArgumentGroup) -> None:
    """Flags of the convergence mode (``--data``, ``--recipe``, ``--comm``, ``--set``,
    ``--epochs`` and ``--density`` come from ``bench train``)."""
    group.add_argument("--convergence", default=None, metavar="DIR",
                       help="train --recipe once per --comm algorithm (default: " + DEFAULT_COMMS + ") and "
                            "--variant into DIR/<name>; plots in DIR/report")
    group.add_argument("--variant", action="append", default=[], metavar="NAME:SET[,SET...]",
                       help="also run every sparse --comm algorithm with these recipe overrides, as row "
                            "<comm>-NAME (repeatable; SET is section.field=value; default: none)")


def parse_variant(text: str) -> tuple[str, list[str]]:
    """``"nomc:comm.a=1,comm.b=[1, 2]"`` -> ``("nomc", ["comm.a=1", "comm.b=[1, 2]"])``.

    Raises:
        ValueError: naming ``--variant`` when the name or the assignments are missing.
    """
    name, sep, sets = text.partition(":")
    if not sep or not _NAME.fullmatch(name.strip()) or not sets.strip():
        raise ValueError(f"--variant {text!r}: expected NAME:section.field=value[,section.field=value...] "
                         f"(NAME of letters, digits, . _ + -)")
    return name.strip(), [s.strip() for s in _NEXT_SET.split(sets) if s.strip()]


def build_runs(base, comms: list[str], *, density: float | None, epochs: int | None, sets: list[str],
               variants: list[tuple[str, list[str]]]) -> list:
    """The comparison's runs: each of ``comms`` with ``sets``, then each variant of every
    sparse algorithm in ``comms`` with its own sets after them.

    Raises:
        ValueError: naming ``--set`` or ``--variant`` for an override the recipe rejects.
    """
    from comm.registry import names
    from tools.bench.parts.train_convergence_runs import ConvergenceRun
    from trainer.recipes import override

    try:
        runs = [ConvergenceRun(c, override(base, comm=c, density=density, epochs=epochs, sets=sets)) for c in comms]
    except ValueError as exc:
        raise ValueError(_naming("--set", exc)) from None
    sparse = names(sparse=True)
    for name, extra in variants:
        for c in comms:
            if c in sparse:
                try:
                    recipe = override(base, comm=c, density=density, epochs=epochs, sets=[*sets, *extra])
                except ValueError as exc:
                    raise ValueError(f"--variant {name}: {_naming('--set', exc)}") from None
                runs.append(ConvergenceRun(f"{c}-{name}", recipe))
    if variants and not any(c in sparse for c in comms):
        raise ValueError(f"--variant applies to the sparse algorithms ({', '.join(sparse)}); --comm has none")
    return runs


def _naming(flag: str, exc: ValueError) -> str:
    msg = str(exc)
    return msg if msg.startswith(flag) else f"{flag}: {msg}"


def _data(args, out: Path, base) -> Path:
    if args.data:
        data = Path(args.data)
        missing = [s for s in ("train", "val") if not (data / s).is_dir()]
        if missing:
            raise ValueError(f"--data {args.data}: no {' or '.join(s + '/' for s in missing)} folder "
                             f"(expected an ImageFolder root with train/ and val/)")
        return data
    data = out / "data"
    if not (data / "val").is_dir():
        from tools.demo_dataset import make_dataset

        make_dataset(data, classes=10, per_class=120, val_per_class=30, size=base.train.cache_size, seed=0)
    return data


def run(args: argparse.Namespace) -> Result:
    from tools.bench.harness.flags import comms as parse_comms
    from tools.bench.parts.train_convergence_runs import compare_convergence
    from trainer.recipes import load_recipe

    out = Path(args.convergence)
    try:
        for flag in ("model", "size", "cache_size", "batch_size"):
            if getattr(args, flag) is not None:
                raise ValueError(f"--{flag.replace('_', '-')} is not a --convergence flag; override the recipe "
                                 f"instead, e.g. --set phases.0.batch_size=N or --set model.name=NAME")
        comms = parse_comms(args.comm or DEFAULT_COMMS)
        if args.epochs is not None and args.epochs < 1:
            raise ValueError(f"--epochs {args.epochs}: must be >= 1")
        if args.density is not None and not 0 < args.density <= 1:
            raise ValueError(f"--density {args.density:g}: must be in (0, 1]")
        variants = [parse_variant(v) for v in args.variant]
        base = load_recipe(args.recipe or "demo")
        runs = build_runs(base, comms, density=args.density, epochs=args.epochs, sets=list(args.set),
                          variants=variants)
        data = _data(args, out, base)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if getattr(args, "plot", None):
        raise UsageError("--plot goes with --emulate; --convergence draws its curves into DIR/report")
    rows = compare_convergence(out, runs, data)
    notes = [f"{base.name} recipe on {data}, 4 processes as 2 nodes x 2 (gloo), same seed and data",
             "top-1 after each epoch:"]
    notes += [f"  {r['name']:<24} " + " ".join(f"{t:.1f}" for t in r["top1"]) for r in rows]
    notes.append(f"curves: {out / 'report'}")
    sparse = [r for r in rows if r.get("delta_top1_vs_dense") is not None and r["name"] != "dense"]
    worst = min(sparse, key=lambda r: r["delta_top1_vs_dense"], default=None)
    return Result(rows, COLUMNS, notes=notes,
                  headline=(f"{worst['name']} {worst['delta_top1_vs_dense']:+.2f} top-1 vs dense after "
                            f"{worst['epochs']} epochs" if worst else None))
