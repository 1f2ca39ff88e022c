"""Fused runs: many runs of one shape trained at once (vmap over seeds and hyperparameters).

grouping (bsresearch.fused.grouping): which pending runs of a sweep train together, and how many at once.
"""
