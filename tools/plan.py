"""``cachepipe plan``: a cluster on paper before it is rented (docs/plan.md).

Per exchange algorithm the step model's step (compute, selection, exchange, what backward
hides, update, overhead), throughput, scaling efficiency and epoch time; with
``--recipe`` the whole run phase by phase and each phase's choice by ``--comm auto``'s rule; the
data side (L2 and L1 per node, warm-up, Redis servers). ``--preset`` names a testbed a
paper measured on (``comm/testbeds/``); flags override its values. ``--validate``
prints the step model against the papers' tables. Pure computation: no GPU, no Redis,
no network. The numbers are worked out in ``tools/plan_model.py``.
"""
from __future__ import annotations

import argparse
import dataclasses
import json

from tools.plan_inputs import configure_inputs, resolve
from tools.writable import add_json_flag, check_writable, write_output

__all__ = ["configure", "main"]

PLOT_NODES = [1, 2, 4, 8, 16, 32, 64]  # the seed's Fig. 7/8 span, and beyond its 16 nodes
# (row key, header, format, scale): seconds are printed in ms
_COLUMNS = [("algorithm", "algorithm", "{}", None), ("images_per_s", "images/s", "{:,.0f}", None),
            ("scaling_efficiency", "SE", "{:.1%}", None), ("step_s", "step ms", "{:.1f}", 1e3),
            ("compute_s", "compute ms", "{:.1f}", 1e3), ("selection_s", "selection ms", "{:.2f}", 1e3),
            ("exchange_s", "exchange ms", "{:.1f}", 1e3), ("exposed_exchange_s", "exposed ms", "{:.1f}", 1e3),
            ("overlapped_s", "hidden ms", "{:.1f}", 1e3), ("update_s", "update ms", "{:.1f}", 1e3),
            ("overhead_s", "overhead ms", "{:.1f}", 1e3)]


def configure(parser: argparse.ArgumentParser) -> None:
    """Add ``plan``'s flags (tools/plan_inputs.py, and the outputs)."""
    configure_inputs(parser)
    add_json_flag(parser, "one row per algorithm (with --recipe: per run, and auto)")
    parser.add_argument("--plot", default=None,
                        help="write scaling efficiency vs nodes (1-64) per algorithm as a PNG here; default none")
    parser.add_argument("--validate", action="store_true",
                        help="print the step model against the papers' published tables and exit (default: off)")


def main(args: argparse.Namespace) -> int:
    """Print the plan (and write ``--json``, ``--plot``); 0, or a ``UsageError`` (exit 2).

    Raises:
        UsageError: a bad flag, one line naming it (NOTE [plan inputs] in tools/plan_inputs.py).
    """
    check_writable(args.json, "--json")
    check_writable(args.plot, "--plot")
    if args.validate:
        _print_validation()
        return 0
    plan = resolve(args)
    from tools.plan_model import algorithm_rows, recipe_rows

    rows = recipe_rows(plan.cluster, plan.workload, plan.recipe) if plan.recipe else \
        algorithm_rows(plan.cluster, plan.workload)
    data = [dataclasses.asdict(s) for s in plan.sizing(lambda size: _feed(rows, size) / plan.cluster.gpus)]
    for line in plan.describe:
        print(line)
    if plan.recipe:
        print(f"recipe {plan.recipe.name}: each algorithm for the whole run (step-weighted means per step), and auto")
    print(_table(rows, "run_s" if plan.recipe else "epoch_s"))
    if plan.recipe:
        _print_auto(rows[-1])
    _print_data(data)
    inputs = plan.inputs | {"data": data}
    if args.json:
        write_output(args.json, json.dumps([r | inputs for r in rows], indent=1), "--json")
    if args.plot:
        from tools.plan_model import scaling_curve
        from tools.plan_plot import plot_scaling

        curves = scaling_curve(plan.cluster, plan.workload, PLOT_NODES)
        plot_scaling(args.plot, PLOT_NODES, curves, plan.title)
    return 0


def _table(rows: list[dict], last: str) -> str:
    columns = _COLUMNS + [(last, "run s" if last == "run_s" else "epoch s", "{:,.1f}", None)]
    lines = ["| " + " | ".join(h for _, h, _, _ in columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        lines.append("| " + " | ".join(fmt.format(r[k] * scale if scale else r[k]) for k, _, fmt, scale in columns)
                     + " |")
    return "\n".join(lines)


def _feed(rows: list[dict], cache_size: int) -> float:
    """The fastest images/s that reads ``cache_size``: of the phases that read it (a
    recipe), else of the algorithms."""
    phases = [p for r in rows for p in r.get("phases", ()) if p["cache_size"] == cache_size]
    return max(r["images_per_s"] for r in phases or rows)


def _print_data(data: list[dict]) -> None:
    for s in data:
        print(f"data at {s['cache_size']} px: {s['sample_bytes'] / 1024:.0f} KiB a sample in L2, "
              f"L2 {s['l2_bytes_per_node'] / 2**30:,.1f} GiB and L1 {s['l1_bytes_per_node'] / 2**30:,.1f} GiB "
              f"per node ({'its partition: node-local sampling' if s.get('locality') == 'node' else 'a full mirror: global sampling'}), warm-up {s['warmup_s'] / 60:,.1f} min of source reads, {s['servers_per_node']} Redis "
              f"server(s) per node for {s['feed_bytes_per_s'] / 1e9:.2f} GB/s")


def _print_auto(run: dict) -> None:
    print(f"auto: --comm auto's rule on these step times, per phase ({run['run_steps']:,} steps, "
          f"{run['run_s'] / 60:.1f} min):")
    for p in run["phases"]:
        print(f"  phase {p['phase']}: {p['epochs']} epoch(s) at {p['size']} px, batch {p['batch_size']}, "
              f"{p['steps']:,} steps: {p['comm']} ({p.get('reason', 'fixed by the recipe')})")


def _print_validation() -> None:
    from comm.plan_validation import available, check, load

    for name in available():
        data = load(name)
        rows = check(name)
        print(f"{data['paper']} on testbed {data['testbed']} (tolerance {data['tolerance']:.0%}):")
        print("| table | row | system | paper | predicted | ratio |\n|---|---|---|---|---|---|")
        for c in rows:
            print(f"| {c.table} | {c.row} | {c.system} | {c.paper:,.0f} | {c.predicted:,.0f} | {c.ratio:.3f} |")
        worst = max(rows, key=lambda c: abs(c.ratio - 1))
        print(f"worst: {worst.row} {worst.system} at {worst.ratio:.3f}\n")

