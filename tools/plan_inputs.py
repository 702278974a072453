"""``cachepipe plan``'s flags, resolved once into what ``tools/plan_model.py`` prices.

NOTE [plan inputs]: every number has one source, said in the printed header: a flag, else
the ``--preset`` testbed (``comm/testbeds/``), else a measurement (``--links``: ``bench
comm --json`` rows fitted by ``comm.cost_model.fit_allgather``; ``--profile``: ``bench
train --json`` rows), else a stated default. ``bench`` JSON is read as a list of rows or
as an object with ``"rows"``. A bad value is one line naming its flag (exit 2).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tools.cli import UsageError

if TYPE_CHECKING:
    from tools.plan_model import Cluster, Workload
    from trainer.config import Recipe

__all__ = ["Plan", "configure_inputs", "read_rows", "resolve"]

DEFAULT_LATENCY_US = {"inter": 50.0, "intra": 5.0}  # the seed testbed's assumptions (comm/testbeds/mlsys21.json)
DEFAULT_SELECT_NS = 0.15  # MSTopK on a V100-class GPU (mlsys21.json, gamma_ns)
IMAGENET_FILES = 1_281_167  # ImageNet-1k's training images
DEFAULT_FILE_KB = 110.0  # ImageNet-1k's average training JPEG
DEFAULT_SOURCE_MB_S = 300.0  # a shared NFS server: a few hundred MB/s (docs/DESIGN.md)


def configure_inputs(parser: argparse.ArgumentParser) -> None:
    """Add the cluster, model and data flags (every default said in its help)."""
    from comm.testbed import available, get_testbed

    c = parser.add_argument_group("cluster (a --preset's values unless given)")
    beds = "; ".join(f"{n}: {get_testbed(n).title}" for n in available())
    c.add_argument("--preset", default=None, help=f"a testbed a paper measured on ({beds}); default none")
    c.add_argument("--nodes", type=int, default=None, help="nodes (default: the preset's; required without one)")
    c.add_argument("--local-size", type=int, default=None,
                   help="GPUs per node (default: the preset's; required without)")
    for level, what in (("inter", "between nodes"), ("intra", "inside a node")):
        c.add_argument(f"--{level}-gbit", type=float, default=None,
                       help=f"link rate {what}, Gbit/s (default: the preset's or --links' fit; required without)")
        c.add_argument(f"--{level}-latency-us", type=float, default=None,
                       help=f"one message's latency {what}, us (default: the preset's, --links' fit, else "
                            f"{DEFAULT_LATENCY_US[level]:g})")
    c.add_argument("--links", default=None, metavar="PATH",
                   help="fit the links and the selection to `cachepipe bench comm --json` rows (default: none)")
    c.add_argument("--value-bytes", type=int, default=None, choices=[2, 4],
                   help="bytes of a gradient value on the wire (default: the preset's, else 4)")
    c.add_argument("--select-ns", type=float, default=None,
                   help=f"top-k selection per element, ns (default: the preset's, --links' fit, else "
                        f"{DEFAULT_SELECT_NS:g}: MSTopK on a V100)")
    c.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="a library parameter of the testbed files (e.g. overhead_ms=20, flow_gbit=5, "
                        "overlap_share=0.5; docs/plan.md); default none")
    w = parser.add_argument_group("model and compute")
    w.add_argument("--model", default=None, help="a model of trainer.models, counted by the model code "
                                                 "(default: the recipe's; required without --params)")
    w.add_argument("--params", type=int, default=None, help="gradient elements, instead of --model (default: none)")
    w.add_argument("--classes", type=int, default=1000, help="classifier outputs of --model")
    w.add_argument("--gpu-images-per-s", type=float, default=None,
                   help="single-GPU training throughput at --size (default: the preset's rates for the model)")
    w.add_argument("--profile", default=None, metavar="PATH",
                   help="measured compute from `cachepipe bench train --json` rows (default: none)")
    w.add_argument("--size", type=int, default=None,
                   help="image side, px (default: the recipe's first phase, else 224)")
    w.add_argument("--batch-size", type=int, default=None,
                   help="images per GPU per step (default: the recipe's first phase; required without)")
    w.add_argument("--global-batch-size", type=int, default=None,
                   help="images per step over all GPUs, instead of --batch-size (must divide; default: none)")
    from comm.registry import ALGORITHMS

    own = ", ".join(f"{n} {a.density:g}" for n, a in ALGORITHMS.items() if a.sparse and a.cost is not None)
    w.add_argument("--density", type=float, default=None, help=f"sparse density (default: each algorithm's own: {own})")
    w.add_argument("--recipe", default=None, help="a recipe name or YAML path: the whole run per phase (default: none)")
    d = parser.add_argument_group("data")
    d.add_argument("--files", type=int, default=IMAGENET_FILES, help="training images (ImageNet-1k's)")
    d.add_argument("--file-kb", type=float, default=DEFAULT_FILE_KB, help="average file size, KB (ImageNet-1k's)")
    d.add_argument("--locality", choices=["global", "node"], default=None,
                   help="the sampling L1 is sized for: global, a full mirror per node; node, each node's partition "
                        "(default: the recipe's train.locality, else global)")
    d.add_argument("--cache-size", type=int, nargs="+", default=None,
                   help="cached shorter sides, px (default: the recipe's, else 256)")
    d.add_argument("--aspect", type=float, default=None, help="average width / height of the images (default: 4/3)")
    d.add_argument("--source-mbyte-per-s", type=float, default=DEFAULT_SOURCE_MB_S,
                   help="the shared source's read bandwidth, MB/s (a shared NFS)")


@dataclass(frozen=True)
class Plan:
    """The resolved inputs of one ``plan`` command."""

    cluster: Cluster
    workload: Workload
    recipe: Recipe | None
    sizing: Callable  # (cache size -> images/s per GPU that reads it) -> one CacheSizing per cached size
    describe: list[str]
    inputs: dict
    title: str


def read_rows(path: str, flag: str) -> list[dict]:
    """The rows of a ``bench --json`` file: a list of rows, or an object with ``"rows"``.

    Raises:
        UsageError: unreadable, not JSON, or neither form (names ``flag``).
    """
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"{flag} {path}: cannot read it as JSON ({exc})") from None
    rows = data.get("rows") if isinstance(data, dict) else data
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
        raise UsageError(f"{flag} {path}: expected a list of rows or an object with a non-empty 'rows' list")
    return rows


def _positive(value, flag: str) -> None:
    if value is not None and not value > 0:
        raise UsageError(f"{flag} {value:g}: must be > 0")


def _fit_links(path: str):
    from comm.cost_model import fit_allgather

    rows = read_rows(path, "--links")
    needed = {"algorithm", "numel", "nodes", "local_size", "median_s"}
    if not all(needed <= set(r) for r in rows):
        raise UsageError(f"--links {path}: rows need {sorted(needed)} (`cachepipe bench comm --json` writes them)")
    value_bytes = 2 if rows[0].get("value_dtype") in ("fp16", "bf16") else 4
    try:
        form, fitted, errors = fit_allgather(rows, value_bytes=value_bytes)
    except ValueError as exc:
        raise UsageError(f"--links {path}: {exc}") from None
    return form, fitted, f"links fitted to {len(rows)} exchanges of {path} ({form} all-gather, median error " \
                         f"{errors[form]:.0%})"


def _profile(path: str) -> dict:
    """Compute measured by ``bench train``: emulated runs' per-exchange breakdown, or the
    throughput mode's single-GPU images/s (its ``synthetic`` row, else the fastest)."""
    rows = [r for r in read_rows(path, "--profile") if not r.get("pipeline")]
    runs = [r for r in rows if "compute_ms" in r and r.get("comm")]
    if runs:
        compute = {r["comm"]: r["compute_ms"] / 1e3 for r in runs}
        update = [r["update_ms"] for r in runs if r.get("update_ms") is not None]
        return {"compute_s": compute, "default_compute_s": compute.get("dense", min(compute.values())),
                "update_s": statistics.median(update) / 1e3 if update else None,
                "overhead_s": statistics.median(r.get("data_ms") or 0.0 for r in runs) / 1e3}
    rates = {r.get("source"): r["images_per_s"] for r in rows if r.get("images_per_s")}
    if not rates:
        raise UsageError(f"--profile {path}: no rows with compute_ms (bench train --emulate) or images_per_s")
    return {"rate": rates.get("synthetic", max(rates.values()))}


def resolve(args: argparse.Namespace) -> Plan:
    """The flags as objects (NOTE [plan inputs]).

    Raises:
        UsageError: one line naming the flag of a bad or missing value.
    """
    from comm.testbed import get_testbed

    _check_values(args)
    bed = _loaded(get_testbed, args.preset, "--preset")
    recipe = _loaded(_load_recipe, args.recipe, "--recipe")
    describe = [f"testbed {bed.name}: {bed.title} ({bed.source})"] if bed else []
    cluster = _cluster(args, bed, describe)
    workload, model = _workload(args, bed, recipe, cluster)
    return Plan(cluster=cluster, workload=workload, recipe=recipe, sizing=_sizing(args, recipe, cluster),
                describe=describe + _lines(cluster, workload, model, recipe),
                inputs=_inputs(args, cluster, workload, model),
                title=f"{cluster.nodes} x {cluster.local_size}, {model or workload.params} at {workload.size} px, "
                      f"batch {workload.batch_size}")


def _check_values(args: argparse.Namespace) -> None:
    for flag in ("nodes", "local_size", "inter_gbit", "intra_gbit", "params", "classes", "gpu_images_per_s", "size",
                 "batch_size", "global_batch_size", "files", "file_kb", "aspect", "source_mbyte_per_s", "select_ns"):
        _positive(getattr(args, flag), "--" + flag.replace("_", "-"))
    for flag in ("inter_latency_us", "intra_latency_us"):
        if getattr(args, flag) is not None and getattr(args, flag) < 0:
            raise UsageError(f"--{flag.replace('_', '-')} {getattr(args, flag):g}: must be >= 0")
    if args.density is not None and not 0 < args.density <= 1:
        raise UsageError(f"--density {args.density:g}: must be in (0, 1]")


def _cluster(args: argparse.Namespace, bed, describe: list[str]):
    """Nodes, links and library: the flags over ``--links``' fit over the testbed."""
    from comm.cost_model import LinkParams
    from comm.step_model import Library
    from comm.testbed import with_parameters
    from tools.plan_model import Cluster

    nodes = args.nodes or (bed.nodes if bed else None)
    local = args.local_size or (bed.local_size if bed else None)
    if nodes is None or local is None:
        raise UsageError(f"{'--nodes' if nodes is None else '--local-size'} is required without --preset")
    library = bed.library if bed else Library()
    link = bed.link if bed else None
    if args.links:
        form, link, said = _fit_links(args.links)
        library = dataclasses.replace(library, allgather=form)
        describe.append(said)
    if link is None and (args.inter_gbit is None or args.intra_gbit is None):
        raise UsageError(f"{'--inter-gbit' if args.inter_gbit is None else '--intra-gbit'} is required without "
                         f"--preset or --links")
    link = link or LinkParams(alpha_intra=DEFAULT_LATENCY_US["intra"] * 1e-6,
                              alpha_inter=DEFAULT_LATENCY_US["inter"] * 1e-6, gamma=DEFAULT_SELECT_NS * 1e-9)
    changes = {k: v for k, v in (
        ("beta_inter", args.inter_gbit and 8 / (args.inter_gbit * 1e9)),
        ("beta_intra", args.intra_gbit and 8 / (args.intra_gbit * 1e9)),
        ("alpha_inter", None if args.inter_latency_us is None else args.inter_latency_us * 1e-6),
        ("alpha_intra", None if args.intra_latency_us is None else args.intra_latency_us * 1e-6),
        ("gamma", args.select_ns and args.select_ns * 1e-9)) if v is not None}
    try:
        library = with_parameters(library, dict(_assignment(s) for s in args.set))
    except ValueError as exc:
        raise UsageError(f"--set {' '.join(args.set)}: {exc}") from None
    return Cluster(nodes=nodes, local_size=local, link=dataclasses.replace(link, **changes), library=library,
                   value_bytes=args.value_bytes or (bed.value_bytes if bed else 4))


def _workload(args: argparse.Namespace, bed, recipe, cluster):
    """Model, batch, size, compute and data set: the flags over the profile over the testbed and recipe."""
    from tools.plan_model import Workload
    from trainer.models.param_counts import param_count

    first = recipe.phases[0] if recipe else None
    model = args.model or (recipe.model.name if recipe and args.params is None else None)
    if args.params is None and model is None:
        raise UsageError("--model or --params is required")
    try:
        params = args.params or param_count(model, args.classes)
    except ValueError as exc:
        raise UsageError(f"--model {model}: {exc}") from None
    size = args.size or (first.size if first else 224)
    batch = args.batch_size or (first.batch_size if first and not args.global_batch_size else None)
    if args.global_batch_size:
        if args.global_batch_size % cluster.gpus:
            raise UsageError(f"--global-batch-size {args.global_batch_size}: does not divide over "
                             f"{cluster.gpus} GPUs ({cluster.nodes} x {cluster.local_size})")
        batch = args.global_batch_size // cluster.gpus
    if batch is None:
        raise UsageError("--batch-size (or --global-batch-size) is required without --recipe")
    profile = _profile(args.profile) if args.profile else {}
    rate = args.gpu_images_per_s or profile.pop("rate", None)
    rates = {size: rate} if rate else (bed.images_per_s.get(model, {}) if bed else {})
    if not rates and "compute_s" not in profile:
        why = f"the preset has no rate for {model}" if bed else "no --preset"
        raise UsageError(f"--gpu-images-per-s is required ({why})")
    if args.files < cluster.gpus * batch:
        raise UsageError(f"--files {args.files}: fewer than one step's {cluster.gpus * batch} images")
    return Workload(params=params, batch_size=batch, size=size, rates=rates, density=args.density,
                    files=args.files, **profile), model


def _load_recipe(name: str):
    from trainer.recipes import load_recipe  # trainer.config costs ~0.25 s: only with --recipe

    return load_recipe(name)


def _loaded(load: Callable, name: str | None, flag: str):
    try:
        return load(name) if name else None
    except ValueError as exc:
        raise UsageError(f"{flag} {name}: {exc}") from None


def _assignment(text: str) -> tuple[str, object]:
    name, sep, value = text.partition("=")
    if not sep:
        raise ValueError(f"expected NAME=VALUE, got {text!r}")
    try:
        return name.strip(), json.loads(value)
    except ValueError:
        return name.strip(), value


def _sizing(args, recipe, cluster) -> Callable:
    from cachepipe.config import CacheConfig
    from cachepipe.sizing import ASPECT, size_cache

    sizes = args.cache_size or (list(recipe.cache_sizes) if recipe else [CacheConfig.cache_size])
    return lambda per_gpu: [size_cache(files=args.files, file_bytes=args.file_kb * 1e3, cache_size=s,
                                       nodes=cluster.nodes, gpus_per_node=cluster.local_size,
                                       images_per_s_per_gpu=per_gpu(s),
                                       source_bytes_per_s=args.source_mbyte_per_s * 1e6,
                                       aspect=args.aspect or ASPECT,
                                       locality=args.locality or (recipe.train.locality if recipe else "global"))
                                       for s in sizes]


def _lines(cluster, workload, model, recipe) -> list[str]:
    link, lib = cluster.link, cluster.library
    rate = lambda beta: "unlimited" if beta <= 0 else f"{8 / beta / 1e9:,.3g} Gbit/s"  # noqa: E731
    compute = ("measured (--profile)" if workload.compute_s else
               ", ".join(f"{r:,.0f} images/s at {s} px" for s, r in sorted(workload.rates.items())))
    sizes = {workload.size} | {p.size for p in recipe.phases} if recipe else {workload.size}
    scaled = sorted(sizes - set(workload.rates)) if not workload.compute_s else []
    if scaled:  # NOTE [compute at other sizes]
        compute += f"; at {', '.join(map(str, scaled))} px scaled by pixels from the nearest measured size"
    return [f"cluster {cluster.nodes} x {cluster.local_size} GPUs; between nodes {rate(link.beta_inter)} + "
            f"{link.alpha_inter * 1e6:,.0f} us, inside {rate(link.beta_intra)} + {link.alpha_intra * 1e6:,.0f} us; "
            f"selection {link.gamma * 1e9:.3g} ns/element; values {cluster.value_bytes} B",
            f"library: one stream at most {lib.flow_gbit or 'the line'} Gbit/s, efficiencies "
            f"{lib.efficiency or 'none'}, exchanges hide behind {lib.overlap_share:.0%} of backward"
            f"{' (not ' + ', '.join(sorted(lib.after_backward)) + ')' if lib.after_backward else ''}, update "
            f"{lib.update_s_per_param * 1e9:.3g} ns/parameter (one GPU {lib.single_update_s_per_param * 1e9:.3g}), "
            f"sparse host work {lib.host_s_per_element * 1e9:.3g} ns/element, overhead {lib.overhead_s * 1e3:.3g} "
            f"ms/step",
            f"model {model or '-'}: {workload.params:,} parameters, batch {workload.batch_size}/GPU at "
            f"{workload.size} px; single GPU {compute}"]


def _inputs(args, cluster, workload, model) -> dict:
    return {"preset": args.preset, "nodes": cluster.nodes, "local_size": cluster.local_size, "gpus": cluster.gpus,
            "model": model, "params": workload.params, "batch_size": workload.batch_size, "size": workload.size,
            "link": dataclasses.asdict(cluster.link), "value_bytes": cluster.value_bytes, "files": workload.files}
