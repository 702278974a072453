"""What ``cachepipe bench scale`` measures, as plain functions (the bench module is their front).

- ``tree.py``: ImageFolder trees of N files, hard links to one small JPEG per class folder.
- ``probe.py``: one measurement in a fresh process (``python -m tools.scale.probe WHAT ...``),
  so that its RSS, PSS and USS are that process's own; prints one JSON line.
- ``measure.py``: the figures of one tree (each from a probe) and the growth between sizes.
"""
