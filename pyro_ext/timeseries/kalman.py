r"""Exact inference in linear Gaussian state-space models (Kalman filtering and smoothing).

The model is the dynamic linear model of eqs. (1.2)-(1.3) of Gallego (2021), with the
first state drawn from its prior::

    x_1 ~ N(init_mean, init_cov)
    x_t = G_t x_{t-1} + w_t,    w_t ~ N(0, W_t),   t = 2..T      (1.2)
    y_t = F_t x_t + v_t,        v_t ~ N(0, V_t),   t = 1..T      (1.3)

Two engines evaluate the filter and smoother. On CPU tensors, for calls that want no
gradient and with numba installed (the ``fast`` extra), compiled sequential kernels
(:mod:`._kalman_kernels`) run the textbook covariance-form filter and the Rauch-Tung-Striebel
smoother as one machine-code loop over time: the faster engine on one CPU thread at every
size measured (``benchmarks/results/timeseries_speed.md``). With static matrices their
filter switches to the steady state, as statsmodels' does, once the predicted covariance
has stopped moving (to 1e-13 of its scale, a few dozen float64 ulps) between fully observed
steps: later steps update the mean only, and agree with the full recursion to round-off. :func:`kalman_log_likelihood`
also takes its gradient from the kernels: one filter and smoother pass gives the exact score
by Fisher's identity (``_score_terms``), for time-varying matrices and for static ones
up to a measured size (``_SCORE_WORK_LIMIT``). Everywhere else (other gradients,
CUDA, ``torch.func``, ``torch.compile``, no numba, or inside
:func:`~pyro_ext.timeseries.sequential_kernels` ``(False)``) filtering and smoothing are
*parallel in time*: associative scans (:func:`~pyro_ext.ops.associative_scan`) over
Gaussian elements (Sarkka & Garcia-Fernandez, "Temporal parallelization of Bayesian
smoothers", IEEE TAC 2021, eqs. (10)-(14) for filtering and (20)-(22) for smoothing), so a
series of length ``T`` costs ``O(log T)`` batched small-matrix operations instead of ``T``
sequential Python steps. Both are exact and agree to round-off (the kernels compute in
float64).  The covariance
form of those elements only needs ``I + C_i J_j`` to be invertible, so singular process
noise (dummy seasonals, static regression coefficients, AR companion forms) is handled
exactly.  Pyro's :class:`~pyro.distributions.GaussianHMM` is not reused because its
precision (information) form requires full-rank ``W_t``.

Conventions
-----------
* ``y`` has shape ``(..., T, obs_dim)``; its leading dims are the batch shape.  ``NaN``
  marks a missing coordinate.  Missing coordinates are marginalised exactly: their row of
  ``F_t`` is zeroed and their block of ``V_t`` replaced by the identity, so they contribute
  exactly ``-log(2 pi)/2`` to the Gaussian log-density, which is added back.
* The model's matrices travel together as one :class:`StateSpaceMatrices`
  ``(transition_matrix, observation_matrix, transition_cov, observation_cov, init_mean,
  init_cov)``, passed whole to every function with the data.
* ``y``'s leading dims define the batch shape.  A matrix carries a time axis iff it has
  exactly ``len(batch_shape) + 3`` dims; fewer dims mean a static matrix that broadcasts
  over the batch (expand ``y`` to batch over parameters).  ``init_mean`` and ``init_cov``
  are always static.
* Time-varying ``transition_matrix`` / ``transition_cov`` have **T entries**, aligned with
  ``y``: entry ``t`` (0-based) drives the transition into ``x_{t+1}``.  Entry 0 is unused
  (``x_1`` comes from the prior); keeping it makes covariate-driven ``G_t`` (e.g. the
  Nerlove-Arrow goodwill block, thesis eq. (1.4)) index-aligned with the data.
"""

import functools
import math
from typing import NamedTuple

import numpy as np
import torch

from ..ops.scan import associative_scan
from ..ops.validation import (
    broadcast_shapes,
    check_int,
    check_real,
    check_real_tensor,
    values_checked,
)
from . import _sequential

__all__ = [
    "KalmanFilterResult",
    "KalmanForecast",
    "KalmanSmootherResult",
    "KalmanWhitening",
    "StateSpaceMatrices",
    "forecast_interval",
    "kalman_filter",
    "kalman_forecast",
    "kalman_log_likelihood",
    "kalman_sample",
    "kalman_smoother",
    "kalman_whiten",
]


class StateSpaceMatrices(NamedTuple):
    r"""The matrices of the dynamic linear model (1.2)-(1.3): the one argument, besides the
    data, of :func:`kalman_filter`, :func:`kalman_log_likelihood`, :func:`kalman_smoother`,
    :func:`kalman_sample`, :func:`kalman_forecast` and :func:`kalman_whiten` (as dynamax's
    ``ParamsLGSSM`` is of ``lgssm_filter``).  :meth:`~pyro_ext.timeseries.DLM.matrices`
    builds one from a model's components.

    Shapes follow the module's conventions (``S`` states; a time axis, where allowed, sits
    just before the two matrix dims and has one entry per step of ``y``):

    :param transition_matrix: ``G``, ``(..., [T,] S, S)``; entry 0 of a time axis is unused.
    :param observation_matrix: ``F``, ``(..., [T,] obs_dim, S)``.
    :param transition_cov: ``W``, ``(..., [T,] S, S)`` positive semi-definite.
    :param observation_cov: ``V``, ``(..., [T,] obs_dim, obs_dim)``.
    :param init_mean: ``(..., S)`` mean of ``x_1`` (static).
    :param init_cov: ``(..., S, S)`` covariance of ``x_1`` (static).

    Fields are checked where they are used: a field that is not a real tensor raises a
    :class:`TypeError`, and one of the wrong shape a :class:`ValueError`, each naming the
    field.
    """

    transition_matrix: torch.Tensor
    observation_matrix: torch.Tensor
    transition_cov: torch.Tensor
    observation_cov: torch.Tensor
    init_mean: torch.Tensor
    init_cov: torch.Tensor


def _check_matrices(matrices, name="matrices"):
    """``matrices`` itself, or a :class:`TypeError` naming ``name`` if it is not a
    :class:`StateSpaceMatrices` (a plain tuple would silently depend on the field order)."""
    if not isinstance(matrices, StateSpaceMatrices):
        raise TypeError(
            f"{name} must be a StateSpaceMatrices(transition_matrix, observation_matrix, "
            f"transition_cov, observation_cov, init_mean, init_cov), "
            f"got {type(matrices).__name__}"
        )
    return matrices


class KalmanFilterResult(NamedTuple):
    """Output of :func:`kalman_filter`; ``predicted_*`` are the moments of ``x_t | y_{1:t-1}``."""

    log_likelihood: torch.Tensor
    filtered_means: torch.Tensor
    filtered_covs: torch.Tensor
    predicted_means: torch.Tensor
    predicted_covs: torch.Tensor


class KalmanSmootherResult(NamedTuple):
    """Output of :func:`kalman_smoother` (moments of ``x_t | y_{1:T}``)."""

    smoothed_means: torch.Tensor
    smoothed_covs: torch.Tensor
    log_likelihood: torch.Tensor


class KalmanForecast(NamedTuple):
    """Predictive moments of ``y_{T+1..T+h}`` and ``x_{T+1..T+h}`` given ``y_{1:T}``."""

    observation_means: torch.Tensor
    observation_covs: torch.Tensor
    state_means: torch.Tensor
    state_covs: torch.Tensor


class KalmanWhitening(NamedTuple):
    """Output of :func:`kalman_whiten`: ``L^{-1} series`` and ``log det`` of the covariance."""

    whitened: torch.Tensor
    log_det: torch.Tensor
    num_observed: torch.Tensor


class _SSM(NamedTuple):
    """Time-first internal form: ``G[0] = 0``, ``Q[0] = init_cov``, ``mu[0] = init_mean``.

    With these substitutions the prior of ``x_1`` is just another transition, so every
    time step is treated uniformly (``x_t = G_t x_{t-1} + mu_t + N(0, Q_t)``).
    """

    G: torch.Tensor  # (T, *b, S, S)
    F: torch.Tensor  # (T, *b, p, S), rows of missing coordinates zeroed
    Q: torch.Tensor  # (T, *b, S, S)
    V: torch.Tensor  # (T, *b, p, p), identity block on missing coordinates
    mu: torch.Tensor  # (T, *b, S)
    y: torch.Tensor  # (T, *b, p), zeros where missing
    mask: torch.Tensor  # (T, *b, p) bool, True where observed
    num_missing: torch.Tensor  # (*b,)


# ---------------------------------------------------------------------------------------
# Validation and normalisation


def _sym(x):
    return 0.5 * (x + x.mT)


def _split(x, name, core, num_batch, num_steps, time_ok=True, dims=""):
    """Return ``(x, has_time)`` after checking ``x`` is ``(*batch, [time,] *core)``; ``dims``
    says where the sizes in ``core`` come from, for the error message."""
    k = len(core)
    if x.dim() < k or tuple(x.shape[x.dim() - k :]) != tuple(core):
        raise ValueError(
            f"{name} must have trailing shape {tuple(core)}{dims}, got {tuple(x.shape)}"
        )
    if time_ok and x.dim() == num_batch + k + 1:
        if x.shape[-k - 1] != num_steps:
            raise ValueError(
                f"{name} has a time axis of length {x.shape[-k - 1]} but the series has "
                f"{num_steps} steps (time-varying matrices need exactly {num_steps} entries)"
            )
        return x, True
    if x.dim() > num_batch + k:
        raise ValueError(
            f"{name} has shape {tuple(x.shape)}: too many dims for batch shape of "
            f"rank {num_batch} (a time axis needs exactly {num_batch + k + 1} dims)"
        )
    return x, False


def _nan_where_failed(x, info):
    """``x`` with the matrices whose factorisation failed (``info != 0``) set to NaN."""
    return torch.where((info != 0)[..., None, None], torch.full_like(x, math.nan), x)


def _lu_factor(x, name):
    lu, piv, info = torch.linalg.lu_factor_ex(x)
    if values_checked():
        if bool((info != 0).any()):
            raise ValueError(f"{name} is singular; check the covariances for degenerate values")
        return lu, piv
    return _nan_where_failed(lu, info), piv


def _check_covariance(x, name):
    """Symmetric, non-negative diagonal and positive semi-definite (up to round-off)."""
    with torch.no_grad():
        diag = x.diagonal(dim1=-2, dim2=-1)
        if not bool(torch.isfinite(x).all()):
            raise ValueError(f"{name} contains NaN or infinite values")
        if bool((diag < 0).any()):
            raise ValueError(f"{name} has negative variances on its diagonal")
        scale = diag.abs().amax(-1, keepdim=True).unsqueeze(-1) + torch.finfo(x.dtype).tiny
        tol = 1e3 * torch.finfo(x.dtype).eps
        if bool(((x - x.mT).abs() > tol * scale).any()):
            raise ValueError(f"{name} must be symmetric")
        # A relative jitter of sqrt(eps) lets exactly-singular PSD matrices pass while a
        # genuinely negative eigenvalue makes the Cholesky factorisation fail.
        jitter = torch.finfo(x.dtype).eps ** 0.5 * scale
        eye = torch.eye(x.shape[-1], dtype=x.dtype, device=x.device)
        if bool((torch.linalg.cholesky_ex(x + jitter * eye).info != 0).any()):
            raise ValueError(f"{name} is not positive semi-definite (Cholesky failed)")


class _Validated(NamedTuple):
    """Arguments after validation: common dtype/device, own (unexpanded) shapes."""

    y: torch.Tensor
    G: torch.Tensor
    F: torch.Tensor
    W: torch.Tensor
    V: torch.Tensor
    m0: torch.Tensor
    P0: torch.Tensor
    batch: torch.Size
    time_varying: bool  # True iff any of G, F, W, V has a time axis


def _check_float_data(x, name):
    """Observations must be floating point: ``NaN`` marks a missing value, which an integer
    tensor cannot hold, so an integer series is refused rather than silently cast."""
    if not x.is_floating_point():
        raise TypeError(
            f"{name} must be a floating-point tensor (NaN marks a missing value), got dtype "
            f"{x.dtype}; convert it with {name}.to(torch.get_default_dtype())"
        )


def _validate(y, matrices, state_dim_from="init_mean"):
    G, F, W, V, m0, P0 = _check_matrices(matrices)
    names = [
        "y",
        "transition_matrix",
        "observation_matrix",
        "transition_cov",
        "observation_cov",
        "init_mean",
        "init_cov",
    ]
    args = [y, G, F, W, V, m0, P0]
    for x, name in zip(args, names):
        check_real_tensor(x, name)
    _check_float_data(y, "y")
    if y.dim() < 2:
        raise ValueError(f"y must have shape (..., T, obs_dim), got {tuple(y.shape)}")
    T, p = y.shape[-2:]
    if T < 1:
        raise ValueError("y is an empty series (T = 0); need at least one time step")
    if p < 1:
        raise ValueError("y must have obs_dim >= 1")
    if m0.dim() < 1:
        raise ValueError("init_mean must have shape (..., state_dim)")
    S = m0.shape[-1]
    dtype = y.dtype if y.is_floating_point() else torch.get_default_dtype()
    for x in args[1:]:
        if x.is_floating_point():
            dtype = torch.promote_types(dtype, x.dtype)
    args = [x.to(device=y.device, dtype=dtype) for x in args]
    y, G, F, W, V, m0, P0 = args
    nb = y.dim() - 2
    check_values = values_checked()
    if check_values and bool(torch.isinf(y).any()):
        raise ValueError("y contains infinite values (use NaN for missing observations)")
    dims = f" (state_dim {S} from {state_dim_from}, obs_dim {p} from y)"
    G, tG = _split(G, "transition_matrix", (S, S), nb, T, dims=dims)
    F, tF = _split(F, "observation_matrix", (p, S), nb, T, dims=dims)
    W, tW = _split(W, "transition_cov", (S, S), nb, T, dims=dims)
    V, tV = _split(V, "observation_cov", (p, p), nb, T, dims=dims)
    m0, _ = _split(m0, "init_mean", (S,), nb, T, time_ok=False)
    P0, _ = _split(P0, "init_cov", (S, S), nb, T, time_ok=False, dims=dims)
    if check_values:
        for x, name in [(W, "transition_cov"), (V, "observation_cov"), (P0, "init_cov")]:
            _check_covariance(x, name)
        if not bool(torch.isfinite(G).all()) or not bool(torch.isfinite(F).all()):
            raise ValueError("transition_matrix and observation_matrix must be finite")
    try:
        batch = broadcast_shapes(
            y.shape[:-2],
            *[
                x.shape[: x.dim() - (3 if t else 2)]
                for x, t in [(G, tG), (F, tF), (W, tW), (V, tV)]
            ],
            m0.shape[:-1],
            P0.shape[:-2],
        )
    except RuntimeError as e:
        raise ValueError(f"batch shapes of the arguments do not broadcast: {e}") from None
    return _Validated(y, G, F, W, V, m0, P0, batch, tG or tF or tW or tV)


def _build(args):
    """The time-first :class:`_SSM` of validated arguments."""
    y, G, F, W, V, m0, P0, batch, _ = args
    T, p = y.shape[-2:]
    S = m0.shape[-1]
    dtype = y.dtype
    nb = y.dim() - 2

    def time_first(x, k, has_time):
        if not has_time:
            x = x.unsqueeze(-k - 1)
        return x

    G = time_first(G, 2, G.dim() == nb + 3)
    F = time_first(F, 2, F.dim() == nb + 3)
    W = time_first(W, 2, W.dim() == nb + 3)
    V = time_first(V, 2, V.dim() == nb + 3)

    def to_internal(x, core):
        x = x.expand(*batch, T, *core)
        return x.movedim(-len(core) - 1, 0)

    G, F = to_internal(G, (S, S)), to_internal(F, (p, S))
    W, V = to_internal(W, (S, S)), to_internal(V, (p, p))
    y = to_internal(y, (p,))
    m0, P0 = m0.expand(*batch, S), P0.expand(*batch, S, S)

    mask = ~torch.isnan(y)
    maskf = mask.to(dtype)
    F = F * maskf.unsqueeze(-1)
    V = V * (maskf.unsqueeze(-1) * maskf.unsqueeze(-2)) + torch.diag_embed(1 - maskf)
    y = torch.where(mask, y, torch.zeros((), dtype=dtype, device=y.device))
    G = torch.cat([torch.zeros_like(G[:1]), G[1:]])
    Q = torch.cat([P0.unsqueeze(0), W[1:]])
    mu = torch.cat([m0.unsqueeze(0), torch.zeros_like(m0).expand(T - 1, *m0.shape)])
    return _SSM(G, F, Q, V, mu, y, mask, (~mask).sum((0, -1)).to(dtype))


def prepare_state_space(y, matrices):
    """The internal time-first :class:`_SSM` of ``y`` and a :class:`StateSpaceMatrices`."""
    return _build(_validate(y, matrices))


def _cholesky(x, name):
    L, info = torch.linalg.cholesky_ex(x)
    if not values_checked():
        return _nan_where_failed(L, info)
    if bool((info != 0).any()):
        raise ValueError(
            f"{name} is not positive definite (Cholesky failed); check observation_cov "
            "and the other covariances for degenerate or negative variances"
        )
    return L


def _mv(m, v):
    return (m @ v.unsqueeze(-1)).squeeze(-1)


def _vm(v, m):
    """``v^T m`` batched; one GEMM over all of ``v``'s batch when ``m`` is 2-D."""
    return (v.unsqueeze(-2) @ m).squeeze(-2)


# ---------------------------------------------------------------------------------------
# Filtering (Sarkka & Garcia-Fernandez 2021, Lemma 8 / eqs. (10)-(14))


def _filter_gains(ssm):
    """The data-free parts of the filter's elements: ``(K, S^{-1} F G, A, C, J)``, with
    ``S = F Q F^T + V`` and the gain ``K = Q F^T S^{-1}``; their means ``b`` and ``eta``
    apply ``K`` and ``(S^{-1} F G)^T`` to the residuals ``y - F mu`` of the data."""
    G, F, Q, V = ssm.G, ssm.F, ssm.Q, ssm.V
    eye = torch.eye(G.shape[-1], dtype=G.dtype, device=G.device)
    L = _cholesky(F @ Q @ F.mT + V, "innovation covariance F W F^T + V")
    K = torch.cholesky_solve(F @ Q, L).mT
    IKF = eye - K @ F
    A = IKF @ G
    # Joseph form keeps C positive semi-definite under round-off.
    C = _sym(IKF @ Q @ IKF.mT + K @ V @ K.mT)
    SinvFG = torch.cholesky_solve(F @ G, L)
    J = _sym((F @ G).mT @ SinvFG)
    return K, SinvFG, A, C, J


def _filter_elements(ssm):
    K, SinvFG, A, C, J = _filter_gains(ssm)
    r = ssm.y - _mv(ssm.F, ssm.mu)
    b = ssm.mu + _mv(K, r)
    eta = _mv(SinvFG.mT, r)
    return A, b, C, eta, J


def _steps_per_block(block_size, num_steps, default):
    """The ``block_size`` argument of the blocked filters, checked and capped at the series'
    length; ``default()`` when it is ``None``."""
    if block_size is None:
        return default()
    if int(block_size) != block_size or int(block_size) < 1:
        raise ValueError(f"block_size must be a positive integer, got {block_size}")
    return min(int(block_size), num_steps)


def _filter_combine(ei, ej, mv=_mv):
    """``p(x_j | x_{i-1}, y_{i..j})`` and ``p(y_{i..j} | x_{i-1})`` from two adjacent blocks
    (``mv`` multiplies a matrix into the means: vectors by default, columns of several
    series with ``torch.matmul``)."""
    Ai, bi, Ci, etai, Ji = ei
    Aj, bj, Cj, etaj, Jj = ej
    eye = torch.eye(Ai.shape[-1], dtype=Ai.dtype, device=Ai.device)
    lu, piv = _lu_factor(eye + Ci @ Jj, "I + C_i J_j in the filter scan")
    S = Ai.shape[-1]
    MAC = torch.linalg.lu_solve(lu, piv, torch.cat([Ai, Ci], -1))  # M [A_i, C_i]
    MA, MC = MAC[..., :S], MAC[..., S:]
    AjM = torch.linalg.lu_solve(lu, piv, Aj.mT, adjoint=True).mT  # A_j M
    A = Aj @ MA
    C = _sym(Aj @ MC @ Aj.mT + Cj)
    J = _sym(MA.mT @ (Jj @ Ai) + Ji)
    b = mv(AjM, bi + mv(Ci, etaj)) + bj
    eta = mv(MA.mT, etaj - mv(Jj, bi)) + etai
    return A, b, C, eta, J


def _previous(x):
    """``x`` shifted one step along time (internal layout): ``x_{t-1}`` at ``t``, 0 at the first."""
    return torch.cat([torch.zeros_like(x[:1]), x[:-1]])


def _predicted_covs(ssm, P):
    """One-step predicted covariances of ``x_t | y_{1:t-1}`` from the filtered ones ``P``
    (with ``G[0] = 0`` the first one is the prior's), and the Cholesky factors of the
    innovation covariances ``F Pp F^T + V``."""
    Pp = _sym(ssm.G @ _previous(P) @ ssm.G.mT + ssm.Q)
    Lv = _cholesky(ssm.F @ Pp @ ssm.F.mT + ssm.V, "innovation covariance F P F^T + V")
    return Pp, Lv


def _run_filter(ssm):
    """Filtered and one-step predicted moments plus the log-likelihood (internal layout)."""
    A, b, C, eta, J = _filter_elements(ssm)
    batch = broadcast_shapes(b.shape[1:-1], A.shape[1:-2])
    b = b.expand(b.shape[0], *batch, b.shape[-1])
    eta = eta.expand(b.shape)
    _, m, P, _, _ = associative_scan(_filter_combine, (A, b, C, eta, J))
    # One-step predictions x_t | y_{1:t-1}; with G[0] = 0 the first one is the prior.
    mp = _mv(ssm.G, _previous(m)) + ssm.mu
    Pp, Lv = _predicted_covs(ssm, P)
    e = ssm.y - _mv(ssm.F, mp)
    z = torch.linalg.solve_triangular(Lv, e.unsqueeze(-1), upper=False).squeeze(-1)
    p = e.shape[-1]
    log_det = Lv.diagonal(dim1=-2, dim2=-1).log().sum(-1)
    ll = (-0.5 * z.pow(2).sum(-1) - log_det - 0.5 * p * math.log(2 * math.pi)).sum(0)
    # Missing coordinates were replaced by independent N(0, 1) dummies observed at 0.
    ll = ll + 0.5 * math.log(2 * math.pi) * ssm.num_missing
    return ll, m, P, mp, Pp


# ---------------------------------------------------------------------------------------
# Whitening several series (the filter's means with several right-hand sides)


#: :func:`_filter_combine` with ``b`` and ``eta`` of shape ``(..., S, n)``: ``n`` series
#: that share the covariances (``A``, ``C``, ``J``) and differ only in the data.
_filter_combine_columns = functools.partial(_filter_combine, mv=torch.matmul)


def _run_whiten(ssm, Y):
    """Standardised innovations of the series ``Y`` ``(T, *b, p, n)`` (zero prior mean) and
    the log-determinant of the observed part of their covariance."""
    K, SinvFG, A, C, J = _filter_gains(ssm)
    b = K @ Y
    eta = SinvFG.mT @ Y
    batch = broadcast_shapes(b.shape[1:-2], A.shape[1:-2])
    b = b.expand(b.shape[0], *batch, *b.shape[-2:])
    eta = eta.expand(b.shape)
    A, C, J = [x.expand(x.shape[0], *batch, *x.shape[-2:]) for x in (A, C, J)]
    _, m, P, _, _ = associative_scan(_filter_combine_columns, (A, b, C, eta, J))
    _, Lv = _predicted_covs(ssm, P)
    e = Y - ssm.F @ (ssm.G @ _previous(m))
    z = torch.linalg.solve_triangular(Lv, e, upper=False)
    log_det = 2 * Lv.diagonal(dim1=-2, dim2=-1).log().sum((0, -1))
    return z, log_det


def _blocked_whiten(args, observed, Y, B):
    """:func:`_run_whiten` by blocks of ``B`` steps, for static ``G``, ``F``, ``W`` (``V``
    static or with a time axis); ``observed`` ``(*b, T, p)``, ``Y`` ``(*b, T, p, n)`` with
    zeros where missing.

    As :func:`_blocked_log_likelihood`: each block's observations ``Y_k`` (``B p`` values)
    are ``H s_k`` plus noise of a block-independent covariance (the state noise within the
    block; the observation noise and the missing coordinates make it per block), so one
    associative scan over the ``K = ceil(T / B)`` blocks gives the predicted moments
    ``(m_k, P_k)`` of each block's first state ``s_k`` for every series.  The block's
    prediction errors ``Y_k - H m_k`` have covariance ``Omega_k = H P_k H^T + Syy_k``, the
    Schur complement of the earlier blocks in ``Sigma``, so the Cholesky factor of
    ``Omega_k`` whitens them exactly as ``L`` does (block Cholesky).  The series are padded
    to ``K B`` steps with missing values.
    """
    _, G, F, W, V, _, P0, batch, _ = args
    T, p = observed.shape[-2:]
    S, n = P0.shape[-1], Y.shape[-1]
    dtype, device = Y.dtype, Y.device
    K = -(-T // B)
    B = -(-T // K)  # the same number of blocks with as little padding as possible
    pad = K * B - T
    nb = len(batch)
    eye_p = torch.eye(p, dtype=dtype, device=device)
    H, Phi, Syy, Ssy, Sss = _block_model(G, F, W, torch.zeros_like(eye_p), B)
    # Observation noise per step, padded with identities (masked out below).
    if V.dim() == observed.dim() + 1:  # (*b, T, p, p)
        V = V.expand(*batch, T, p, p)
    else:
        V = V.unsqueeze(-3).expand(*batch, T, p, p)
    V = torch.cat([V, eye_p.expand(*batch, pad, p, p)], -3).reshape(*batch, K, B, p, p)
    eye_B = torch.eye(B, dtype=dtype, device=device)
    V = torch.einsum("ji,...kjac->...kjaic", eye_B, V).reshape(*batch, K, B * p, B * p)

    def blocks(x, core):  # (*b, T, *core) -> (K, *b, B * p, *core[1:]) with padding
        x = x.expand(*batch, T, *core)
        x = torch.cat([x, x.new_zeros(*batch, pad, *core)], -len(core) - 1)
        return x.reshape(*batch, K, B * p, *core[1:]).movedim(nb, 0)

    d = blocks(observed.to(dtype), (p,))  # (K, *b, B p)
    Yk = blocks(Y, (p, n))  # (K, *b, B p, n)
    V = V.movedim(nb, 0)
    Syy = (Syy + V) * (d.unsqueeze(-1) * d.unsqueeze(-2)) + torch.diag_embed(1 - d)
    H = H * d.unsqueeze(-1)
    Ssy = Ssy * d.unsqueeze(-2)
    if K == 1:  # one block: Sigma itself, s_0 ~ N(0, P0)
        E, P = Yk, P0.expand(1, *batch, S, S)
    else:
        L = _cholesky(Syy[:-1], "block noise covariance")
        Z = torch.linalg.solve_triangular(
            L, torch.cat([H[:-1], Ssy[:-1].mT, Yk[:-1]], -1), upper=False
        )
        Zh, Zs, zy = Z[..., :S], Z[..., S : 2 * S], Z[..., 2 * S :]
        elems = (
            Phi - Zs.mT @ Zh,
            Zs.mT @ zy,
            _sym(Sss - Zs.mT @ Zs),
            Zh.mT @ zy,
            _sym(Zh.mT @ Zh),
        )
        zSS = P0.new_zeros(()).expand(1, *batch, S, S)
        zSn = P0.new_zeros(()).expand(1, *batch, S, n)
        prior = (zSS, zSn, P0.expand(1, *batch, S, S), zSn, zSS)
        scan_in = tuple(torch.cat([u, v.expand(K - 1, *u.shape[1:])]) for u, v in zip(prior, elems))
        _, m, P, _, _ = associative_scan(_filter_combine_columns, scan_in)  # s_0 .. s_{K-1}
        E = Yk - H @ m
    Lo = _cholesky(_sym(H @ P @ H.mT) + Syy, "block prediction-error covariance")
    z = torch.linalg.solve_triangular(Lo, E, upper=False)
    log_det = 2 * Lo.diagonal(dim1=-2, dim2=-1).log().sum((0, -1))
    z = z.movedim(0, nb).reshape(*batch, K * B, p, n)[..., :T, :, :]
    return z, log_det


def _default_whiten_block_size(T, p, dtype):
    # Tuned on CPU (one thread; a BSTS with S = 6 states and 10 series, forward and
    # backward, vmapped over 8 particles): up to about 80 steps one block (the dense
    # covariance, built without a loop) is fastest; beyond, blocks of about 40 steps are
    # within 10 % of the best block size from T = 104 to 520.  float32 uses shorter blocks
    # (the block covariance's condition number grows like B^3 for integrated trends).
    if dtype == torch.float32 or dtype == torch.float16:
        return max(1, min(T, 16 // p))
    return T if T * p <= 80 else max(1, 40 // p)


def kalman_whiten(
    series: torch.Tensor,
    matrices: StateSpaceMatrices,
    block_size: int | None = None,
) -> KalmanWhitening:
    r"""Whiten several series by the covariance of a linear Gaussian state-space model.

    With ``Sigma = Cov(y_{1:T})`` of the model (initial state ``N(0, init_cov)``) and its
    Cholesky factor ``Sigma = L L^T`` (time-major, ``T obs_dim`` square), returns
    ``L^{-1} s`` for every series ``s`` without forming ``Sigma``: by the prediction-error
    decomposition, ``L^{-1} s`` is the filter's one-step prediction errors standardised by
    the Cholesky factor of their covariance, and the gains and that covariance do not
    depend on the data, so one filter pass with ``n`` right-hand sides in the means serves
    all series.  Regression designs whitened this way give ``X^T Sigma^{-1} X = Z^T Z`` and
    ``X^T Sigma^{-1} r = Z^T L^{-1} r``, and ``log N(r; 0, Sigma) = -(|L^{-1} r|^2 +
    log_det + num_observed log(2 pi)) / 2``.

    Static ``transition_matrix``, ``observation_matrix`` and ``transition_cov`` (with a
    static or time-varying ``observation_cov``, e.g. Student-t noise given its precisions)
    filter by blocks of ``block_size`` steps, as :func:`kalman_log_likelihood` does: an
    associative scan over ``ceil(T / B)`` blocks, then one ``(B obs_dim)``-square
    Cholesky factor per block, which whitens the block's prediction errors exactly (block
    Cholesky).  Time-varying ``G``, ``F`` or ``W`` use the per-step scan of
    :func:`kalman_filter`.  Both are exact (no steady state), differentiable, and
    :func:`torch.func.vmap` can batch them (value checks follow the global validation
    switch, like the other functions here).

    The initial mean is taken to be 0 (``matrices.init_mean`` is not used): to whiten data
    with a nonzero prior mean, subtract its mean first.  A coordinate that is ``NaN`` in
    any series is missing in all of them: it is marginalised (dropped from ``Sigma``), its
    whitened value is 0 and it adds nothing to ``log_det``.

    :param series: ``(..., T, obs_dim, n)``: ``n`` series of the model's observations.
    :param matrices: :class:`StateSpaceMatrices` of the model; its ``init_mean`` is not used.
    :param block_size: steps per block ``B`` (static ``G``, ``F``, ``W``); ``None`` picks
        one (in float64 one block up to 80 / obs_dim steps, else 40 / obs_dim steps; in
        float32 16 / obs_dim).
    :returns: :class:`KalmanWhitening`: ``whitened`` ``(..., T, obs_dim, n)``, ``log_det``
        ``(...)`` (the log-determinant of the observed part of ``Sigma``) and
        ``num_observed`` ``(...)`` (its dimension).
    """
    check_real_tensor(series, "series")
    _check_float_data(series, "series")
    _check_matrices(matrices)
    if series.dim() < 3:
        raise ValueError(
            f"series must have shape (..., T, obs_dim, num_series), got {tuple(series.shape)}"
        )
    if values_checked() and bool(torch.isinf(series).any()):
        raise ValueError("series contains infinite values (use NaN for missing observations)")
    missing = torch.isnan(series).any(-1)
    nan = torch.full((), math.nan, dtype=series.dtype, device=series.device)
    y = torch.where(missing, nan, torch.zeros_like(nan))
    init_cov = check_real_tensor(matrices.init_cov, "init_cov")
    init_mean = init_cov.new_zeros(init_cov.shape[-1:])
    args = _validate(y, matrices._replace(init_mean=init_mean), state_dim_from="init_cov")
    T, p = args.y.shape[-2:]
    nb = args.y.dim() - 2
    series = series.to(args.y.dtype)
    Y = torch.where(missing.unsqueeze(-1), series.new_zeros(()), series)
    num_observed = (~missing).sum((-2, -1)).to(series.dtype).expand(args.batch)
    B = _steps_per_block(block_size, T, lambda: _default_whiten_block_size(T, p, args.y.dtype))
    if not any(x.dim() == nb + 3 for x in (args.G, args.F, args.W)):
        z, log_det = _blocked_whiten(args, ~missing, Y, B)
        return KalmanWhitening(z, log_det, num_observed)
    ssm = _build(args)
    Y = Y.expand(*args.batch, *Y.shape[-3:]).movedim(-3, 0)
    z, log_det = _run_whiten(ssm, Y)
    return KalmanWhitening(z.movedim(0, -3), log_det, num_observed)


# ---------------------------------------------------------------------------------------
# Smoothing (Sarkka & Garcia-Fernandez 2021, Lemma 10 / eqs. (20)-(22))


def _smoother_combine(later, earlier):
    """Compose ``x_t | x_{t+1}`` (earlier) with ``x_{t+1} | ...`` (later)."""
    Ea, ga, La = later
    Eb, gb, Lb = earlier
    return Eb @ Ea, _mv(Eb, ga) + gb, _sym(Eb @ La @ Eb.mT + Lb)


def _run_smoother(ssm, m, P, mp, Pp, gains=False, block_size=None):
    r"""Smoothed means and covariances (time-first); ``gains=True`` adds the smoother gains
    :math:`E_t = P_t G_{t+1}^\top P_{t+1|t}^{-1}` ``(T-1, ...)``, from which
    :math:`\mathrm{Cov}(x_{t+1}, x_t \mid y) = P^s_{t+1} E_t^\top`.  ``block_size``: steps
    per block of :func:`_blocked_backward` (``T``: the plain associative scan)."""
    Lp = _cholesky(Pp[1:], "predicted state covariance (smoothing needs it invertible)")
    E = torch.cholesky_solve(ssm.G[1:] @ P[:-1], Lp).mT  # P_t G^T Pp_{t+1}^{-1}
    g = m[:-1] - _mv(E, mp[1:])
    Lc = _sym(P[:-1] - E @ Pp[1:] @ E.mT)
    gain = E
    E = torch.cat([E, torch.zeros_like(E[:1])])
    g = torch.cat([g, m[-1:]])
    Lc = torch.cat([Lc, P[-1:]])
    B = block_size
    if B is None:  # as in _filter_moments: blocks pay from three states on
        T = E.shape[0]
        B = _default_filter_block_size(T, 1) if E.shape[-1] >= 3 else max(T, 1)
    gs, Ls = _blocked_backward(E, g, Lc, B)
    if gains:
        return gs, Ls, gain
    return gs, Ls


def _blocked_backward(E, g, L, B):
    """Smoothed moments from the backward elements ``x_t = E_t x_{t+1} + g_t + N(0, L_t)``
    (``E`` zero at the last step), by blocks of ``B`` steps: the maps of each block are
    composed (all blocks at once, ``B`` steps), an associative scan over the blocks gives
    the moments at every block's first step, and the recursion then runs inside all blocks
    at once.  Sequential depth ``~2 B + log(T / B)`` instead of the scan's ``~2 log T``
    levels of ``O(T)`` work each; the same composition, so the same result."""
    T = E.shape[0]
    nblocks = -(-T // B)
    if nblocks < 2:
        rev = (E.flip(0), g.flip(0), L.flip(0))
        _, gs, Ls = associative_scan(_smoother_combine, rev)
        return gs.flip(0), Ls.flip(0)
    pad = nblocks * B - T
    if pad:  # E = 0 at the last step: what follows it changes nothing
        E, g, L = [torch.cat([x, x.new_zeros((pad,) + x.shape[1:])]) for x in (E, g, L)]

    def by_step(x):  # (nblocks * B, ...) -> (B, nblocks, ...)
        return x.reshape(nblocks, B, *x.shape[1:]).movedim(1, 0)

    E, g, L = by_step(E), by_step(g), by_step(L)
    # Each block's map from the next block's first state to its own first state.
    Eb, gb, Lb = E[-1], g[-1], L[-1]
    for j in range(B - 2, -1, -1):
        Eb, gb, Lb = _smoother_combine((Eb, gb, Lb), (E[j], g[j], L[j]))
    rev = (Eb.flip(0), gb.flip(0), Lb.flip(0))
    _, ms_first, Ps_first = associative_scan(_smoother_combine, rev)
    ms_first, Ps_first = ms_first.flip(0), Ps_first.flip(0)  # (nblocks, ...)
    # The recursion inside every block, from the next block's first moments.
    ms = torch.cat([ms_first[1:], torch.zeros_like(ms_first[:1])])
    Ps = torch.cat([Ps_first[1:], torch.zeros_like(Ps_first[:1])])
    track = torch.is_grad_enabled() and any(x.requires_grad for x in (E, g, L))
    outputs = [[] if track else x.new_empty((nblocks, B) + x.shape[1:]) for x in (ms, Ps)]
    for j in range(B - 1, -1, -1):
        ms = _mv(E[j], ms) + g[j]
        Ps = _sym(E[j] @ Ps @ E[j].mT + L[j])
        for out, x in zip(outputs, (ms, Ps)):
            if track:
                out.append(x)
            else:
                out[:, j] = x

    def time_first(x):
        x = torch.stack(x[::-1], 1) if track else x
        return x.reshape(nblocks * B, *x.shape[2:])[:T]

    return time_first(outputs[0]), time_first(outputs[1])


# ---------------------------------------------------------------------------------------
# Blocked log-likelihood (static matrices)


def _block_model(G, F, W, V, B):
    """Joint law of one block of ``B`` observations and the next block's first state.

    With ``s = x_t`` the block's first state, ``y_{t+j} = F G^j s + F e_j + v_{t+j}``
    (``j < B``) and ``x_{t+B} = G^B s + e_B``, where ``e_j = sum_{l<j} G^l w`` has
    ``Cov(e_j, e_i) = G^{j-i} Pi_i`` (``j >= i``), ``Pi_i = sum_{l<i} G^l W G^{l T}``.
    Returns ``H`` (``(B p, S)``, rows ``F G^j``), ``Phi = G^B`` and the noise covariance
    blocks ``Syy`` (``(B p, B p)``), ``Ssy = Cov(e_B, y)`` (``(S, B p)``), ``Sss = Pi_B``.
    Everything is batched over the matrices' own batch dims; ``O(log B)`` doubling steps.
    """
    S, p = G.shape[-1], F.shape[-2]
    batch = broadcast_shapes(G.shape[:-2], F.shape[:-2], W.shape[:-2], V.shape[:-2])
    G, W = G.expand(*batch, S, S), W.expand(*batch, S, S)
    F, V = F.expand(*batch, p, S), V.expand(*batch, p, p)
    eye = torch.eye(S, dtype=G.dtype, device=G.device)
    pw = torch.stack(torch.broadcast_tensors(eye, G))  # G^0, G^1
    while pw.shape[0] < B + 1:
        pw = torch.cat([pw, pw @ (pw[-1] @ G)])  # G^0..G^{m-1} -> G^0..G^{2m-1}
    pw = pw[: B + 1]
    terms = pw[:B] @ W @ pw[:B].mT
    Pi = torch.cat([torch.zeros_like(terms[:1]), terms.cumsum(0)])  # Pi_0..Pi_B
    FG = F @ pw[:B]  # (B, *b, p, S): F G^d
    PiF = Pi[:B] @ F.mT  # (B, *b, S, p): Pi_i F^T
    # [d, i] -> F G^d Pi_i F^T as one (B p, S) x (S, B p) product per batch element: the
    # broadcast (B, B)-batch of tiny matmuls it replaces was most of a BSTS step's backward.
    grid = FG.movedim(0, -3).reshape(*batch, B * p, S) @ PiF.movedim(0, -2).reshape(
        *batch, S, B * p
    )
    grid = grid.reshape(*batch, B, p, B, p).movedim(-4, 0).movedim(-2, 1)
    j = torch.arange(B, device=G.device)
    jj, ii = j[:, None], j[None, :]
    low = grid[(jj - ii).clamp(min=0), ii]  # [j, i] -> Cov(y_j, y_i) for j >= i
    extra = (low.dim() - 4) * (None,)
    diag = (jj == ii)[(...,) + extra + (None, None)]
    strict = (jj > ii)[(...,) + extra + (None, None)]
    zero = torch.zeros((), dtype=G.dtype, device=G.device)
    low = torch.where(strict, low, zero)
    low = low + torch.where(diag, 0.5 * (grid[0] + V), zero)
    low = low.movedim((0, 1), (-4, -2)).reshape(*batch, B * p, B * p)
    Syy = low + low.mT
    H = FG.movedim(0, -3).reshape(*batch, B * p, S)
    Ssy = pw[1:].flip(0) @ PiF  # G^{B-i} Pi_i F^T, i = 0..B-1
    Ssy = Ssy.movedim(0, -2).reshape(*batch, S, B * p)
    return H, pw[B], Syy, Ssy, Pi[B]


def _gaussian_blocks(z, Zh, log_det_syy, P):
    """``sum_k log N(r_k; 0, H P_k H^T + Syy_k)`` from whitened ``z = L^{-1} r``, ``Zh = L^{-1} H``.

    ``Syy = L L^T``.  Only ``S x S`` work per block: the determinant lemma gives
    ``log det = log det Syy + log det(I + P M)`` (``M = Zh^T Zh``), and with
    ``w = (I + Zh P Zh^T)^{-1} z = z - Zh (I + P M)^{-1} P Zh^T z`` the quadratic form is
    ``z^T w = |w|^2 + v^T P v`` (``v = Zh^T w``), a sum of non-negative terms, so a poorly
    predicted block (large ``z``) loses no precision to cancellation.
    """
    S, n = P.shape[-1], z.shape[-1]
    eye = torch.eye(S, dtype=P.dtype, device=P.device)
    M = _sym(Zh.mT @ Zh)
    u = _mv(Zh.mT, z)
    lu, piv = _lu_factor(eye + P @ M, "I + P M in the blocked filter")
    x = torch.linalg.lu_solve(lu, piv, (P @ u.unsqueeze(-1))).squeeze(-1)
    w = z - _mv(Zh, x)
    v = _mv(Zh.mT, w)
    quad = w.pow(2).sum(-1) + (v * _mv(P, v)).sum(-1)
    # det(I + P M) > 0 (the eigenvalues of P M are those of M^1/2 P M^1/2 >= 0).
    log_det = log_det_syy + lu.diagonal(dim1=-2, dim2=-1).abs().log().sum(-1)
    return (-0.5 * (quad + log_det) - 0.5 * n * math.log(2 * math.pi)).sum(0)


def _mask_block(mask, H, Syy, Ssy=None):
    """Marginalise missing coordinates: zero their rows of ``H``, identity in ``Syy``."""
    d = mask.to(H.dtype)
    H = H * d.unsqueeze(-1)
    Syy = Syy * (d.unsqueeze(-1) * d.unsqueeze(-2)) + torch.diag_embed(1 - d)
    if Ssy is not None:
        Ssy = Ssy * d.unsqueeze(-2)
    return H, Syy, Ssy


def _default_block_size(T, S, p, dtype):
    # Tuned on CPU (one thread) for S ~ 10-20: the T / B sequential-depth scan elements are
    # cheap, while each block costs an O((B p)^3) Cholesky.  float32 uses shorter blocks
    # because the block covariance grows like B^3 for integrated (trend) states.
    n = 16 if dtype == torch.float32 or dtype == torch.float16 else 64
    return max(1, min(T, max(n // p, 1)))


def _blocked_log_likelihood(args, B, moments=False):
    """Exact ``log p(y)`` for static matrices by filtering over blocks of ``B`` steps.

    Each block's observation vector ``Y_k`` (``B p`` values) and the next block's first
    state are jointly Gaussian given the block's first state ``s_k`` with the same
    (``k``-independent) law, so the filter over blocks is an associative scan over
    ``ceil(T / B)`` Sarkka elements built from one ``(B p) x (B p)`` Cholesky factor, and
    ``log p(y) = sum_k log N(Y_k; H m_k, H P_k H^T + Syy)`` from the predicted moments
    ``(m_k, P_k)`` of ``s_k``.  Returns ``None`` if the block noise covariance is singular;
    with ``moments=True``, ``(log p(y), m, P)`` with the ``ceil(T / B)`` predicted moments
    (time-first, full batch shape).
    """
    y, G, F, W, V, m0, P0, batch, _ = args

    def pad(x, core):  # leading singleton dims up to the full batch rank
        return x.reshape((1,) * (len(batch) + core - x.dim()) + x.shape)

    y, G, F, W, V, P0 = [pad(x, 2) for x in (y, G, F, W, V, P0)]
    m0 = pad(m0, 1)
    T, p = y.shape[-2:]
    S, dtype = m0.shape[-1], y.dtype
    n = B * p
    K, R = divmod(T, B)
    H, Phi, Syy, Ssy, Sss = _block_model(G, F, W, V, B)
    mask = ~torch.isnan(y)
    num_missing = (~mask).sum((-2, -1)).to(dtype)
    y = torch.where(mask, y, torch.zeros((), dtype=dtype, device=y.device))
    ybatch = y.shape[:-2]
    Yf = y[..., : K * B, :].reshape(*ybatch, K, n)  # full blocks
    Mf = mask[..., : K * B, :].reshape(*ybatch, K, n)
    clean = bool(Mf.all())
    num_elems = K + (R > 0) - 1  # blocks whose successor's first state is needed

    if clean:
        Hk, Syyk, Ssyk = H, Syy, Ssy
    else:
        Hk, Syyk, Ssyk = _mask_block(Mf.movedim(-2, 0), H, Syy, Ssy)
    L, info = torch.linalg.cholesky_ex(Syyk)
    if bool((info != 0).any()):
        return None
    Z = torch.linalg.solve_triangular(L, torch.cat([Hk, Ssyk.mT], -1), upper=False)
    Zh, Zs = Z[..., :S], Z[..., S:]
    if clean:  # one triangular solve with K right-hand sides
        zy = torch.linalg.solve_triangular(L, Yf.mT, upper=False)  # (*b, n, K)
        b = (Zs.mT @ zy).movedim(-1, 0)
        eta = (Zh.mT @ zy).movedim(-1, 0)
    else:
        zy = torch.linalg.solve_triangular(L, Yf.movedim(-2, 0).unsqueeze(-1), upper=False)
        b = (Zs.mT @ zy).squeeze(-1)
        eta = (Zh.mT @ zy).squeeze(-1)
    A = Phi - Zs.mT @ Zh
    C = _sym(Sss - Zs.mT @ Zs)
    J = _sym(Zh.mT @ Zh)

    def elems(x, core):
        x = x if x.dim() > len(core) + len(batch) else x.unsqueeze(0)
        return x.expand(K, *batch, *core)[:num_elems]

    zS, zSS = m0.new_zeros(()).expand(*batch, S), m0.new_zeros(()).expand(*batch, S, S)
    prior = (zSS, m0.expand(*batch, S), P0.expand(*batch, S, S), zS, zSS)
    blocks = (
        elems(A, (S, S)),
        elems(b, (S,)),
        elems(C, (S, S)),
        elems(eta, (S,)),
        elems(J, (S, S)),
    )
    scan_in = tuple(torch.cat([u.unsqueeze(0), v]) for u, v in zip(prior, blocks))
    _, m, P, _, _ = associative_scan(_filter_combine, scan_in)  # moments of s_0..s_K'

    ll = torch.zeros((), dtype=dtype, device=y.device)
    if K > 0:
        if clean:
            zy, Zh, L = zy.movedim(-1, 0), Zh.unsqueeze(0), L.unsqueeze(0)
        else:
            zy = zy.squeeze(-1)
        log_det_syy = 2 * L.diagonal(dim1=-2, dim2=-1).log().sum(-1)
        ll = ll + _gaussian_blocks(zy - _mv(Zh, m[:K]), Zh, log_det_syy, P[:K])
    if R > 0:
        k = R * p
        Hr, Syyr, _ = _mask_block(
            mask[..., K * B :, :].reshape(*ybatch, k), H[..., :k, :], Syy[..., :k, :k]
        )
        Lr = _cholesky(Syyr, "block noise covariance")
        Yr = y[..., K * B :, :].reshape(*ybatch, k, 1)
        Zh = torch.linalg.solve_triangular(Lr, Hr, upper=False)
        zy = torch.linalg.solve_triangular(Lr, Yr, upper=False).squeeze(-1)
        log_det_syy = 2 * Lr.diagonal(dim1=-2, dim2=-1).log().sum(-1)
        ll = ll + _gaussian_blocks((zy - _mv(Zh, m[K]))[None], Zh[None], log_det_syy, P[K:])
    ll = ll + 0.5 * math.log(2 * math.pi) * num_missing
    if moments:
        return ll.expand(batch), m, P
    return ll.expand(batch)


def _default_filter_block_size(T, p):
    # The within-block pass costs B sequential steps (each a handful of batched ops) and the
    # block scan ceil(T / B) elements: B ~ sqrt(T) balances them (one thread, S ~ 10-20).
    return max(1, min(T, 64 // p, math.isqrt(T) + 1))


def _blocked_filter(args, B):
    """Filtered and predicted moments for static matrices, exactly: the blocked scan of
    :func:`_blocked_log_likelihood` gives the predicted moments of every block's first
    state; from there the textbook filter (covariance form) runs the ``B`` steps of all
    ``ceil(T / B)`` blocks at once, so the sequential depth is ``B`` and each step is a
    handful of batched ``S x S`` products.  Returns what :func:`_run_filter` returns, or
    ``None`` where the blocked scan does not apply (singular block noise covariance)."""
    out = _blocked_log_likelihood(args, B, moments=True)
    if out is None:
        return None
    ll, m_start, P_start = out
    y, G, F, W, V, _, _, batch, _ = args
    T, p = y.shape[-2:]
    S, dtype = m_start.shape[-1], y.dtype
    nblocks = m_start.shape[0]
    pad = nblocks * B - T
    y = y.expand(*batch, T, p).movedim(-2, 0)  # (T, *b, p)
    mask = ~torch.isnan(y)
    y = torch.where(mask, y, torch.zeros((), dtype=dtype, device=y.device))
    if pad:  # steps after the end change no moment up to T: any value will do
        y = torch.cat([y, y.new_zeros((pad,) + y.shape[1:])])
        mask = torch.cat([mask, mask.new_ones((pad,) + mask.shape[1:])])

    def by_step(x):  # (nblocks * B, *b, ...) -> (B, nblocks, *b, ...)
        return x.reshape(nblocks, B, *x.shape[1:]).movedim(1, 0)

    y, mask = by_step(y), by_step(mask)
    G, F, W, V = [x.expand(*batch, *x.shape[-2:]) for x in (G, F, W, V)]
    if bool(mask.all()):
        Fs, Vs = [F] * B, [V] * B
    else:  # missing coordinates: zero rows of F, unit observation noise, as in _build
        d = mask.to(dtype)
        Fs = F * d.unsqueeze(-1)
        Vs = V * (d.unsqueeze(-1) * d.unsqueeze(-2)) + torch.diag_embed(1 - d)
    # Unbatched matrices on the right of every product: ``torch.matmul`` then folds the
    # blocks (and batch) into one GEMM instead of a batch of tiny ones.
    Gt, Fts = G.mT, [f.mT for f in Fs]
    mp, Pp = m_start, P_start
    # Outputs go straight into time-ordered buffers; under autograd, lists stacked at the
    # end (a write into a slice of a buffer would copy the buffer's whole gradient per step).
    track = torch.is_grad_enabled() and any(
        x.requires_grad for x in (m_start, P_start, y, G, F, W, V)
    )
    outputs = [[] if track else x.new_empty((nblocks, B) + x.shape[1:]) for x in (mp, Pp) * 2]
    failed = None
    for j in range(B):
        Ut = Pp @ Fts[j]  # P^- F^T (nblocks, *b, S, p)
        Sv = Ut.mT.contiguous() @ Fts[j] + Vs[j]  # innovation covariance
        e = y[j] - _vm(mp, Fts[j])
        if p == 1:  # scalar innovations: no factorisation, elementwise outer products
            scale = Sv[..., 0].rsqrt()  # (nblocks, *b, 1)
            ok = Sv[..., 0, 0] > 0
            Z, z = Ut[..., 0] * scale, e * scale  # L^{-1} F P^-, L^{-1} e
            m = mp + Z * z
            P = Pp - Z.unsqueeze(-1) * Z.unsqueeze(-2)  # exactly symmetric
        else:
            L, info = torch.linalg.cholesky_ex(Sv)
            ok = info == 0
            Zz = torch.linalg.solve_triangular(
                L, torch.cat([Ut.mT, e.unsqueeze(-1)], -1), upper=False
            )
            Z, z = Zz[..., :S], Zz[..., S:]
            m = mp + (Z.mT @ z).squeeze(-1)
            P = _sym(Pp - Z.mT @ Z)
        failed = ~ok if failed is None else failed | ~ok
        for out, x in zip(outputs, (m, P, mp, Pp)):
            if track:
                out.append(x)
            else:
                out[:, j] = x
        mp = _vm(m, Gt)
        Pp = _sym((P @ Gt).mT.contiguous() @ Gt + W)  # G P G^T, P symmetric
    if bool(failed.any()):
        return None  # the per-step scan names the covariance that is not positive definite

    def time_first(x):  # (nblocks, B, *b, *core) -> (T, *b, *core)
        x = torch.stack(x, 1) if track else x
        return x.reshape(nblocks * B, *x.shape[2:])[:T]

    m, P, mp, Pp = map(time_first, outputs)
    return ll, m, P, mp, Pp


def _gradient_wanted(args):
    return torch.is_grad_enabled() and any(x.requires_grad for x in args[:7])


def _sequential_ok(args):
    """Whether the compiled sequential kernels (:mod:`._sequential`) run this call: CPU
    tensors, untraced, numba installed, and no gradient wanted (the filter and smoother
    have none; :func:`kalman_log_likelihood` differentiates through :func:`_scored`)."""
    if _gradient_wanted(args):
        return False
    return _sequential.available("_kalman_kernels", *args[:7])


def _sequential_inputs(args):
    """The kernels' float64 arrays of validated arguments: the batch flattened, a step axis
    of length ``T`` or 1 on every matrix (static ones are not copied ``T`` times)."""
    y, G, F, W, V, m0, P0, batch, _ = args
    T, p = y.shape[-2:]
    S = m0.shape[-1]
    nb, size = y.dim() - 2, batch.numel()

    def flat(x, core):
        if x.dim() == nb + 1 + len(core):  # a time axis
            return x.expand(*batch, T, *core).reshape(size, T, *core)
        return x.expand(*batch, *core).reshape(size, 1, *core)

    return _sequential.float64_arrays(
        y.expand(*batch, T, p).reshape(size, T, p),
        flat(G, (S, S)),
        flat(F, (p, S)),
        flat(W, (S, S)),
        flat(V, (p, p)),
        m0.expand(*batch, S).reshape(size, S),
        P0.expand(*batch, S, S).reshape(size, S, S),
    )


class _KernelRun:
    """The compiled filter's, RTS smoother's and score's outputs for kernel inputs ``arrays``
    (:func:`_sequential_inputs`), allocated once: a caller that changes the inputs' values
    in place and runs again reuses them (``fit_dlm``'s EM runs one model's filter and
    smoother dozens of times with only ``W`` and ``V`` changed: measured on the Nile, T =
    100, an evaluation took 71 us, 41 of them in the kernels, with a dozen arrays allocated
    and converted per pass, and 54 us with them kept). The methods return whether
    the kernels ran to the end: ``False`` where a covariance is not positive definite (the
    scans then name it, or give NaN with validation off). ``moments=False`` keeps only the
    filter's log-likelihood (then only :meth:`filter` runs).

    :ivar ll: ``(B,)`` log-likelihood per series.
    :ivar moments: ``[m, P, mp, Pp]``, ``(B, T, S)`` / ``(B, T, S, S)``: the filtered and
        one-step predicted moments.
    :ivar smoothed: ``[ms, Ps, gains]``: the smoothed moments and the smoother's gains
        ``(B, T - 1, S, S)``.
    :ivar grads: the gradient of ``ll`` with respect to each input, shaped as the input.
    """

    def __init__(self, arrays, moments=True):
        self.arrays = arrays
        size, T, _ = arrays[0].shape
        S = arrays[5].shape[-1]
        steps = T if moments else 0
        self.ll = np.empty(size)
        self.steady_steps = np.empty(size, dtype=np.int64)
        self.moments = [np.empty((size, steps) + core) for core in ((S,), (S, S), (S,), (S, S))]
        self.smoothed = self.grads = None
        if moments:
            self.smoothed = [
                np.empty((size, T, S)),
                np.empty((size, T, S, S)),
                np.empty((size, max(T - 1, 0), S, S)),
            ]

    def filter(self):
        """Run the filter: :attr:`ll` and, with ``moments``, :attr:`moments`."""
        kernels = _sequential.kernels("_kalman_kernels")
        return kernels.filter(*self.arrays, self.ll, self.steady_steps, *self.moments) < 0

    def smoother(self):
        """Run the filter and the RTS smoother: also :attr:`smoothed`."""
        if not self.filter():
            return False
        kernels = _sequential.kernels("_kalman_kernels")
        return kernels.smoother(self.arrays[1], *self.moments, *self.smoothed) < 0

    def score(self):
        """Run the filter, the smoother and the score (:func:`_score_terms`): also
        :attr:`grads`."""
        if not self.smoother():
            return False
        if self.grads is None:
            self.grads = [np.zeros_like(x) for x in self.arrays]
        else:
            for g in self.grads:  # the score kernel adds into them
                g.fill(0.0)
        y, G, F, _, V, _, _ = self.arrays
        _, P, mp, Pp = self.moments
        kernels = _sequential.kernels("_kalman_kernels")
        return kernels.score(y, G, F, V, P, mp, Pp, *self.smoothed, *self.grads) < 0


def _compiled_filter(args, moments):
    """Run the compiled filter on ``args``: its :class:`_KernelRun`, or ``None`` where it
    meets a covariance that is not positive definite."""
    run = _KernelRun(_sequential_inputs(args), moments)
    return run if run.filter() else None


def _from_kernels(args, arrays):
    """The kernels' ``(B, ...)`` numpy outputs as time-first tensors of the batch shape and
    dtype of ``args``; a ``(B,)`` one as ``(*batch)``."""
    dtype, batch = args.y.dtype, args.batch
    out = []
    for x in arrays:
        x = torch.from_numpy(x).to(dtype).reshape(tuple(batch) + x.shape[1:])
        out.append(x.movedim(len(batch), 0) if x.dim() > len(batch) else x)
    return out


def _sequential_filter(args, moments=True):
    """``(ll, m, P, mp, Pp)`` time-first (``(ll,)`` without ``moments``) by the compiled
    filter, or ``None`` (see :func:`_compiled_filter`)."""
    run = _compiled_filter(args, moments)
    if run is None:
        return None
    return tuple(_from_kernels(args, [run.ll] + (run.moments if moments else [])))


def _sequential_smoother(args):
    """``(ll, ms, Ps, gains)`` time-first by the compiled filter and RTS smoother, or
    ``None`` (see :class:`_KernelRun`)."""
    run = _KernelRun(_sequential_inputs(args))
    if not run.smoother():
        return None
    return tuple(_from_kernels(args, [run.ll, *run.smoothed]))


def _score_terms(args):
    r"""``(ll, grads)``: :math:`\log p(y)` per series ``(B,)`` and its gradient with respect to
    ``y, G, F, W, V, m0, P0``, each shaped as the kernels' input (:func:`_sequential_inputs`:
    per series, and per step where the input has a time axis), float64, from one pass of the
    compiled filter, smoother and score kernels; or ``None`` where they stop (a covariance
    not positive definite, or an observation covariance singular).

    Fisher's identity, :math:`\nabla \log p(y) = E[\nabla \log p(x, y) \mid y]`, gives the
    score in closed form from the smoothed moments (the E-step of EM). With the predicted
    moments :math:`(a_t, P_t)` of :math:`x_t \mid y_{1:t-1}` (:math:`a_1 = m_0`, :math:`P_1 =
    P_0`) and the smoothed ones :math:`(\hat x_t, \hat P_t)`, let :math:`r_t = P_t^{-1}
    (\hat x_t - a_t)` and :math:`N_t = P_t^{-1} (P_t - \hat P_t) P_t^{-1}`; then
    :math:`W_t^{-1} E[w_t \mid y] = r_t` and :math:`W_t^{-1} \mathrm{Cov}(w_t, x_{t-1} \mid
    y) = -N_t G_t P_{t-1|t-1}`, so that, with no inverse of :math:`W_t` (singular process
    noise is fine) and :math:`u_t = V_t^{-1} (y_t - F_t \hat x_t)`,

    .. math::

        \partial_{m_0} = r_1, \quad \partial_{P_0} = \tfrac12 (r_1 r_1^\top - N_1), \quad
        \partial_{W_t} = \tfrac12 (r_t r_t^\top - N_t), \quad
        \partial_{G_t} = r_t \hat x_{t-1}^\top - N_t G_t P_{t-1|t-1},

        \partial_{V_t} = \tfrac12 (u_t u_t^\top - V_t^{-1} + V_t^{-1} F_t \hat P_t F_t^\top
        V_t^{-1}), \quad \partial_{F_t} = u_t \hat x_t^\top - V_t^{-1} F_t \hat P_t, \quad
        \partial_{y_t} = -u_t

    (the disturbance smoother's :math:`r_t, N_t` of Durbin & Koopman 2012, section 4.5, and
    Koopman & Shephard 1992's exact score), over the observed coordinates of each step.
    (:meth:`_KernelRun.score` runs them on inputs a caller keeps.)
    """
    run = _KernelRun(_sequential_inputs(args))
    if not run.score():
        return None
    return torch.from_numpy(run.ll), tuple(torch.from_numpy(g) for g in run.grads)


class _ScoredLogLikelihood(torch.autograd.Function):
    """``log p(y)`` from the kernels with the gradient of :func:`_score_terms` (computed
    with the value, since a gradient is wanted). A second derivative (``create_graph=True``)
    is taken through ``differentiable``, the torch scans on the same inputs, whose backward
    is itself differentiable."""

    @staticmethod
    def forward(ctx, terms, differentiable, batch, *inputs):
        ll, grads = terms
        ctx.grads, ctx.differentiable, ctx.batch = grads, differentiable, batch
        ctx.save_for_backward(*inputs)
        return ll.to(inputs[0].dtype).reshape(batch)

    @staticmethod
    def backward(ctx, grad):
        inputs = ctx.saved_tensors
        needs = ctx.needs_input_grad[3:]
        if torch.is_grad_enabled():
            wanted = [x for x, need in zip(inputs, needs) if need]
            value = ctx.differentiable(*inputs)
            grads = iter(torch.autograd.grad(value, wanted, grad, create_graph=True))
            return (None, None, None, *(next(grads) if need else None for need in needs))
        batch, num_batch = ctx.batch, len(ctx.batch)
        scale = grad.to(torch.float64).reshape(-1)
        out = [None, None, None]
        for x, g, need, core in zip(inputs, ctx.grads, needs, (1, 2, 2, 2, 2, 1, 2)):
            if not need:
                out.append(None)
                continue
            # Per series (B, [T | 1,] *core): a static matrix's steps are already summed.
            g = g * scale.reshape((-1,) + (1,) * (g.dim() - 1))
            g = g.reshape(*batch, *g.shape[1:])
            if g.dim() > num_batch + core and x.dim() != num_batch + core + 1:
                g = g.squeeze(num_batch)
            out.append(g.sum_to_size(x.shape).to(x.dtype))
        return tuple(out)


def _scored(args, differentiable):
    """``log p(y)`` by the kernels, differentiable through Fisher's identity
    (:func:`_score_terms`); ``None`` where the kernels cannot run it, for the scans."""
    if not _sequential.available("_kalman_kernels", *args[:7]):
        return None
    with torch.no_grad():
        terms = _score_terms(args)
    if terms is None:
        return None

    def torch_log_likelihood(*inputs):
        return differentiable(
            args._replace(**dict(zip(("y", "G", "F", "W", "V", "m0", "P0"), inputs)))
        )

    return _ScoredLogLikelihood.apply(terms, torch_log_likelihood, args.batch, *args[:7])


def _filter_moments(args):
    """``(ll, m, P, mp, Pp)`` time-first: the compiled kernels on CPU, else blocked for
    static matrices, else the scan."""
    if _sequential_ok(args):
        out = _sequential_filter(args)
        if out is not None:
            return out
    # With one or two states the scan's O(S^3) steps are so cheap that its fewer Python
    # calls win (measured on one CPU thread: local level, T = 100-1,000).
    if not args.time_varying and args.m0.shape[-1] >= 3:
        T, p = args.y.shape[-2:]
        out = _blocked_filter(args, _default_filter_block_size(T, p))
        if out is not None:
            return out
    return _run_filter(_build(args))


# ---------------------------------------------------------------------------------------
# Public API


def _to_external(x, core_dims):
    return x.movedim(0, -core_dims - 1)


def kalman_filter(y: torch.Tensor, matrices: StateSpaceMatrices) -> KalmanFilterResult:
    r"""Filtered moments and exact log-likelihood :math:`\log p(y_{1:T})`.

    On CPU without a gradient wanted (numba installed), the compiled covariance-form
    filter (with its steady-state switch for static matrices: see the module docstring).
    Otherwise, static matrices with three or more states: the blocked scan of
    :func:`kalman_log_likelihood` gives the predicted moments at the start of every block of
    ``~sqrt(T)`` steps, and the textbook (covariance-form) filter then runs inside all
    blocks at once.  Otherwise the parallel scan (Sarkka & Garcia-Fernandez 2021).  Both
    are exact.

    :param y: ``(..., T, obs_dim)`` observations, ``NaN`` where missing.
    :param matrices: :class:`StateSpaceMatrices` ``(G, F, W, V, init_mean, init_cov)`` of
        the model (1.2)-(1.3), shapes as documented there.
    :returns: :class:`KalmanFilterResult`; means ``(..., T, S)``, covs ``(..., T, S, S)``.
    :raises TypeError: if ``matrices`` is not a :class:`StateSpaceMatrices` or a field is
        not a real tensor.
    :raises ValueError: naming the field, if a field's shape does not fit ``y`` or the
        state dimension (or, with validation on, a covariance is not PSD).
    """
    ll, m, P, mp, Pp = _filter_moments(_validate(y, matrices))
    return KalmanFilterResult(
        ll, _to_external(m, 1), _to_external(P, 2), _to_external(mp, 1), _to_external(Pp, 2)
    )


def kalman_log_likelihood(
    y: torch.Tensor,
    matrices: StateSpaceMatrices,
    block_size: int | None = None,
) -> torch.Tensor:
    r"""Exact log-likelihood :math:`\log p(y_{1:T})` only; arguments as :func:`kalman_filter`.

    On CPU without a gradient wanted (numba installed), the compiled filter, which keeps no
    moments and, with static matrices, updates the mean only once the covariance has
    converged (see the module docstring; ``block_size`` is then not used). On CPU with a gradient wanted, for
    time-varying matrices and for static ones while ``batch x T x state_dim^3 <= 4e6`` (the
    measured break-even with the blocked scan's autograd), the compiled filter and smoother
    and the gradient in closed form from their moments (Fisher's identity; exact, no
    autograd tape; a second derivative goes through the scans). Otherwise:

    Much faster than ``kalman_filter(...).log_likelihood`` for static matrices: ``B``
    consecutive steps are grouped into one block whose observation vector (``B * obs_dim``
    values) and successor state have a block-independent joint law given the block's first
    state, computed once per call; filtering then runs over ``ceil(T / B)`` blocks (an
    associative scan) and each block contributes one ``(B obs_dim)``-variate Gaussian
    log-density.  Missing values (``NaN``) are marginalised exactly per block.  Nothing
    is approximated, so the result equals the scan's up to round-off.
    Time-varying matrices, and block noise covariances that are singular (e.g. a singular
    ``observation_cov``), use the per-step scan of :func:`kalman_filter`.

    :param y: ``(..., T, obs_dim)`` observations, ``NaN`` where missing.
    :param matrices: :class:`StateSpaceMatrices` of the model, as for :func:`kalman_filter`.
    :param block_size: steps per block ``B``; ``None`` picks one (64 / obs_dim steps in
        float64, 16 / obs_dim in float32).  The block covariance's condition number grows
        with ``B`` (like ``B^3`` for integrated trends, geometrically for explosive
        ``transition_matrix``); use a smaller ``B`` if that matters.
    :returns: ``(...)`` log-likelihood, the batch shape of the arguments.
    """
    args = _validate(y, matrices)
    T, p = args.y.shape[-2:]
    B = _steps_per_block(
        block_size, T, lambda: _default_block_size(T, args.m0.shape[-1], p, args.y.dtype)
    )
    if _sequential_ok(args):
        out = _sequential_filter(args, moments=False)
        if out is not None:
            return out[0]
    elif _gradient_wanted(args) and (args.time_varying or _score_is_cheaper(args)):
        ll = _scored(args, functools.partial(_scanned_log_likelihood, B=B))
        if ll is not None:
            return ll
    return _scanned_log_likelihood(args, B)


#: Above this many ``series x steps x states^3``, static matrices' gradient goes through the
#: blocked scan's autograd rather than the kernels' score: the kernels' cost grows as ``T
#: S^3``, the blocked scan's much more slowly in ``T``. Measured on one CPU thread
#: (``benchmarks/results/kalman_gradient.md``, dense static models): the two break even
#: between 5e6 (``S = 8``, ``T = 1e4``: score / scans 1.06) and 8e6 (``S = 20``, ``T = 1e3``:
#: 0.82); below, the score takes 0.09-0.57x the scans' time. Time-varying matrices, which
#: the per-step scan handles, take the score at every size (0.05-0.10x, ``S <= 20``).
_SCORE_WORK_LIMIT = 4e6


def _score_is_cheaper(args):
    S = args.m0.shape[-1]
    return args.batch.numel() * args.y.shape[-2] * S**3 <= _SCORE_WORK_LIMIT


def _scanned_log_likelihood(args, B):
    """``log p(y)`` by the torch scans: blocked for static matrices, else per step."""
    ll = None
    if not args.time_varying:
        ll = _blocked_log_likelihood(args, B)
    if ll is None:
        ll = _run_filter(_build(args))[0]
    return ll


def _smoothed(args):
    """``(ll, ms, Ps, gains)`` time-first: the compiled kernels on CPU, else the scans."""
    out = _sequential_smoother(args) if _sequential_ok(args) else None
    if out is not None:
        return out
    ssm = _build(args)
    ll, m, P, mp, Pp = _filter_moments(args)
    ms, Ps, gains = _run_smoother(ssm, m, P, mp, Pp, gains=True)
    return ll, ms, Ps, gains


def _lag_one_covariances(covs: torch.Tensor, gains: torch.Tensor) -> torch.Tensor:
    r""":math:`\mathrm{Cov}(x_{t+1}, x_t \mid y_{1:T}) = \hat P_{t+1} E_t^\top` from the
    smoothed covariances ``(T, ..., S, S)`` and the RTS gains ``(T-1, ..., S, S)``
    (time-first)."""
    return covs[1:] @ gains.mT


def smoothed_second_moments(y: torch.Tensor, matrices: StateSpaceMatrices):
    r"""What EM's E-step needs: smoothed means ``(..., T, S)``, covariances ``(..., T, S,
    S)``, lag-one covariances :math:`\mathrm{Cov}(x_{t+1}, x_t \mid y_{1:T})` ``(..., T-1,
    S, S)`` and the log-likelihood, from one filter and one smoother pass."""
    ll, ms, Ps, gains = _smoothed(_validate(y, matrices))
    cross = _lag_one_covariances(Ps, gains)
    return _to_external(ms, 1), _to_external(Ps, 2), _to_external(cross, 2), ll


def kalman_smoother(y: torch.Tensor, matrices: StateSpaceMatrices) -> KalmanSmootherResult:
    """Rauch-Tung-Striebel smoothed moments of ``x_t | y_{1:T}``.

    Arguments (``y`` and a :class:`StateSpaceMatrices`) as :func:`kalman_filter`; needs
    invertible predicted covariances.
    """
    ll, ms, Ps, _ = _smoothed(_validate(y, matrices))
    return KalmanSmootherResult(_to_external(ms, 1), _to_external(Ps, 2), ll)


def _psd_sqrt(x):
    """Symmetric square root of a PSD matrix; unlike Cholesky it allows singular ``x``."""
    evals, evecs = torch.linalg.eigh(x)
    return evecs * evals.clamp(min=0).sqrt().unsqueeze(-2)


def _affine_combine(ei, ej):
    Ai, bi = ei
    Aj, bj = ej
    return Aj @ Ai, _mv(Aj, bi) + bj


def simulate_prior(ssm, num_samples):
    """Joint prior draws ``(x, y)`` with a sample dim after time: ``(T, n, *b, .)``."""
    T, S, p = ssm.G.shape[0], ssm.G.shape[-1], ssm.F.shape[-2]
    batch = ssm.G.shape[1:-2]
    zx = torch.randn(T, num_samples, *batch, S, dtype=ssm.G.dtype, device=ssm.G.device)
    zy = torch.randn(T, num_samples, *batch, p, dtype=ssm.G.dtype, device=ssm.G.device)
    Gs = ssm.G.unsqueeze(1)
    b = ssm.mu.unsqueeze(1) + _mv(_psd_sqrt(ssm.Q).unsqueeze(1), zx)
    _, x = associative_scan(_affine_combine, (Gs, b))
    yy = _mv(ssm.F.unsqueeze(1), x) + _mv(_psd_sqrt(ssm.V).unsqueeze(1), zy)
    return x, yy


def kalman_sample(
    y: torch.Tensor,
    matrices: StateSpaceMatrices,
    num_samples: int = 1,
) -> torch.Tensor:
    r"""Exact joint draws of ``x_{1:T} | y_{1:T}`` (Durbin & Koopman 2002 simulation smoother).

    Draw ``(x^+, y^+)`` from the prior and return ``x^+ + E[x | y] - E[x | y^+]``; because the
    smoothed mean is affine in the data this equals ``x^+ + E_0[x | y - y^+]`` (zero prior
    mean), which has exactly the conditional law and needs only one batched smoother pass.

    :param y: ``(..., T, obs_dim)`` observations, ``NaN`` where missing.
    :param matrices: :class:`StateSpaceMatrices` of the model, as for :func:`kalman_filter`.
    :param num_samples: number of joint draws.
    :returns: ``(num_samples, ..., T, S)``.
    """
    # (tests/timeseries pins the ">= 0" message for negative counts; 0 draws is refused too:
    # it would return an empty tensor that no caller wants.)
    num_samples = check_int(num_samples, "num_samples", low=0)
    if num_samples == 0:
        raise ValueError("num_samples must be an integer >= 1 (the number of draws), got 0")
    ssm = prepare_state_space(y, matrices)
    x_plus, y_plus = simulate_prior(ssm, num_samples)
    y_diff = torch.where(ssm.mask.unsqueeze(1), ssm.y.unsqueeze(1) - y_plus, 0.0)
    add_sample_dim = dict(
        G=ssm.G.unsqueeze(1),
        F=ssm.F.unsqueeze(1),
        Q=ssm.Q.unsqueeze(1),
        V=ssm.V.unsqueeze(1),
        mu=torch.zeros_like(ssm.mu).unsqueeze(1),
        y=y_diff,
        mask=ssm.mask.unsqueeze(1),
    )
    ssm0 = ssm._replace(**add_sample_dim)
    ll, m, P, mp, Pp = _run_filter(ssm0)
    ms, _ = _run_smoother(ssm0, m, P, mp, Pp)
    return (x_plus + ms).movedim(0, -2)


def _future(x, name, core, num_batch, num_steps, dims=""):
    x, has_time = _split(x, name, core, num_batch, num_steps, dims=dims)
    return (
        x
        if has_time
        else x.unsqueeze(-len(core) - 1).expand(*x.shape[: x.dim() - len(core)], num_steps, *core)
    )


def kalman_forecast(
    filter_result: KalmanFilterResult,
    num_steps: int,
    matrices: StateSpaceMatrices,
) -> KalmanForecast:
    r"""Predictive moments ``num_steps`` ahead, propagating the last filtered moments.

    :math:`m_{T+k} = G m_{T+k-1}`, :math:`P_{T+k} = G P G^\top + W`, and
    :math:`y_{T+k} \sim N(F m_{T+k}, F P_{T+k} F^\top + V)`.  The matrices are the *future*
    ones: static, or with a time axis of ``num_steps`` entries (entry ``k`` drives step
    ``T+k+1``).  The last filtered moments take the place of the prior, so ``init_mean``
    and ``init_cov`` are not used: the :class:`StateSpaceMatrices` that filtered ``y`` can
    be passed as it is when its matrices are static.

    :param filter_result: a :class:`KalmanFilterResult`.
    :param num_steps: the forecast horizon ``h``.
    :param matrices: :class:`StateSpaceMatrices` of the future steps.
    :returns: :class:`KalmanForecast` with ``(..., num_steps, .)`` moments.
    """
    if not isinstance(filter_result, KalmanFilterResult):
        raise ValueError("filter_result must be a KalmanFilterResult from kalman_filter")
    num_steps = check_int(num_steps, "num_steps", low=1)
    _check_matrices(matrices)
    m = filter_result.filtered_means[..., -1, :]
    P = filter_result.filtered_covs[..., -1, :, :]
    S, nb = m.shape[-1], m.dim() - 1
    observation_matrix = matrices.observation_matrix
    p = observation_matrix.shape[-2] if observation_matrix.dim() >= 2 else 0
    names = ["transition_matrix", "observation_matrix", "transition_cov", "observation_cov"]
    args = [getattr(matrices, name) for name in names]  # init_mean, init_cov: not used
    cores = [(S, S), (p, S), (S, S), (p, p)]
    dims = f" (state_dim {S} from filter_result, obs_dim {p} from observation_matrix)"
    G, F, W, V = [
        _future(torch.as_tensor(x).to(m), n, c, nb, num_steps, dims)
        for x, n, c in zip(args, names, cores)
    ]
    for x, name in [(W, "transition_cov"), (V, "observation_cov")]:
        _check_covariance(x, name)
    # The same value check as kalman_filter's (it follows the validation switch).
    if values_checked() and not (bool(torch.isfinite(G).all()) and bool(torch.isfinite(F).all())):
        raise ValueError("transition_matrix and observation_matrix must be finite")
    means, covs = [], []
    for k in range(num_steps):
        m = _mv(G[..., k, :, :], m)
        P = _sym(G[..., k, :, :] @ P @ G[..., k, :, :].mT + W[..., k, :, :])
        means.append(m)
        covs.append(P)
    m, P = torch.stack(means, -2), torch.stack(covs, -3)
    return KalmanForecast(_mv(F, m), _sym(F @ P @ F.mT + V), m, P)


def forecast_interval(
    means: torch.Tensor, covs: torch.Tensor, level: float = 0.95
) -> tuple[torch.Tensor, torch.Tensor]:
    """Central ``level`` marginal intervals ``(lower, upper)`` from Gaussian moments.

    :param means: ``(..., obs_dim)`` predictive means (``KalmanForecast.observation_means``).
    :param covs: ``(..., obs_dim, obs_dim)`` predictive covariances, one per mean
        (``KalmanForecast.observation_covs``).
    :param level: the interval's probability, in ``(0, 1)``.
    :raises TypeError: if ``means`` or ``covs`` is not a real tensor.
    :raises ValueError: if ``covs`` does not fit ``means`` or ``level`` is outside ``(0, 1)``.
    """
    level = check_real(level, "level", low=0, high=1, low_open=True, high_open=True)
    check_real_tensor(means, "means")
    check_real_tensor(covs, "covs")
    if means.dim() < 1:
        raise ValueError(f"means must have shape (..., obs_dim), got {tuple(means.shape)}")
    p = means.shape[-1]
    if covs.dim() < 2 or tuple(covs.shape[-2:]) != (p, p):
        raise ValueError(
            f"covs must have shape (..., {p}, {p}) (obs_dim {p} from means), "
            f"got {tuple(covs.shape)}"
        )
    try:
        broadcast_shapes(means.shape[:-1], covs.shape[:-2])
    except RuntimeError:
        raise ValueError(
            f"covs' leading shape {tuple(covs.shape[:-2])} does not broadcast with means' "
            f"{tuple(means.shape[:-1])}: pass one covariance per mean"
        ) from None
    z = torch.distributions.Normal(0.0, 1.0).icdf(torch.tensor(0.5 + level / 2)).item()
    half = z * covs.diagonal(dim1=-2, dim2=-1).clamp(min=0).sqrt()
    return means - half, means + half
