r"""Sample-quality statistics, in the spirit of :mod:`pyro.ops.stats`.

* :func:`kernel_stein_discrepancy` — the IMQ kernel Stein discrepancy of draws to a target.
* :func:`split_rhat` — Pyro's split-:math:`\hat R`, ``NaN`` for chains too short to split.
"""

import math

import torch
from pyro.ops.stats import split_gelman_rubin

from .validation import check_int, check_positive, check_real

__all__ = ["kernel_stein_discrepancy", "split_rhat"]


def _as_float_tensor(value, name):
    value = torch.as_tensor(value)
    if value.is_complex():
        raise ValueError(f"{name} must be real, got dtype {value.dtype}")
    if not value.is_floating_point():
        value = value.to(torch.get_default_dtype())
    return value


def _check_finite(value, name):
    if not bool(torch.isfinite(value).all()):
        raise ValueError(f"{name} contains NaN or infinite values")


def _stein_kernel_sum(x, s, rows, c2, beta):
    r"""
    :math:`\sum_{i \in rows} \sum_j k_0(x_i, x_j)` for the IMQ base kernel, from
    ``(chunk, n)`` matrices only: with :math:`r = x_i - x_j` and :math:`u = c^2 + |r|^2`,

    .. math::
        k_0 = u^{\beta-1} \big[u\, s_i \cdot s_j + 2 \beta\, r \cdot (s_j - s_i)
              - 4 \beta (\beta - 1) |r|^2 / u - 2 \beta d\big].
    """
    xi, si = x[rows], s[rows]
    sq_x = x.pow(2).sum(-1)
    sq_dist = (sq_x[rows].unsqueeze(-1) + sq_x - 2.0 * xi @ x.T).clamp_min(0.0)
    u = c2 + sq_dist
    # r . (s_j - s_i) = x_i . s_j - x_j . s_j - x_i . s_i + x_j . s_i
    r_dot_ds = xi @ s.T - (x * s).sum(-1) - (xi * si).sum(-1, keepdim=True) + si @ x.T
    dim = x.shape[-1]
    bracket = (
        u * (si @ s.T)
        + 2.0 * beta * r_dot_ds
        - 4.0 * beta * (beta - 1.0) * sq_dist / u
        - 2.0 * beta * dim
    )
    k0 = u.pow(beta - 1.0) * bracket
    return k0.sum()


def kernel_stein_discrepancy(samples, score, c=1.0, beta=-0.5, chunk_size=1024):
    r"""
    The kernel Stein discrepancy (KSD) of ``samples`` to a target density :math:`p`,
    with the inverse multiquadric (IMQ) kernel of Gorham & Mackey (2017),
    :math:`k(x, y) = (c^2 + \|x - y\|^2)^\beta`:

    .. math::
        \mathrm{KSD} = \Big(\frac{1}{n^2} \sum_{i,j=1}^n k_0(x_i, x_j)\Big)^{1/2},\qquad
        k_0(x, y) = \nabla_x \cdot \nabla_y k + \nabla_x k \cdot s(y)
                    + \nabla_y k \cdot s(x) + k\, s(x) \cdot s(y),

    where :math:`s = \nabla \log p` is the score of the target; :math:`p` need only be
    known up to a constant. This is the V-statistic, so it is never negative; for exact
    draws from :math:`p` it decays as :math:`O(n^{-1/2})`, and for ``beta`` in
    ``(-1, 0)`` it detects non-convergence of any sequence of samples to a distantly
    dissipative target with Lipschitz score (Gorham & Mackey, 2017). Weighting every draw
    equally, it suits the pooled draws of several MCMC chains.

    Pairs are processed ``chunk_size`` rows at a time, so memory is
    ``O(chunk_size * n)`` rather than ``O(n^2)``; the result is differentiable with
    respect to ``samples`` (and a tensor ``score``).

    Example, on a standard normal target::

        x = torch.randn(1000, 2)
        kernel_stein_discrepancy(x, lambda x: -x)   # about (2 * 2 / 1000) ** 0.5

    :param torch.Tensor samples: draws, shape ``(n, d)``.
    :param score: :math:`\nabla \log p` at the draws, a tensor of shape ``(n, d)``, or
        a callable mapping ``samples`` to it.
    :param float c: the IMQ scale, ``> 0``.
    :param float beta: the IMQ exponent, in ``(-1, 0)``.
    :param int chunk_size: rows of the ``n x n`` kernel matrix evaluated at once.
    :returns: the KSD, a scalar tensor of the dtype and device of the inputs.
    :rtype: torch.Tensor
    :raises TypeError: if ``c`` or ``beta`` is not a number or ``chunk_size`` not an integer.
    :raises ValueError: on inputs of the wrong shape, non-finite values, or invalid
        ``c``, ``beta`` or ``chunk_size``.
    """
    c = check_positive(c, "c")
    beta = check_real(beta, "beta", -1, 0, low_open=True, high_open=True)
    chunk_size = check_int(chunk_size, "chunk_size", low=1)
    samples = _as_float_tensor(samples, "samples")
    if samples.dim() != 2 or samples.shape[0] == 0 or samples.shape[1] == 0:
        raise ValueError(
            f"samples must have shape (n, d) with n, d >= 1, got {tuple(samples.shape)}"
        )
    if callable(score):
        score = score(samples)
    score = _as_float_tensor(score, "score")
    if score.shape != samples.shape:
        raise ValueError(
            f"score must have the shape of samples {tuple(samples.shape)}, got {tuple(score.shape)}"
        )
    if score.device != samples.device:
        raise ValueError(
            f"samples and score must be on the same device, got {samples.device} and {score.device}"
        )
    _check_finite(samples, "samples")
    _check_finite(score, "score")
    dtype = torch.promote_types(samples.dtype, score.dtype)
    # k_0 depends on the draws only through their differences: centring them keeps the
    # expanded squared distances |x|^2 + |y|^2 - 2 x.y accurate.
    x = samples.to(dtype)
    x = x - x.mean(0)
    s = score.to(dtype)
    num_samples = x.shape[0]
    total = sum(
        _stein_kernel_sum(x, s, slice(start, start + chunk_size), c * c, beta)
        for start in range(0, num_samples, chunk_size)
    )
    return (total / num_samples**2).clamp_min(0.0).sqrt()


def split_rhat(samples, chain_dim=0, sample_dim=1):
    r"""
    Split-:math:`\hat R` of ``samples`` across chains: :func:`pyro.ops.stats.split_gelman_rubin`,
    except that chains too short to split (fewer than 4 draws, where Pyro's asserts) give
    ``NaN``, so that a diagnostic never stops a short run.

    :param torch.Tensor samples: draws with a chain dim and a draw dim.
    :param int chain_dim: the chain dimension.
    :param int sample_dim: the draw dimension.
    :returns: :math:`\hat R` of every other coordinate: ``samples``'s shape without the chain
        and draw dims, on its device and of its dtype.
    :rtype: torch.Tensor
    """
    if samples.shape[sample_dim] < 4:
        dims = {chain_dim % samples.dim(), sample_dim % samples.dim()}
        shape = [size for dim, size in enumerate(samples.shape) if dim not in dims]
        return torch.full(shape, math.nan, dtype=samples.dtype, device=samples.device)
    return split_gelman_rubin(samples, chain_dim=chain_dim, sample_dim=sample_dim)
