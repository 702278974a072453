"""Gradient exchange for data-parallel training: top-k selectors, dense/hierarchical/sparse
collectives, error feedback, tensor fusion, a DDP comm hook and the OMGS planner.

Depends on torch only; knows nothing about data.
"""
