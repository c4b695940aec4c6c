r"""Sample-quality statistics, in the spirit of :mod:`pyro.ops.stats`.

* :func:`kernel_stein_discrepancy` — the IMQ kernel Stein discrepancy of draws to a target.
* :func:`split_rhat` — Pyro's split-:math:`\hat R`, ``NaN`` for chains too short to split.
* :func:`sbc_ranks` and :func:`rank_uniformity_test` — simulation-based calibration
  (Talts et al. 2018): the rank of each simulated truth among its posterior draws, and a
  chi-square test that the ranks are uniform.
"""

import math

import torch
from pyro.ops.stats import split_gelman_rubin

from .validation import (
    check_int,
    check_positive,
    check_real,
    check_same_device,
    first_nonfinite,
)

__all__ = ["kernel_stein_discrepancy", "rank_uniformity_test", "sbc_ranks", "split_rhat"]


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
    check_same_device(samples=samples, score=score)
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
    :raises TypeError: if ``samples`` is not a real tensor or a dim not an integer.
    :raises ValueError: if a dim is out of range, the two dims coincide, or ``samples``
        holds NaN or infinite values (which would give a NaN indistinguishable from the
        one of a chain too short to split).
    """
    if not isinstance(samples, torch.Tensor):
        raise TypeError(
            f"samples must be a torch.Tensor with a chain dim and a draw dim, got "
            f"{type(samples).__name__}; convert it with torch.as_tensor"
        )
    if samples.is_complex() or samples.dtype == torch.bool:
        raise TypeError(f"samples must be a real tensor, got dtype {samples.dtype}")
    if samples.dim() < 2:
        raise ValueError(
            f"samples must have a chain dim and a draw dim, got shape {tuple(samples.shape)}"
        )
    rank = samples.dim()
    chain_dim = check_int(chain_dim, "chain_dim", low=-rank, high=rank - 1)
    sample_dim = check_int(sample_dim, "sample_dim", low=-rank, high=rank - 1)
    if chain_dim % rank == sample_dim % rank:
        raise ValueError(
            f"chain_dim and sample_dim must be different dims of samples, both are "
            f"{chain_dim % rank}"
        )
    index = first_nonfinite(samples)
    if index is not None:
        raise ValueError(
            f"samples contains NaN or infinite values (first at index {index}); "
            f"R-hat of such draws is undefined: drop the diverged chains first"
        )
    if samples.shape[sample_dim] < 4:
        dims = {chain_dim % samples.dim(), sample_dim % samples.dim()}
        shape = [size for dim, size in enumerate(samples.shape) if dim not in dims]
        return torch.full(shape, math.nan, dtype=samples.dtype, device=samples.device)
    return split_gelman_rubin(samples, chain_dim=chain_dim, sample_dim=sample_dim)


def sbc_ranks(truth, draws, sample_dim=0):
    r"""
    Simulation-based calibration ranks (Talts et al. 2018, algorithm 1): for each simulated
    truth :math:`\theta^*`, the number of its posterior draws below it,
    :math:`\#\{m : \theta_m < \theta^*\}`, an integer in ``[0, M]``.

    If the draws are ``M`` independent draws from the exact posterior of data simulated
    from :math:`\theta^*`, itself drawn from the prior, the rank is uniform on ``{0, ...,
    M}``. Draws that are autocorrelated make it U-shaped even for an exact sampler: thin
    them (or take independent chains) first.

    :param torch.Tensor truth: the simulated parameters, any shape ``S``.
    :param torch.Tensor draws: posterior draws of shape ``S`` with a draw dimension
        ``sample_dim`` inserted.
    :returns: the ranks, a long tensor of shape ``S``.
    :raises ValueError: if ``draws`` without its ``sample_dim`` does not have ``truth``'s
        shape, or ``sample_dim`` is out of range.
    """
    truth, draws = torch.as_tensor(truth), torch.as_tensor(draws)
    if draws.dim() != truth.dim() + 1:
        raise ValueError(
            f"draws must have one dimension more than truth (the draws'), got shapes "
            f"{tuple(draws.shape)} and {tuple(truth.shape)}"
        )
    sample_dim = check_int(sample_dim, "sample_dim", low=-draws.dim(), high=draws.dim() - 1)
    other = draws.shape[: sample_dim % draws.dim()] + draws.shape[sample_dim % draws.dim() + 1 :]
    if other != truth.shape:
        raise ValueError(
            f"draws without its draw dim (sample_dim={sample_dim}) must have truth's shape "
            f"{tuple(truth.shape)}, got draws of shape {tuple(draws.shape)}"
        )
    truth = truth.unsqueeze(sample_dim)
    return (draws < truth).sum(sample_dim)


def rank_uniformity_test(ranks, num_draws, num_bins=None):
    r"""
    A chi-square test that SBC ranks (:func:`sbc_ranks`) are uniform on ``{0, ...,
    num_draws}``, with the ``num_draws + 1`` possible ranks pooled into ``num_bins`` bins
    of (nearly) equal width; each bin's expected count is proportional to how many ranks it
    holds.

    :param torch.Tensor ranks: ranks of any shape, each one replication.
    :param int num_draws: the number ``M`` of posterior draws each rank was taken among.
    :param int num_bins: bins of the histogram; by default as many as leave 20 expected
        counts per bin (fewer, wider bins see the smooth shapes a miscalibrated sampler
        leaves, a hump or a U, with more power), from 2 to 20 and at most ``M + 1``.
    :returns: ``(p_value, counts)``: the test's p-value (small: not uniform) and the
        histogram's counts.
    :rtype: tuple(float, torch.Tensor)
    """
    from scipy import stats as scipy_stats

    num_draws = check_int(num_draws, "num_draws", low=1)
    ranks = torch.as_tensor(ranks).reshape(-1)
    if ranks.numel() == 0:
        raise ValueError("ranks is empty")
    if ranks.is_floating_point() or ranks.is_complex() or ranks.dtype == torch.bool:
        raise TypeError(f"ranks must be an integer tensor, got dtype {ranks.dtype}")
    if bool((ranks < 0).any()) or bool((ranks > num_draws).any()):
        raise ValueError(f"ranks must lie in [0, num_draws={num_draws}]")
    if num_bins is None:
        num_bins = max(2, min(20, ranks.numel() // 20, num_draws + 1))
    num_bins = check_int(num_bins, "num_bins", low=1, high=num_draws + 1)
    # rank r falls in bin floor(r B / (M + 1)); bin b holds the ranks in [ceil(b (M+1) / B),
    # ceil((b+1) (M+1) / B)).
    bins = ranks.cpu() * num_bins // (num_draws + 1)
    counts = torch.bincount(bins, minlength=num_bins)
    if num_bins == 1:
        return 1.0, counts
    edges = -((-torch.arange(num_bins + 1) * (num_draws + 1)) // num_bins)  # ceil division
    expected = edges.diff().double() * (ranks.numel() / (num_draws + 1))
    p_value = scipy_stats.chisquare(counts.double().numpy(), expected.numpy()).pvalue
    return float(p_value), counts
