r"""
Sequential HMM recursions compiled to machine code (numba), for CPU tensors.

The scans of :mod:`pyro_ext.timeseries.hmm` run ``O(log T)`` (or ``~sqrt(T)``) torch
operations, each costing microseconds of dispatch whatever its size. On one CPU thread that
overhead, not arithmetic, is what a small-``K`` HMM spends its time on: a forward step for
``K = 3`` is a dozen multiply-adds. Here the textbook recursions (Rabiner 1989) run as one
compiled loop over time, ``O(T K^2)`` work with no per-step dispatch:

* the forward pass in probability space with per-step normalisation (the scaled forward
  algorithm, Rabiner 1989, eq. 91-92), each step falling back to log space where its
  normaliser would underflow, so structural zeros and extreme emissions stay exact;
* Viterbi (max-product in log space, messages shifted to max 0 per step, backpointers kept,
  then one backtrack);
* forward-backward with per-step rescaled backward messages, giving the posterior
  marginals, the two-slice marginals (per step, or summed for a homogeneous chain) and the
  log-likelihood; the gradient of :math:`\log p(x)` with respect to the log initial,
  transition and emission terms is exactly these expected counts, which is how
  :func:`sequential_log_likelihood` differentiates.

Arithmetic is in float64 whatever the input dtype. Inputs are already normalised (the
``log_softmax`` of :class:`~pyro_ext.timeseries.hmm._Problem`), batch-flattened to ``B``
series and time-last: ``log_init (B, K)``, ``log_trans (B, 1 | T-1, K, K)``, ``obs (B, T,
K)`` with masked emissions already zero. numba is optional (the ``fast`` extra):
:func:`available` says whether this path can run at all.
"""

import numpy as np
import torch

from ._sequential import available as _available
from ._sequential import float64_arrays, kernels

__all__ = ["available", "sequential_log_likelihood"]


def _kernels():
    return kernels("_hmm_kernels")


def available(*tensors):
    """Whether the HMM kernels can evaluate these tensors (see :func:`._sequential.available`)."""
    return _available("_hmm_kernels", *tensors)


def _log_likelihood_values(log_init, log_trans, obs):
    out = np.empty(obs.shape[0])
    _kernels().log_likelihood(*float64_arrays(log_init, log_trans, obs), out)
    return torch.from_numpy(out).to(obs.dtype)


def expected_statistics(log_init, log_trans, obs, pairs=True):
    """``(posterior (B, T, K), pairs, log_norm (B,))`` as float64 torch tensors; ``pairs``
    is shaped as ``log_trans``: ``(B, 1, K, K)`` summed over the steps of a homogeneous
    chain, ``(B, T-1, K, K)`` per step of a time-varying one; with ``pairs=False``, not
    computed (``(B, 0, K, K)``)."""
    num_batch, duration, k_states = obs.shape
    posterior = np.empty((num_batch, duration, k_states))
    steps = log_trans.shape[1] if pairs else 0
    pairs = np.empty((num_batch, steps, k_states, k_states))
    log_norm = np.empty(num_batch)
    _kernels().expected_statistics(
        *float64_arrays(log_init, log_trans, obs), posterior, pairs, log_norm
    )
    return torch.from_numpy(posterior), torch.from_numpy(pairs), torch.from_numpy(log_norm)


def filtered(log_init, log_trans, obs):
    """``(filtered (B, T, K), log_norms (B, T))`` as float64 torch tensors."""
    num_batch, duration, k_states = obs.shape
    probs = np.empty((num_batch, duration, k_states))
    log_norms = np.empty((num_batch, duration))
    out = np.empty(num_batch)
    _kernels().filtered(*float64_arrays(log_init, log_trans, obs), probs, log_norms, out)
    return torch.from_numpy(probs), torch.from_numpy(log_norms)


def viterbi(log_init, log_trans, obs):
    """``(path (B, T) long, log_score (B,) float64)``."""
    num_batch, duration, _ = obs.shape
    path = np.empty((num_batch, duration), dtype=np.int64)
    score = np.empty(num_batch)
    _kernels().viterbi(*float64_arrays(log_init, log_trans, obs), path, score)
    return torch.from_numpy(path), torch.from_numpy(score)


class _LogLikelihood(torch.autograd.Function):
    """``log p(x)`` with its gradient as the expected counts: for the log-partition of the
    chain's exponential family, ``d/d log_init = gamma_1``, ``d/d log_trans[t] = xi_t`` and
    ``d/d obs[t] = gamma_t``. The forward call runs the whole forward-backward pass once,
    since a gradient is wanted, and keeps the counts for ``backward``. A second derivative
    (``create_graph=True``) is taken through ``differentiable``, the torch scans on the same
    inputs."""

    @staticmethod
    def forward(ctx, log_init, log_trans, obs, differentiable):
        # An impossible sequence (log p = -inf) gets NaN counts, so NaN gradients, as from
        # the scans.
        # The two-slice counts only when the transitions want a gradient.
        posterior, pairs, log_norm = expected_statistics(
            log_init, log_trans, obs, pairs=ctx.needs_input_grad[1]
        )
        ctx.save_for_backward(log_init, log_trans, obs)
        ctx.counts = posterior, pairs
        ctx.differentiable = differentiable
        return log_norm.to(obs.dtype)

    @staticmethod
    def backward(ctx, grad):
        log_init, log_trans, obs = ctx.saved_tensors
        if torch.is_grad_enabled():
            # create_graph=True: differentiate the torch scans on the same (graph-connected)
            # inputs instead, whose backward is itself differentiable.
            inputs = (log_init, log_trans, obs)
            wanted = [x for x, need in zip(inputs, ctx.needs_input_grad) if need]
            value = ctx.differentiable(*inputs)
            grads = iter(torch.autograd.grad(value, wanted, grad, create_graph=True))
            return (*(next(grads) if need else None for need in ctx.needs_input_grad[:3]), None)
        posterior, pairs = ctx.counts
        scale = grad.to(torch.float64)
        grad_init = posterior[:, 0] * scale[:, None]
        grad_obs = posterior * scale[:, None, None]
        dtype = obs.dtype
        grad_trans = None
        if ctx.needs_input_grad[1]:
            grad_trans = (pairs * scale[:, None, None, None]).to(dtype)
        return grad_init.to(dtype), grad_trans, grad_obs.to(dtype), None


def sequential_log_likelihood(log_init, log_trans, obs, differentiable):
    """``log p(x)`` ``(B,)`` of normalised, batch-flattened inputs (see the module
    docstring), differentiable; ``differentiable(log_init, log_trans, obs)`` is the torch
    implementation used for second derivatives."""
    if torch.is_grad_enabled() and any(x.requires_grad for x in (log_init, log_trans, obs)):
        return _LogLikelihood.apply(log_init, log_trans, obs, differentiable)
    return _log_likelihood_values(log_init, log_trans, obs)
