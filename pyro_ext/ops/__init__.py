"""
Reusable numerics, as :mod:`pyro.ops` is for Pyro.

* :mod:`pyro_ext.ops.scan` — parallel prefix scans and reductions (:func:`associative_scan`,
  :func:`vector_scan`, :func:`vector_reduce`), behind the HMM and Kalman recursions.
* :mod:`pyro_ext.ops.semiring` — the sum-product, max-product and index-map semirings of
  discrete HMMs.
* :mod:`pyro_ext.ops.stats` — sample-quality statistics (:func:`kernel_stein_discrepancy`,
  :func:`split_rhat`) and simulation-based calibration (:func:`sbc_ranks`,
  :func:`rank_uniformity_test`); it mirrors :mod:`pyro.ops.stats`.
* :mod:`pyro_ext.ops.curvature` — :func:`hessian_diagonal`.
* :mod:`pyro_ext.ops.validation` — the package's argument checks.
* :mod:`pyro_ext.ops.random` — :func:`rng_preserved`: a side computation that leaves every
  generator (CUDA's too) as it found it.
* :mod:`pyro_ext.ops.tracing` — :func:`is_traced`: whether tensors are being traced
  (``torch.compile``, ``torch.func``, ``make_fx``) rather than computed on.

Example: a parallel prefix scan with addition is the cumulative sum:

>>> from pyro_ext.ops import associative_scan
>>> x = torch.arange(1.0, 9.0)
>>> associative_scan(lambda a, b: (a[0] + b[0],), (x,))[0].tolist()
[1.0, 3.0, 6.0, 10.0, 15.0, 21.0, 28.0, 36.0]
"""

from .curvature import hessian_diagonal
from .random import rng_preserved
from .scan import associative_scan, vector_reduce, vector_scan
from .stats import kernel_stein_discrepancy, rank_uniformity_test, sbc_ranks, split_rhat
from .tracing import is_traced

__all__ = [
    "associative_scan",
    "hessian_diagonal",
    "is_traced",
    "kernel_stein_discrepancy",
    "rank_uniformity_test",
    "rng_preserved",
    "sbc_ranks",
    "split_rhat",
    "vector_reduce",
    "vector_scan",
]
