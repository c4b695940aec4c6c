"""Numerical utilities; :mod:`pyro_ext.ops.stats` mirrors :mod:`pyro.ops.stats`."""

from .curvature import hessian_diagonal
from .stats import kernel_stein_discrepancy

__all__ = ["hessian_diagonal", "kernel_stein_discrepancy"]
