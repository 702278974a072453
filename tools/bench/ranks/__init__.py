"""The rank entry points of the benchmarks that run jobs of ranks, one module each, named
for its benchmark: ``python -m tools.bench.ranks.NAME SPEC`` (NOTE [benchmark ranks] in
``tools/bench/harness/ranks.py``)."""
