"""What every benchmark stands on (NOTE [benchmark registry] in ``registry.py``).

- ``registry.py``: the list of benchmarks; ``runner.py``: parse, run, print, write;
  ``result.py``: :class:`Result`, what a benchmark returns; ``output.py``: the table and
  the result document; ``machine.py``: the machine line; ``render.py``: the benchmark
  pages drawn from result documents.
- ``emulate.py``: the cluster flags (``--emulate MxN[@MBIT]``, ``--burst``,
  ``--job-timeout``); ``cluster.py``: the emulated cluster (network namespaces, ``tc tbf``);
  ``jobs.py``: jobs of ranks on it and its link counters; ``ranks.py``: a rank's entry;
  ``redis.py``: the one place a benchmark or test starts its own ``redis-server``.
- ``data.py``: source trees and warm caches; ``l2.py``: the servers behind a cache's L2 and the
  other L2s measured beside it (``--also-l2``);
  ``procs.py``: CPU and faults from ``/proc``; ``stats.py``: medians of interleaved rounds;
  ``flags.py``: list-valued flags.
"""
from tools.bench.harness.result import Result

__all__ = ["Result"]
