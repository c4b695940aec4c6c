"""
The switch and the loader of the compiled sequential kernels (numba, the ``fast`` extra) that
:mod:`~pyro_ext.timeseries.hmm` and :mod:`~pyro_ext.timeseries.kalman` run on CPU tensors.

A loop over time in torch costs microseconds of dispatch per step whatever the step's size,
and the associative scans that avoid it cost ``O(log T)`` (or ``~sqrt(T)``) batched
operations plus extra arithmetic. For the small states of typical HMMs and DLMs the
textbook recursions compiled to machine code beat both on one CPU thread; the scans stay
the engine on CUDA and wherever the values are traced rather than read.
"""

import contextlib
import functools
import importlib
from collections.abc import Iterator

import numpy as np
import torch

from ..ops.tracing import is_traced

__all__ = ["available", "float64_arrays", "kernels", "sequential_kernels"]

# Switched by :func:`sequential_kernels`.
_enabled = True


def sequential_kernels(enabled: bool = True) -> contextlib.AbstractContextManager[None]:
    """
    Within the block, whether the HMM and Kalman functions of :mod:`pyro_ext.timeseries`
    may run the compiled sequential kernels on CPU tensors (numba, the ``fast`` extra; on by
    default). Turned off, they use the torch scans, as on CUDA and under
    ``torch.func``/``torch.compile``: to compare the two, or to keep float32 arithmetic in
    float32 (the kernels compute in float64 whatever the dtype)::

        with sequential_kernels(False):
            log_lik = hmm_log_likelihood(init_logits, trans_logits, obs_log_probs)

    :param bool enabled: ``False`` for the scans.
    :raises TypeError: at the call, if ``enabled`` is not a bool.
    """
    if not isinstance(enabled, bool):
        raise TypeError(f"enabled must be a bool, got {type(enabled).__name__}")
    return _switched(enabled)


@contextlib.contextmanager
def _switched(enabled: bool) -> Iterator[None]:
    global _enabled
    previous = _enabled
    _enabled = enabled
    try:
        yield
    finally:
        _enabled = previous


@functools.cache
def kernels(name):
    """The compiled kernels' module ``name`` of this package (``"_hmm_kernels"``,
    ``"_kalman_kernels"``), or ``None`` when numba is not installed."""
    try:
        return importlib.import_module(f"{__package__}.{name}")
    except ImportError as e:  # pragma: no cover - exercised only without the fast extra
        if e.name not in ("numba", "llvmlite"):
            raise
        return None


def available(name, *tensors):
    """Whether the kernels ``name`` can evaluate these tensors: enabled, numba installed,
    the tensors on the CPU, and nothing tracing them (``torch.compile``, ``torch.func``
    transforms, ``make_fx`` and fake tensors: any torch dispatch mode), since the kernels
    read their values as numpy arrays (a trace would keep the result as a constant)."""
    if not _enabled:
        return False
    if is_traced():
        return False
    if any(t.device.type != "cpu" for t in tensors):
        return False
    return kernels(name) is not None


def float64_arrays(*tensors):
    """The kernels' float64, C-ordered inputs (no copy where they already are)."""
    return tuple(np.ascontiguousarray(x.detach().to(torch.float64).numpy()) for x in tensors)
