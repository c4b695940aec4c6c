r"""
Pure updates of a Gaussian belief :math:`q(\theta) = \mathcal N(\mu, \Sigma)` over ``D``
flat unconstrained parameters: the steps of the four online variational rules of Jones,
Chang & Murphy (2024), "Bayesian online natural gradient" (BONG), for three families.

Every rule moves the belief towards the expected log-likelihood of one observation (or
minibatch) :math:`L(q) = E_q[\log p(y_t \mid \theta)]`, through its expected gradient
:math:`g = E_q[\nabla_\theta \log p]` and expected Hessian :math:`G = E_q[\nabla^2_\theta
\log p]`. The Hessian is passed as the *precision increment* :math:`-G`: either a factor
``A`` ``(P, D)`` with :math:`-G = A^\top A` (the linearised Hessian :math:`H^\top R^{-1}
H` and the empirical Fisher are of this form), or, for the Monte Carlo Hessian, the dense
matrix (``"full"``) or its diagonal (``"diag"``). Starting from the predicted belief
:math:`(\mu_0, \Lambda_0 = \Sigma_0^{-1})`, one inner step with rate :math:`\alpha` is

* natural (BLR; BONG is its single step from :math:`q_0`, where the KL term vanishes):

  .. math::
      \Lambda_i &= (1 - \alpha)\Lambda_{i-1} + \alpha(\Lambda_0 - G_{i-1}), \\
      \mu_i &= \mu_{i-1} + \alpha \Lambda_i^{-1}\big(g_{i-1} - \Lambda_0(\mu_{i-1} - \mu_0)\big);

* Euclidean in the moments :math:`(\mu, \Sigma)` (BBB; BOG is its single step from
  :math:`q_0`), using :math:`\nabla_\Sigma L = \tfrac12 G` and :math:`\nabla_\Sigma
  (-\mathrm{KL}) = \tfrac12(\Sigma^{-1} - \Sigma_0^{-1})`:

  .. math::
      \mu_i &= \mu_{i-1} + \alpha\big(g_{i-1} - \Lambda_0(\mu_{i-1} - \mu_0)\big), \\
      \Sigma_i &= \Sigma_{i-1} + \tfrac{\alpha}{2}\big(G_{i-1} + \Sigma_{i-1}^{-1} - \Lambda_0\big).

For a linear-Gaussian likelihood one natural step with :math:`\alpha = 1` is Bayes' rule
(the Kalman update), whatever the family's restriction allows.

The families (the slides' table, ``../shared/reference/murphy-bong-slides.md``):

* :class:`FullBelief`: :math:`(\mu, \Sigma)`, the covariance: the natural step from the
  prior with a factored Hessian (BONG, the EKF) is the Kalman update,
  :math:`\Sigma' = \Sigma - \Sigma B^\top (I + B \Sigma B^\top)^{-1} B \Sigma` with
  :math:`B = \sqrt{\alpha} A`, :math:`O(D^2 P)` for ``P < D`` outputs (Woodbury's form of
  :math:`\Lambda_0 + \alpha A^\top A`), and the drift :math:`\Sigma + qI` is exact and
  :math:`O(D^2)`; a dense Hessian, BLR's later steps and BOG/BBB need the precision,
  :math:`O(D^3)`;
* :class:`DiagBelief`: :math:`(\mu, \lambda)` with :math:`\Lambda = \mathrm{diag}(\lambda)`;
  the natural step keeps the diagonal of :math:`-G` (the variational diagonal EKF);
* :class:`DLRBelief`: :math:`\Lambda = \mathrm{diag}(\upsilon) + W W^\top` with ``W``
  ``(D, L)`` (LoFi, Chang et al. 2023): the natural step forms :math:`[W, A^\top]` and
  keeps its top ``L`` singular directions, adding the discarded ones' diagonal to
  :math:`\upsilon` (so the diagonal of the precision is kept exactly). Every operation is
  :math:`O(D (L + P)^2)` time and :math:`O(D (L + P))` memory.
"""

import contextlib
from typing import NamedTuple

import torch


class FullBelief(NamedTuple):
    """A Gaussian with a dense covariance matrix."""

    #: ``(D,)``
    mean: torch.Tensor
    #: ``(D, D)``, float64 whatever the mean's dtype: a network's covariance has a condition
    #: number that float32 round-off turns indefinite within a few dozen updates
    covariance: torch.Tensor


class DiagBelief(NamedTuple):
    """A Gaussian with a diagonal precision."""

    #: ``(D,)``
    mean: torch.Tensor
    #: ``(D,)``, positive
    precision: torch.Tensor


class DLRBelief(NamedTuple):
    r"""A Gaussian with precision :math:`\mathrm{diag}(\upsilon) + W W^\top` (LoFi)."""

    #: ``(D,)``
    mean: torch.Tensor
    #: :math:`\upsilon`, ``(D,)``, positive
    diagonal: torch.Tensor
    #: ``W``, ``(D, L)``
    low_rank: torch.Tensor


Belief = FullBelief | DiagBelief | DLRBelief


class NotPositiveDefiniteError(FloatingPointError):
    """A step left the precision (or covariance) without a Cholesky factor."""


#: while an update is traced into a graph (:func:`deferred_checks`), the flags of the checks
#: that would raise; ``None`` otherwise
_deferred = None


@contextlib.contextmanager
def deferred_checks():
    """
    Inside the body, :func:`require` records each check's flag instead of raising: a
    traced (compiled) update cannot branch on a tensor's value, so it returns the flags'
    conjunction, and the caller redoes an update whose flag is false eagerly, where the
    check raises its error. Yields the list of flags (0-dim bool tensors).
    """
    global _deferred
    outer, _deferred = _deferred, []
    try:
        yield _deferred
    finally:
        _deferred = outer


def checks_deferred() -> bool:
    """Whether :func:`require` records instead of raising (an update is being traced)."""
    return _deferred is not None


def require(ok: torch.Tensor, error) -> None:
    """
    Raise ``error()`` (a function returning the exception) unless every element of the
    bool tensor ``ok`` is true; inside :func:`deferred_checks`, record ``ok.all()``.
    """
    if _deferred is not None:
        _deferred.append(ok.all())
    elif not bool(ok.all()):
        raise error()


def _cholesky(matrix, what):
    """
    The Cholesky factor of ``matrix``, computed in float64 whatever its dtype: a
    network's precisions span orders of magnitude, and a float32 factorisation of a
    matrix that is positive definite on paper fails on round-off. Consumers solve with the
    float64 factor and cast back (:func:`_solve`, :func:`_inverse`).
    """
    factor, info = torch.linalg.cholesky_ex(matrix.to(torch.float64))
    require(
        info == 0,
        lambda: NotPositiveDefiniteError(
            f"the {what} is not positive definite"
            + (" (even in float64)" if matrix.dtype != torch.float64 else "")
        ),
    )
    return factor


def _solve(factor, rhs):
    """``(L L^T)^{-1} rhs`` in float64, returned in ``rhs``'s dtype."""
    return torch.cholesky_solve(rhs.to(factor.dtype), factor).to(rhs.dtype)


def _inverse(factor, dtype):
    return torch.cholesky_inverse(factor).to(dtype)


def _triangular_solve(factor, rhs, upper=False):
    return torch.linalg.solve_triangular(factor, rhs.to(factor.dtype), upper=upper).to(rhs.dtype)


def _sym(matrix):
    return 0.5 * (matrix + matrix.transpose(-1, -2))


# -- dense and diagonal-plus-low-rank algebra ----------------------------------------------
def _dlr_capacitance(belief: DLRBelief, with_gram: bool = False):
    r"""Cholesky factor of :math:`C = I + W^\top \Upsilon^{-1} W` ``(L, L)`` and
    :math:`(\Upsilon^{-1} W)^\top` ``(L, D)``, both in float64 whatever the belief's dtype
    (see :func:`dlr_solve`). The ``(L, D)`` layout keeps the long dimension contiguous, so a
    compiled graph's kernels vectorise along ``D`` (on a ``(D, L)`` row-major array they work
    row by row on ``L`` masked lanes), as :func:`natural_step` builds its stacked columns.

    ``with_gram``: also the Gram matrix :math:`W^\top W` in float64, which LoFi's update
    projects (:func:`project_low_rank`): the scaled and the plain rows are one float64
    buffer, multiplied by :math:`W` in one product. At ``D`` = 100,001 (LoFi rank 10,
    compiled, a fresh process, one-off) that took 6.8-7.9 ms per update; a float64 copy of
    ``W`` and a product for each, 12.7-17.1 ms; one shared copy and two products, 8.6-13.7
    ms: each buffer of ``8 L D`` bytes is mapped, and faulted in, afresh at every call.
    """
    L = belief.low_rank.shape[-1]
    diagonal = belief.diagonal.to(torch.float64)
    eye = torch.eye(L, dtype=torch.float64, device=diagonal.device)
    factors = torch.stack([diagonal.reciprocal(), torch.ones_like(diagonal)])
    # (2, L, D): the scaled rows over the plain ones.
    stacked = belief.low_rank.transpose(-1, -2).to(torch.float64) * factors.unsqueeze(-2)
    scaled, Wt = stacked[0], stacked[1]
    rows = stacked.reshape(2 * L, -1) if with_gram else scaled
    products = rows @ Wt.transpose(-1, -2)
    chol = _cholesky(eye + products[:L], "low-rank capacitance")
    return (chol, scaled, products[L:]) if with_gram else (chol, scaled)


def _dlr_solve64(belief: DLRBelief, rhs: torch.Tensor) -> torch.Tensor:
    """:func:`dlr_solve` of ``rhs`` ``(D, K)``, returned in float64."""
    chol, scaled = _dlr_capacitance(belief)
    r = rhs.to(torch.float64)
    first = r / belief.diagonal.to(torch.float64).unsqueeze(-1)
    return first - scaled.transpose(-1, -2) @ torch.cholesky_solve(scaled @ r, chol)


def dlr_solve(belief: DLRBelief, rhs: torch.Tensor) -> torch.Tensor:
    r"""
    :math:`\Lambda^{-1} r` for :math:`\Lambda = \Upsilon + W W^\top` by Woodbury:
    :math:`\Upsilon^{-1} r - \Upsilon^{-1} W C^{-1} W^\top \Upsilon^{-1} r`. ``rhs`` is
    ``(D,)`` or ``(D, K)``; the result has its dtype.

    Computed in float64 whatever the belief's dtype: where the precision is large along
    ``r`` the two terms nearly cancel (by the factor :math:`1 + a^\top \Upsilon^{-1} a` of
    an observation's whitened Jacobian row :math:`a`, some 1e5 to 1e6 for a wide network),
    and float32 leaves the difference with a relative error of 6e-8 times that factor.
    Measured in float32: LoFi on a 2-25,000-1 tanh network (D = 100,001) had its mean 0.11
    off (largest entry 4.4) after one observation and running to 600 within 30, where the
    float64 filter's stays below 4.4. A right-hand side already rounded to float32 keeps
    that error through any solve: the update's mean, whose right-hand side is a
    combination of the precision's columns, is formed by Kalman's gain instead (see
    :func:`natural_step`).
    """
    vector = rhs.dim() == 1
    r = rhs.unsqueeze(-1) if vector else rhs
    out = _dlr_solve64(belief, r).to(rhs.dtype)
    return out.squeeze(-1) if vector else out


def dlr_matvec(diagonal, low_rank, vector):
    """:math:`(\\Upsilon + W W^T) v`."""
    return diagonal * vector + low_rank @ (low_rank.transpose(-1, -2) @ vector)


def full_precision(belief: FullBelief) -> torch.Tensor:
    r"""The precision :math:`\Sigma^{-1}` ``(D, D)`` of a full belief, in float64
    (:math:`O(D^3)`: the steps that need it are the ones that are :math:`O(D^3)` anyway)."""
    return _sym(_inverse(_cholesky(belief.covariance, "covariance"), torch.float64))


def precision_matvec(belief: Belief, vector: torch.Tensor) -> torch.Tensor:
    """The precision times ``vector`` ``(D,)``."""
    if isinstance(belief, FullBelief):
        chol = _cholesky(belief.covariance, "covariance")
        return _solve(chol, vector.unsqueeze(-1)).squeeze(-1)
    if isinstance(belief, DiagBelief):
        return belief.precision * vector
    return dlr_matvec(belief.diagonal, belief.low_rank, vector)


def covariance_solve(belief: Belief, vector: torch.Tensor) -> torch.Tensor:
    """The covariance times ``vector`` ``(D,)`` (a solve with the precision, except for the
    full family, which holds the covariance)."""
    if isinstance(belief, FullBelief):
        return (belief.covariance @ vector.to(belief.covariance.dtype)).to(vector.dtype)
    if isinstance(belief, DiagBelief):
        return vector / belief.precision
    return dlr_solve(belief, vector)


def covariance(belief: Belief) -> torch.Tensor:
    """The dense covariance ``(D, D)`` (``O(D^2)`` memory whatever the family)."""
    if isinstance(belief, FullBelief):
        # A copy: the caller may write into it, the belief must not change.
        return belief.covariance.to(belief.mean.dtype, copy=True)
    if isinstance(belief, DiagBelief):
        return torch.diag(belief.precision.reciprocal())
    eye = torch.eye(belief.mean.shape[-1], dtype=belief.mean.dtype, device=belief.mean.device)
    return _sym(dlr_solve(belief, eye))


def marginal_variance(belief: Belief) -> torch.Tensor:
    """The diagonal of the covariance ``(D,)``, in ``O(D L^2)`` for the low-rank family."""
    if isinstance(belief, FullBelief):
        return belief.covariance.diagonal().to(belief.mean.dtype, copy=True)
    if isinstance(belief, DiagBelief):
        return belief.precision.reciprocal()
    chol, scaled = _dlr_capacitance(belief)
    # diag(U^-1 W C^-1 W^T U^-1) = row sums of (U^-1 W L^-T)^2 with C = L L^T; in float64,
    # as dlr_solve, since the difference cancels where the variance shrinks most.
    whitened = _triangular_solve(chol, scaled)
    variance = belief.diagonal.to(torch.float64).reciprocal() - whitened.square().sum(0)
    return variance.to(belief.diagonal.dtype)


def quadratic_diagonal(belief: Belief, rows: torch.Tensor) -> torch.Tensor:
    r"""The diagonal of :math:`H \Sigma H^\top` for ``rows`` ``H`` ``(P, D)``: ``(P,)``."""
    if isinstance(belief, DiagBelief):
        return (rows.square() / belief.precision).sum(-1)
    if isinstance(belief, DLRBelief):
        # In float64 to the end (see dlr_solve): the sum is small where the solve cancels.
        solved = _dlr_solve64(belief, rows.transpose(-1, -2)).transpose(-1, -2)
        return (rows.to(torch.float64) * solved).sum(-1).to(rows.dtype)
    solved = covariance_solve_rows(belief, rows)
    return (rows * solved).sum(-1)


def covariance_solve_rows(belief: Belief, rows: torch.Tensor) -> torch.Tensor:
    """:math:`(\\Sigma H^T)^T` for ``rows`` ``H`` ``(P, D)``."""
    if isinstance(belief, FullBelief):
        return (rows.to(belief.covariance.dtype) @ belief.covariance).to(rows.dtype)
    if isinstance(belief, DiagBelief):
        return rows / belief.precision
    return dlr_solve(belief, rows.transpose(-1, -2)).transpose(-1, -2)


def sample(
    belief: Belief,
    num_samples: int,
    generator=None,
    antithetic=False,
    noise: torch.Tensor | None = None,
) -> torch.Tensor:
    r"""
    ``num_samples`` draws ``(S, D)``; ``antithetic=True`` (``S`` even) draws ``S / 2`` and
    reflects them about the mean, :math:`\mu \pm \epsilon`: each half is an exact sample,
    and the average of a function linear in :math:`\theta` is its value at the mean
    exactly. The low-rank family draws exactly in
    :math:`O(D L^2)`: with :math:`V = \Upsilon^{-1/2} W = Q S R^\top` (thin SVD),
    :math:`\theta = \mu + \Upsilon^{-1/2}\big(I + Q((1 + S^2)^{-1/2} - 1) Q^\top\big)
    \epsilon` has covariance :math:`\Upsilon^{-1/2} (I + V V^\top)^{-1} \Upsilon^{-1/2} =
    \Lambda^{-1}`. ``noise``: the standard normal draws ``(S, D)`` to transform (``(S /
    2, D)`` when antithetic) instead of drawing them, as a traced update takes them.
    """
    mean = belief.mean
    if antithetic:
        if num_samples % 2:
            raise ValueError(
                f"antithetic draws come in pairs: num_samples must be even, got {num_samples}"
            )
        half = sample(belief, num_samples // 2, generator, noise=noise) - mean
        return torch.cat([mean + half, mean - half])
    eps = noise
    if eps is None:
        eps = torch.randn(
            (num_samples,) + mean.shape, dtype=mean.dtype, device=mean.device, generator=generator
        )
    if isinstance(belief, FullBelief):
        chol = _cholesky(belief.covariance, "covariance")
        # Sigma = L L^T, so L eps has covariance Sigma.
        return mean + (eps.to(chol.dtype) @ chol.transpose(-1, -2)).to(mean.dtype)
    if isinstance(belief, DiagBelief):
        return mean + eps * belief.precision.rsqrt()
    root = belief.diagonal.rsqrt()
    # V column-major (LAPACK's layout: the SVD then copies nothing), from W row-major. Not
    # through the eigendecomposition of V^T V: in float32 that cancels terms of V's squared
    # size (a draw 1e-3 off where two columns are nearly parallel); in float64 it is exact
    # and saved 14 us of the MNIST bandit's 85 us scoring (one-off), but its (S, D)
    # temporaries would double the memory of a large draw (1,000 at D = 100,001: 2.4 GB).
    V = (belief.low_rank.transpose(-1, -2) * root).contiguous().transpose(-1, -2)
    q, s, _ = torch.linalg.svd(V, full_matrices=False)
    shrink = (1 + s.square()).rsqrt() - 1
    eps = eps + ((eps @ q) * shrink) @ q.transpose(-1, -2)
    return mean + eps * root


# -- prediction: a random-walk drift of the parameters -------------------------------------
def predict_random_walk(belief: Belief, q: torch.Tensor) -> Belief:
    r"""
    The predicted belief after :math:`\theta_t = \theta_{t-1} + \mathcal N(0, q I)`:
    :math:`\Sigma \leftarrow \Sigma + q I`. Exact for every family; for the low-rank one,
    :math:`\Upsilon' = \Upsilon / (1 + q\Upsilon)` and :math:`W' = (\Upsilon'/\Upsilon) W
    L` with :math:`L L^\top = (I + q W^\top (1 + q\Upsilon)^{-1} W)^{-1}` (Woodbury twice),
    so the rank stays ``L``.
    """
    if isinstance(belief, FullBelief):
        cov = belief.covariance
        eye = torch.eye(cov.shape[-1], dtype=cov.dtype, device=cov.device)
        return FullBelief(belief.mean, cov + q * eye)
    if isinstance(belief, DiagBelief):
        return DiagBelief(belief.mean, belief.precision / (1 + q * belief.precision))
    ups, W = belief.diagonal, belief.low_rank
    shrink = 1 / (1 + q * ups)
    eye = torch.eye(W.shape[-1], dtype=W.dtype, device=W.device)
    inner = eye + q * W.transpose(-1, -2) @ (W * shrink.unsqueeze(-1))
    # L L^T = inner^-1: L = chol(inner)^-T (any square root works: only W W^T matters).
    root = _triangular_solve(_cholesky(_sym(inner), "low-rank drift"), eye).transpose(-1, -2)
    return DLRBelief(belief.mean, ups * shrink, (W * shrink.unsqueeze(-1)) @ root)


# -- the steps --------------------------------------------------------------------------------
def project_low_rank(
    diagonal: torch.Tensor, columns: torch.Tensor, rank: int
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""
    The best rank-``rank`` part of :math:`\mathrm{diag}(\upsilon) + C C^\top` (LoFi's
    projection): the top singular directions of ``C`` ``(D, K)`` scaled by their singular
    values; the discarded directions' diagonal is added to :math:`\upsilon`. Returns
    ``(diagonal, W)`` with ``W`` ``(D, rank)`` (zero-padded when ``K < rank``).

    Computed from the Gram matrix :math:`C^\top C = R S^2 R^\top` (``K x K``, in float64)
    by its eigendecomposition: :math:`C R = U S` are the singular directions scaled by
    their singular values. Two products with ``C`` and a ``K x K`` eigendecomposition
    replace a tall SVD, which factorises ``C`` itself and wants it column-major
    (``benchmarks/lofi_projection.py``, compiled, float32: 0.57-0.97 the SVD's time at
    ranks 10 and 20 and ``D`` = 65 to 100,001, 0.82-1.10 at rank 5). Whatever the split, the kept
    and discarded parts sum to :math:`C C^\top`, ``R`` being orthogonal to float64
    round-off; the split itself is that of the float64 Gram matrix, more accurate than a
    float32 SVD (on two nearly parallel columns of norm 900 beside two small ones, the
    projected diagonal is 2e-6 off a float64 SVD's, the float32 SVD's 9e-6).
    """
    Ct = columns.transpose(-1, -2)
    wide = Ct.to(torch.float64)
    return _project_by_gram(diagonal, Ct, wide @ wide.transpose(-1, -2), rank)


def _project_by_gram(diagonal, Ct, gram, rank):
    """:func:`project_low_rank` of the columns ``Ct`` ``(K, D)`` (transposed) given their
    float64 Gram matrix ``gram`` ``(K, K)``."""
    finite = torch.isfinite(gram).all()
    require(
        finite,
        lambda: NotPositiveDefiniteError(
            "the low-rank precision's columns are not finite (or their squared norms "
            "overflow float64)"
        ),
    )
    # A traced update records that flag and goes on: LAPACK's eigh must not see inf.
    gram = torch.where(
        finite, gram, torch.eye(gram.shape[-1], dtype=gram.dtype, device=gram.device)
    )
    _, R = torch.linalg.eigh(gram)
    # eigh sorts ascending; the rows of `scaled` are s_i u_i^T, largest first.
    scaled = R.flip(-1).transpose(-1, -2).to(Ct.dtype) @ Ct
    kept = min(rank, Ct.shape[-2])
    # Row-major, as the belief's other tensors: a compiled update, keyed by row-major
    # inputs, would otherwise copy W at every call.
    W = scaled[:kept].transpose(-1, -2).contiguous()
    if kept < Ct.shape[-2]:
        diagonal = diagonal + scaled[kept:].square().sum(-2)
    if kept < rank:
        W = torch.cat([W, W.new_zeros(W.shape[0], rank - kept)], dim=-1)
    return diagonal, W


def _negative_hessian(current, factor, hessian):
    """``-G`` for the full family (``(D, D)``, in float64) or the diagonal one (``(D,)``):
    ``A^T A`` (its diagonal) from the factor ``A`` ``(P, D)``, otherwise ``-hessian``."""
    if isinstance(current, FullBelief):
        wide = torch.float64
        if factor is not None:
            return factor.transpose(-1, -2).to(wide) @ factor.to(wide)
        return -hessian.to(wide)
    return factor.square().sum(0) if factor is not None else -hessian


def natural_step(
    current: Belief,
    prior: Belief,
    grad: torch.Tensor,
    factor: torch.Tensor | None,
    hessian: torch.Tensor | None,
    lr: float,
    rank: int | None = None,
    coefficients: torch.Tensor | None = None,
) -> Belief:
    r"""
    One natural-gradient (BLR) step from ``current`` towards the ELBO with KL to ``prior``
    (BONG: ``current is prior``). ``factor`` ``A`` ``(P, D)`` gives :math:`-G = A^\top
    A`; otherwise ``hessian`` is :math:`G` itself (dense ``(D, D)`` for the full family,
    its diagonal ``(D,)`` for the diagonal one). ``coefficients`` ``v`` ``(P,)``, where
    ``grad`` is :math:`A^\top v` (the linearised step's whitened residuals, ones for the
    empirical Fisher): given, the low-rank family's first step is formed from the
    precision's columns by Kalman's gain (see below), exact to round-off.
    """
    first = current is prior
    offset = current.mean - prior.mean
    if isinstance(current, FullBelief):
        # In float64: A^T A and the prior precision can differ by orders of magnitude.
        wide = torch.float64
        if first and factor is not None and factor.shape[-2] < factor.shape[-1]:
            # The Kalman update, Woodbury's form of (Sigma^-1 + lr A^T A)^-1: O(D^2 P).
            cov = prior.covariance
            scaled = factor.to(wide) * lr**0.5
            cov_scaled = cov @ scaled.transpose(-1, -2)
            if scaled.shape[-2] == 1:
                # One output (a scalar observation): the innovation is a positive number,
                # so the solve is a division (no factorisation call: it is most of a small
                # compiled update's time).
                innovation = 1 + (scaled @ cov_scaled).squeeze(-1)
                gain = cov_scaled.transpose(-1, -2) / innovation.unsqueeze(-1)
                # The rank-one downdate as a broadcast product, which a compiled update
                # fuses into its kernel (a matrix product would be a library call and a
                # D x D buffer); each entry is the same single product.
                downdate = cov_scaled * gain
            else:
                eye = torch.eye(scaled.shape[-2], dtype=wide, device=cov.device)
                chol = _cholesky(_sym(eye + scaled @ cov_scaled), "innovation covariance")
                gain = _solve(chol, cov_scaled.transpose(-1, -2))
                downdate = cov_scaled @ gain
            new_cov = _sym(cov - downdate)
            # Positive definite on paper; its diagonal is the cheap round-off check.
            require(
                new_cov.diagonal() > 0,
                lambda: NotPositiveDefiniteError("the updated covariance is not positive"),
            )
            step = (new_cov @ grad.to(wide)).to(grad.dtype)
            return FullBelief(current.mean + lr * step, new_cov)
        increment = _negative_hessian(current, factor, hessian)
        prior_precision = full_precision(prior)
        if first:
            precision = prior_precision + lr * increment
        else:
            precision = (1 - lr) * full_precision(current) + lr * (prior_precision + increment)
        precision = _sym(precision)
        direction = grad
        if not first:
            direction = grad - (prior_precision @ offset.to(wide)).to(grad.dtype)
        chol = _cholesky(precision, "updated precision")
        step = _solve(chol, direction.unsqueeze(-1)).squeeze(-1)
        return FullBelief(current.mean + lr * step, _sym(_inverse(chol, wide)))
    if isinstance(current, DiagBelief):
        increment = _negative_hessian(current, factor, hessian)
        if first:
            precision = prior.precision + lr * increment
        else:
            precision = (1 - lr) * current.precision + lr * (prior.precision + increment)
        require(
            precision > 0,
            lambda: NotPositiveDefiniteError("the updated diagonal precision is not positive"),
        )
        direction = grad if first else grad - prior.precision * offset
        return DiagBelief(current.mean + lr * direction / precision, precision)
    # diagonal plus low rank: stack the precision's low-rank columns, then project
    if factor is None:
        raise ValueError("the low-rank family needs a factored Hessian (hessian='lin' or 'ef')")
    rank = current.low_rank.shape[-1] if rank is None else rank
    scaled_factor = factor * lr**0.5
    if first:
        diagonal = prior.diagonal
        columns = torch.cat([prior.low_rank.transpose(-1, -2), scaled_factor], dim=-2)
    else:
        diagonal = (1 - lr) * current.diagonal + lr * prior.diagonal
        columns = torch.cat(
            [
                (1 - lr) ** 0.5 * current.low_rank.transpose(-1, -2),
                lr**0.5 * prior.low_rank.transpose(-1, -2),
                scaled_factor,
            ],
            dim=-2,
        )
    columns = columns.transpose(-1, -2)
    # The mean moves with the precision before the projection (exact Bayes in the
    # conjugate case, as LoFi's gain); the belief keeps the projected one.
    unprojected = DLRBelief(current.mean, diagonal, columns)
    if first and coefficients is not None:
        # grad = A^T v = C E with E = [0; v / sqrt(lr)], so Lambda^{-1} grad = Upsilon^{-1} C
        # (I + C^T Upsilon^{-1} C)^{-1} E (Kalman's gain; "push-through"): a combination of
        # the columns with no subtraction of nearly equal D-vectors. Woodbury's form of the
        # same solve, from grad rounded to float32, keeps a relative error of 6e-8 times
        # 1 + a^T Upsilon^{-1} a (a an observation's whitened Jacobian row), which a wide
        # network makes 1e6 or more (measured: a 20,000-weight linear regression's mean 34 %
        # off after three observations, 1,400 % with the float32 solve before).
        chol, scaled, gram = _dlr_capacitance(unprojected, with_gram=True)
        kept = current.low_rank.shape[-1]
        E = torch.cat([coefficients.new_zeros(kept), coefficients / lr**0.5])
        step = scaled.transpose(-1, -2) @ torch.cholesky_solve(
            E.to(torch.float64).unsqueeze(-1), chol
        )
        mean = current.mean + lr * step.squeeze(-1).to(current.mean.dtype)
        # The projection's Gram matrix came with the capacitance, from the same copy.
        diagonal, W = _project_by_gram(diagonal, columns.transpose(-1, -2), gram, rank)
    else:
        direction = grad
        if not first:
            direction = grad - dlr_matvec(prior.diagonal, prior.low_rank, offset)
        mean = current.mean + lr * dlr_solve(unprojected, direction)
        diagonal, W = project_low_rank(diagonal, columns, rank)
    return DLRBelief(mean, diagonal, W)


def euclidean_step(
    current: Belief,
    prior: Belief,
    grad: torch.Tensor,
    factor: torch.Tensor | None,
    hessian: torch.Tensor | None,
    lr: float,
) -> Belief:
    r"""
    One gradient step in the moments :math:`(\mu, \Sigma)` (BBB; BOG from ``prior``),
    full and diagonal families. The covariance must stay positive definite: a step that
    breaks it raises :class:`NotPositiveDefiniteError` (lower the learning rate).
    """
    offset = current.mean - prior.mean
    if isinstance(current, FullBelief):
        wide = torch.float64
        G = -_negative_hessian(current, factor, hessian)
        prior_precision = full_precision(prior)
        direction = grad - (prior_precision @ offset.to(wide)).to(grad.dtype)
        new_cov = _sym(
            current.covariance + 0.5 * lr * (G + full_precision(current) - prior_precision)
        )
        _cholesky(new_cov, "updated covariance")  # the step must keep it positive definite
        return FullBelief(current.mean + lr * direction, new_cov)
    if isinstance(current, DiagBelief):
        G = -_negative_hessian(current, factor, hessian)
        variance = current.precision.reciprocal()
        direction = grad - prior.precision * offset
        new_variance = variance + 0.5 * lr * (G + current.precision - prior.precision)
        require(
            new_variance > 0,
            lambda: NotPositiveDefiniteError("the updated diagonal variance is not positive"),
        )
        return DiagBelief(current.mean + lr * direction, new_variance.reciprocal())
    raise ValueError("the Euclidean (BOG/BBB) steps have the full and diagonal families only")
