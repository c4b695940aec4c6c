"""Numerical utilities; :mod:`pyro_ext.ops.stats` mirrors :mod:`pyro.ops.stats`."""

from .stats import kernel_stein_discrepancy

__all__ = ["kernel_stein_discrepancy"]
