"""Pieces of one benchmark each that do not fit its module: ``<benchmark>_<piece>.py``,
imported by that benchmark alone (what two benchmarks share is ``tools/bench/harness/``)."""
