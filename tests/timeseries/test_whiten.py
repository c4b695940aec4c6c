"""kalman_whiten / DLM.whiten against the dense Cholesky factor of the observations' covariance."""

import math

import pyro
import pytest
import torch

from pyro_ext.timeseries import (
    DLM,
    Autoregressive,
    LocalLevel,
    Regression,
    Seasonal,
    StateSpaceMatrices,
    kalman_log_likelihood,
    kalman_whiten,
)

D = torch.float64


def dense_cov(G, F, W, V, P0, T):
    """Cov(y_{1:T}) (time-major, T p square) by the explicit state recursion: x_1 ~ N(0, P0),
    x_t = G_t x_{t-1} + w_t; matrices static or with a time axis of T entries."""
    S = P0.shape[-1]
    G, F, W, V = [x if x.dim() == 3 else x.expand(T, *x.shape) for x in (G, F, W, V)]
    P = [P0]
    for t in range(1, T):
        P.append(G[t] @ P[-1] @ G[t].T + W[t])
    Cx = torch.zeros(T * S, T * S, dtype=D)
    for s in range(T):
        block = P[s]  # Cov(x_t, x_s) = G_t ... G_{s+1} P_s for t >= s
        for t in range(s, T):
            if t > s:
                block = G[t] @ block
            Cx[t * S : (t + 1) * S, s * S : (s + 1) * S] = block
            Cx[s * S : (s + 1) * S, t * S : (t + 1) * S] = block.T
    Fbig = torch.block_diag(*F)
    return Fbig @ Cx @ Fbig.T + torch.block_diag(*V)


def dense_whiten(series, cov):
    """L^{-1} series over the observed coordinates (a NaN in any series marks one missing),
    0 elsewhere; and log det of the observed block. series: (T, p, n)."""
    T, p, n = series.shape
    flat = series.reshape(T * p, n)
    observed = ~torch.isnan(flat).any(-1)
    L = torch.linalg.cholesky(cov[observed][:, observed])
    z = torch.zeros_like(flat)
    z[observed] = torch.linalg.solve_triangular(L, flat[observed], upper=False)
    return z.reshape(T, p, n), 2 * L.diagonal().log().sum(), int(observed.sum())


def random_model(seed, S, p, T=None, time_varying=()):
    g = torch.Generator().manual_seed(seed)

    def rn(*shape):
        return torch.randn(*shape, generator=g, dtype=D)

    def tv(name, *shape):
        return (T,) + shape if name in time_varying else shape

    G = 0.3 * rn(*tv("G", S, S)) + 0.8 * torch.eye(S, dtype=D)
    F = rn(*tv("F", p, S))
    A = rn(*tv("W", S, S))
    W = 0.1 * A @ A.mT
    B = rn(*tv("V", p, p))
    V = 0.5 * B @ B.mT + 0.2 * torch.eye(p, dtype=D)
    C = rn(S, S)
    P0 = C @ C.mT + 0.5 * torch.eye(S, dtype=D)
    return G, F, W, V, P0


def matrices_of(G, F, W, V, P0):
    """The :class:`StateSpaceMatrices` of ``random_model``'s matrices (``kalman_whiten``
    takes the initial mean to be 0 and does not read it)."""
    return StateSpaceMatrices(G, F, W, V, P0.new_zeros(P0.shape[-1]), P0)


def student_t_precisions(T, seed=0, df=4.0):
    g = torch.Generator().manual_seed(seed)
    return torch._standard_gamma(torch.full((T,), df / 2, dtype=D), generator=g) / (df / 2)


@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("missing", [False, True])
@pytest.mark.parametrize("time_varying", [(), ("V",), ("G", "W"), ("F", "V")])
@pytest.mark.parametrize("block_size", [None, 1, 4, 7, 100])
def test_whitening_is_the_dense_cholesky_factor(p, missing, time_varying, block_size):
    # Static G, F, W (the blocked filter, any block size, padded last block) and
    # time-varying ones (the per-step scan) give L^{-1} series of the dense Cholesky factor
    # to round-off, with missing coordinates dropped from every series.
    T, S, n = 23, 3, 4
    G, F, W, V, P0 = random_model(p + 10 * len(time_varying), S, p, T, time_varying)
    series = torch.randn(T, p, n, dtype=D, generator=torch.Generator().manual_seed(5))
    if missing:
        series[0, 0, 0] = math.nan  # the first step: the prior alone predicts step 2
        series[9, :, 2] = math.nan  # a whole step
        series[T - 1, p - 1, 1] = math.nan  # the last, padded block
    result = kalman_whiten(series, matrices_of(G, F, W, V, P0), block_size=block_size)
    z, log_det, num_observed = dense_whiten(series, dense_cov(G, F, W, V, P0, T))
    assert result.whitened.shape == (T, p, n)
    assert (result.whitened - z).abs().max() < 1e-10
    assert abs(float(result.log_det - log_det)) < 1e-10 * max(1.0, abs(float(log_det)))
    assert int(result.num_observed) == num_observed == T * p - (p + 2 if missing else 0)


def bsts_like_dlm(scales=(0.2, 0.1, 0.05, 0.5), phi=0.6):
    ar, level, season, obs = torch.as_tensor(scales, dtype=D).unbind(-1)
    components = [
        Autoregressive(torch.tensor([phi], dtype=D), ar, init_scale=1.0),
        LocalLevel(level, init_scale=2.0),
        Seasonal(52, season, harmonics=2, init_scale=1.0),
    ]
    return DLM(components, obs)


@pytest.mark.parametrize("T", [1, 2, 52, 81, 208])
@pytest.mark.parametrize("student_t", [False, True])
@pytest.mark.parametrize("missing", [False, True])
def test_dlm_whiten_matches_the_dense_covariance(T, student_t, missing):
    # The BSTS's DLM (AR(1) goodwill + local level + trigonometric seasonal) with Gaussian
    # or Student-t observation noise (per-week precisions): DLM.whiten equals the dense
    # Cholesky whitening by signal_covariance + noise, from one block (T <= 80) to several.
    dlm = bsts_like_dlm()
    g = torch.Generator().manual_seed(T)
    series = torch.randn(T, 5, dtype=D, generator=g)
    if missing and T > 2:
        series[[1, T // 2, T - 1], 0] = math.nan
    noise = torch.full((T,), 0.25, dtype=D)
    precision = None
    if student_t:
        precision = student_t_precisions(T, seed=T)
        noise = noise / precision
    cov = dlm.signal_covariance(T) + torch.diag(noise)
    z, log_det, num_observed = dense_whiten(series.unsqueeze(-2), cov)
    result = dlm.whiten(series, precision)
    assert result.whitened.shape == (T, 5)
    assert (result.whitened - z[:, 0]).abs().max() < 1e-10
    assert abs(float(result.log_det - log_det)) < 1e-10 * max(1.0, abs(float(log_det)))
    assert int(result.num_observed) == num_observed
    # The prediction-error decomposition: |L^{-1} y|^2 and log det give the likelihood.
    y = series[:, 0]
    log_lik = -0.5 * (
        result.whitened[:, 0].pow(2).sum() + result.log_det + num_observed * math.log(2 * math.pi)
    )
    assert torch.allclose(log_lik, dlm.log_likelihood(y, precision), rtol=1e-10)


def test_whiten_gradients_match_the_dense_path():
    # Differentiable in every scale (SG-MCMC takes gradients through it): the gradients of
    # the statistics a regression needs (X' Sigma^-1 X, X' Sigma^-1 r, r' Sigma^-1 r and
    # log det Sigma) agree with the dense Cholesky's.
    T = 130
    series = torch.randn(T, 4, dtype=D, generator=torch.Generator().manual_seed(0))
    series[7, 0] = math.nan
    observed = ~torch.isnan(series).any(-1)
    precision = student_t_precisions(T)
    weights = torch.randn(4, 4, dtype=D, generator=torch.Generator().manual_seed(1))

    def statistics(scales, dense):
        dlm = bsts_like_dlm(scales, phi=0.5)
        if not dense:
            r = dlm.whiten(series, precision)
            z, log_det = r.whitened, r.log_det
        else:
            noise = scales[3].pow(2) / precision
            cov = (dlm.signal_covariance(T) + torch.diag(noise))[observed][:, observed]
            L = torch.linalg.cholesky(cov)
            z = torch.linalg.solve_triangular(L, series[observed], upper=False)
            log_det = 2 * L.diagonal().log().sum()
        return (weights * (z.mT @ z)).sum() + log_det

    grads = []
    for dense in (False, True):
        scales = torch.tensor([0.2, 0.1, 0.05, 0.5], dtype=D, requires_grad=True)
        (grad,) = torch.autograd.grad(statistics(scales, dense), scales)
        grads.append(grad)
    assert torch.allclose(grads[0], grads[1], rtol=1e-8, atol=1e-10), grads


def test_whiten_under_vmap_and_batched_parameters():
    # vmap over particles (as the SG-MCMC potential and the Gibbs scan batch it) and plain
    # batch dims of the scales give the per-draw results.
    T = 90
    series = torch.randn(T, 3, dtype=D, generator=torch.Generator().manual_seed(2))
    series[4, 1] = math.nan
    scales = torch.tensor([[0.2, 0.1, 0.05, 0.5], [0.3, 0.05, 0.02, 0.8], [0.1, 0.2, 0.1, 0.3]])
    scales = scales.to(D)
    phis = torch.tensor([0.6, 0.1, 0.9], dtype=D)
    precision = torch.stack([student_t_precisions(T, seed=s) for s in range(3)])

    def one(scale, phi, lam):
        ar, level, season, obs = scale.unbind(-1)
        dlm = DLM(
            [
                Autoregressive(phi.unsqueeze(-1), ar, init_scale=1.0),
                LocalLevel(level, init_scale=2.0),
                Seasonal(52, season, harmonics=2, init_scale=1.0),
            ],
            obs,
        )
        r = dlm.whiten(series, lam)
        return r.whitened, r.log_det

    with pyro.validation_enabled(False):
        z_vmap, ld_vmap = torch.func.vmap(one)(scales, phis, precision)
    z_batch, ld_batch = one(scales, phis, precision)
    for i in range(3):
        z, ld = one(scales[i], phis[i], precision[i])
        assert torch.allclose(z_vmap[i], z, atol=1e-12) and torch.allclose(ld_vmap[i], ld)
        assert torch.allclose(z_batch[i], z, atol=1e-12) and torch.allclose(ld_batch[i], ld)


@pytest.mark.parametrize("student_t", [False, True])
def test_whiten_time_varying_regression_component(student_t):
    # A Regression component makes G, F, W time-varying: the per-step scan, same answer as
    # the dense covariance of the stacked model, and the log-likelihood of the filter.
    T = 30
    g = torch.Generator().manual_seed(3)
    X = torch.randn(T, 2, dtype=D, generator=g)
    dlm = DLM([LocalLevel(torch.tensor(0.1, dtype=D)), Regression(X, init_scale=1.5)], 0.4)
    series = torch.randn(T, 3, dtype=D, generator=g)
    series[11, 2] = math.nan
    precision = student_t_precisions(T) if student_t else None
    G, F, W, V, m0, P0 = dlm.matrices(T, precision)
    cov = dense_cov(G, F, W, V.expand(T, 1, 1), P0, T)
    z, log_det, _ = dense_whiten(series.unsqueeze(-2), cov)
    result = dlm.whiten(series, precision)
    assert (result.whitened - z[:, 0]).abs().max() < 1e-10
    assert abs(float(result.log_det - log_det)) < 1e-10 * abs(float(log_det))
    y = series[:, 0].clone()
    y[11] = math.nan  # missing in one series is missing in all
    log_lik = -0.5 * (
        result.whitened[:, 0].pow(2).sum()
        + result.log_det
        + result.num_observed * math.log(2 * math.pi)
    )
    assert torch.allclose(log_lik, kalman_log_likelihood(*dlm._args(y, precision)), rtol=1e-10)


def test_whiten_argument_errors():
    matrices = matrices_of(*random_model(0, 2, 1))
    with pytest.raises(ValueError, match="num_series"):
        kalman_whiten(torch.randn(5, 1, dtype=D), matrices)
    with pytest.raises(ValueError, match="block_size"):
        kalman_whiten(torch.randn(5, 1, 2, dtype=D), matrices, block_size=0)
    with pytest.raises(ValueError, match="infinite"):
        kalman_whiten(torch.full((5, 1, 2), math.inf, dtype=D), matrices)
    with pytest.raises(ValueError, match="series"):
        bsts_like_dlm().whiten(torch.randn(5, dtype=D).sum())
