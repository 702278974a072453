"""The registry of benchmarks: the only list of ``cachepipe bench`` subcommands.

NOTE [benchmark registry]: a benchmark is one module of ``tools/bench/`` with
``configure(parser)`` (its own flags only) and ``run(args) -> Result``, plus one
:func:`register_benchmark` line (``tools/bench/__init__.py`` for the built-in ones). The
command's list, its help and its checks read the registry; the harness adds the flags
every benchmark shares (``--json``; ``--plot`` where it draws a figure; the cluster flags
of NOTE [emulate flag] where it runs ranks) and owns the output (NOTE [benchmark result
document]). Benchmarks never import each other: what two of them need lives in
``tools/bench/harness/``.
"""
from __future__ import annotations

from dataclasses import dataclass

from tools.bench.harness.emulate import ClusterFlags

__all__ = ["BENCHMARKS", "Benchmark", "register_benchmark"]


@dataclass(frozen=True)
class Benchmark:
    """One entry: the module (imported only when chosen), its one-line help, the cluster
    flags it takes (None: none) and whether it draws a ``--plot`` figure."""

    module: str
    help: str
    cluster: ClusterFlags | None = None
    plot: bool = False


BENCHMARKS: dict[str, Benchmark] = {}


def register_benchmark(name: str, module: str, help: str, *, cluster: ClusterFlags | None = None,
                       plot: bool = False) -> None:
    """Make ``cachepipe bench NAME`` run ``module`` (NOTE [benchmark registry]).

    Raises:
        ValueError: a malformed name, or one registered to another module.

    Example:
        >>> register_benchmark("tiny", "mypkg.tiny_bench", "a tiny benchmark")  # doctest: +SKIP
    """
    if not name or not name.replace("-", "").isalnum() or name != name.lower():
        raise ValueError(f"a benchmark name is lower-case letters, digits and '-', got {name!r}")
    entry = Benchmark(module, help, cluster, plot)
    if BENCHMARKS.get(name, entry) != entry:
        raise ValueError(f"benchmark {name!r} is registered already (to {BENCHMARKS[name].module})")
    BENCHMARKS[name] = entry
